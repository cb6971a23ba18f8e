"""Kernel log line classification on recorded lines and garbled variants."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from agents.probes.kernel_lines import (
    classify,
    classify_kmsg_record,
    find_bdf,
    parse_kmsg_record,
    split_kmsg_records,
)
from agents.probes.tables import XID_FATAL, XID_INFO, xid_severity
from tests.probes.helpers import FIXTURES, load_line_cases

CASES = load_line_cases()
FIELDS = ("kind", "severity", "vendor", "pci_bus_id", "code", "device_index")


def _summary(line: str) -> dict[str, Any] | None:
    event = classify(line)
    return None if event is None else {f: getattr(event, f) for f in FIELDS}


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: c["line"][:50])
def test_recorded_line_is_classified_as_documented(case: dict[str, Any]) -> None:
    assert _summary(case["line"]) == case["expect"]


@pytest.mark.parametrize("case", CASES["garbled"], ids=lambda c: repr(c["line"][:40]))
def test_garbled_line_gives_documented_result_without_raising(case: dict[str, Any]) -> None:
    assert _summary(case["line"]) == case["expect"]


def test_xid_79_line_is_fatal_fallen_off_bus() -> None:
    event = classify(
        "NVRM: Xid (PCI:0000:3b:00): 79, pid=1911, name=python3, GPU has fallen off the bus.",
        ts_ns=42,
    )
    assert event is not None
    assert (event.kind, event.severity, event.code) == ("fallen_off_bus", "fatal", 79)
    assert event.pci_bus_id == "0000:3b:00.0"
    assert event.ts_ns == 42 and event.source == "kmsg"
    assert event.evidence == {"xid": 79}


def test_xid_severity_table_has_the_documented_fatal_and_info_codes() -> None:
    assert frozenset({79, 48, 64, 74, 94, 95, 119, 120}) == XID_FATAL
    assert frozenset({13, 31, 43, 45, 68}) == XID_INFO
    assert [xid_severity(c) for c in (79, 13, 62, 63, 92)] == [
        "fatal",
        "info",
        "warning",
        "warning",
        "warning",
    ]


def test_application_xid_43_is_info_not_a_node_problem() -> None:
    event = classify("NVRM: Xid (PCI:0000:65:00): 43, pid=77, name=python, Ch 00000010")
    assert event is not None and event.severity == "info" and event.kind == "xid"


def test_aer_received_line_names_the_erroring_device_and_the_reporting_port() -> None:
    event = classify("pcieport 0000:00:03.1: AER: Uncorrected (Fatal) error received: 0000:3b:00.0")
    assert event is not None
    assert event.pci_bus_id == "0000:3b:00.0"
    assert event.evidence["reporting_port"] == "0000:00:03.1"


def test_every_truncation_of_a_recorded_line_classifies_or_returns_none() -> None:
    kinds_seen = set()
    for case in CASES["cases"]:
        line = case["line"]
        for end in range(len(line) + 1):
            event = classify(line[:end])
            assert event is None or event.message == line[:end]
            kinds_seen.add(event.kind if event else None)
    assert {"xid", "fallen_off_bus", "aer_fatal", "hygon_fault", None} <= kinds_seen


@given(st.text(max_size=300))
def test_arbitrary_text_never_raises(text: str) -> None:
    event = classify(text)
    assert event is None or event.message == text.rstrip("\r\n")


def test_non_string_input_is_none() -> None:
    assert classify(b"NVRM: Xid (PCI:0000:3b:00): 79, x") is None  # type: ignore[arg-type]


def test_bus_id_is_normalised_lowercase_with_function() -> None:
    assert find_bdf("Xid (PCI:0000:3B:00): 79") == "0000:3b:00.0"
    assert find_bdf("x 0000:c1:00.1 y") == "0000:c1:00.1"
    assert find_bdf("10000:3b:00.0") is None


# --- /dev/kmsg records -------------------------------------------------------


def test_kmsg_record_prefix_and_dictionary_are_parsed() -> None:
    record = parse_kmsg_record(
        "6,1713,86123456800,-;pcieport 0000:00:03.1: AER: x\n"
        " SUBSYSTEM=pci\n DEVICE=+pci:0000:00:03.1\n"
    )
    assert record is not None
    assert (record.facility, record.level, record.seq, record.ts_usec, record.flags) == (
        0,
        6,
        1713,
        86123456800,
        "-",
    )
    assert record.message == "pcieport 0000:00:03.1: AER: x"
    assert record.fields == {"SUBSYSTEM": "pci", "DEVICE": "+pci:0000:00:03.1"}
    assert record.pci_bus_id == "0000:00:03.1"


def test_kmsg_record_with_caller_field_and_facility() -> None:
    record = parse_kmsg_record(b"30,5,1000,c,caller=T12;systemd[1]: started")
    assert record is not None
    assert (record.facility, record.level, record.flags) == (3, 6, "c")


def test_kmsg_hex_escapes_are_decoded_back_to_text() -> None:
    record = parse_kmsg_record("3,1,2,-;a\\x0ab \\xc3\\xa9 \\x5c")
    assert record is not None and record.message == "a\nb \u00e9 \\"


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "garbage",
        "6,1;msg",
        "x,y,z,-;m",
        "6,1,2,-",
        "6,1,\u0663,-;msg",
        ";;;",
        b"\xff\xfe,1,2,-;x",
    ],
)
def test_garbled_kmsg_record_is_none(raw: str | bytes) -> None:
    assert parse_kmsg_record(raw) is None


def test_recorded_kmsg_dump_yields_the_fault_events() -> None:
    text = (FIXTURES / "kmsg_records.txt").read_text("utf-8")
    records = [parse_kmsg_record(r) for r in split_kmsg_records(text)]
    assert all(r is not None for r in records) and len(records) == 6
    events = [e for e in (classify_kmsg_record(r) for r in records if r) if e]
    assert [e.kind for e in events] == [
        "fallen_off_bus",
        "aer_correctable",
        "aer_fatal",
        "hygon_fault",
        "ascend_fault",
    ]
    assert events[0].ts_ns == 86123456789 * 1000
    assert events[3].pci_bus_id == "0000:43:00.0", "DEVICE= fills a bus id the text lacks"
    assert events[4].message.startswith("[ascend] [ERROR] [devmm]") and "\n" in events[4].message
    assert events[4].device_index == 0
    assert [e.evidence["kmsg_seq"] for e in events] == [1712, 1713, 1714, 1716, 1717]
