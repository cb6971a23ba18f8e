"""The JSON line contract: encoding, decoding, clear errors."""

from __future__ import annotations

import json

import msgspec
import pytest

from agents.probes.events import ProbeEvent, decode_line, encode_line

LINE = (
    '{"v":1,"source":"ebpf","kind":"xid","vendor":"nvidia","pci_bus_id":"0000:3b:00.0",'
    '"device_index":null,"code":48,"severity":"fatal","message":"NVRM: Xid ...",'
    '"ts_ns":123,"evidence":{"probe":"printk:console","n":2}}'
)


def test_contract_line_decodes_to_event_and_encodes_back_identically() -> None:
    event = decode_line(LINE)
    assert event.kind == "xid" and event.code == 48 and event.evidence["n"] == 2
    assert encode_line(event) == LINE.encode() + b"\n"


def test_contract_fields_are_exactly_the_documented_ones() -> None:
    assert ProbeEvent.__struct_fields__ == (
        "v",
        "source",
        "kind",
        "vendor",
        "pci_bus_id",
        "device_index",
        "code",
        "severity",
        "message",
        "ts_ns",
        "evidence",
    )


def test_event_is_frozen() -> None:
    event = decode_line(LINE)
    with pytest.raises(AttributeError):
        event.severity = "info"  # type: ignore[misc]


def _mutated(**changes: object) -> str:
    obj = json.loads(LINE)
    obj.update(changes)
    return json.dumps(obj)


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("{not json", "not valid JSON"),
        ('{"v":1', "not valid JSON"),
        (_mutated(kind="meltdown"), "kind"),
        (_mutated(severity="oops"), "severity"),
        (_mutated(v=2), "v"),
        (_mutated(ts_ns="soon"), "ts_ns"),
        (_mutated(vendor="acme"), "vendor"),
        (_mutated(extra=1), "extra"),
        ('{"v":1,"source":"ebpf"}', "kind"),
        ("[1,2,3]", "contract"),
    ],
)
def test_malformed_line_raises_value_error_naming_the_problem(line: str, needle: str) -> None:
    with pytest.raises(ValueError, match="probe line") as info:
        decode_line(line)
    assert needle in str(info.value)


def test_bytes_with_trailing_newline_decode() -> None:
    assert decode_line(LINE.encode() + b"\n").ts_ns == 123


def test_decode_error_is_a_value_error_not_a_msgspec_error() -> None:
    with pytest.raises(ValueError) as info:
        decode_line(b"\xff\xfe")
    assert not isinstance(info.value, msgspec.DecodeError)
