"""rocm-smi: the parser on recorded-shape output, and the detector chosen from PATH."""

from __future__ import annotations

import json

import pytest

from agents import detecting, nvml
from agents.labels import label_value_problem
from agents.parsing import rocm_smi
from tests.agents.conftest import FIXTURES, fixture_text
from tests.agents.test_detecting import tool

MI300X_MIB = 205822885888 // 2**20  # 196288
MI250X_GCD_MIB = 68702699520 // 2**20  # 65520


def test_an_mi300x_node_reads_as_eight_amd_devices_with_unknown_compute(db) -> None:
    parsed = rocm_smi.parse(fixture_text("rocm-smi-mi300x.json"), db=db)
    assert parsed.errors == ()
    assert [d.index for d in parsed.devices] == list(range(8))
    first = parsed.devices[0]
    assert (first.vendor, first.model) == ("amd", "AMD-Instinct-MI300X")
    assert label_value_problem(first.model) is None
    assert first.vram_total_mib == MI300X_MIB == 196288
    assert first.vram_free_mib == MI300X_MIB - 295059456 // 2**20
    assert first.pci_bus_id == "0000:05:00.0" and parsed.devices[5].pci_bus_id == "0000:a6:00.0"
    assert first.uuid == "amd-0x8c9b4f12a73e06d1"
    assert (first.telemetry.temperature_c, first.telemetry.power_w) == (39.0, 134.0)
    assert first.telemetry.power_limit_w == 750.0
    busy = parsed.devices[5]
    assert busy.telemetry.utilisation_pct == 97 and busy.telemetry.power_w == 681.0
    assert busy.vram_free_mib == MI300X_MIB - 180388626432 // 2**20
    # no AMD model in the profile database: no compute invented, and the reason said once
    assert {d.compute.acu_profile for d in parsed.devices} == {0.0}
    assert {d.compute.tflops_fp16_profile for d in parsed.devices} == {0.0}
    [note] = parsed.notes
    assert "amd/AMD-Instinct-MI300X" in note and "profile database" in note


def test_an_mi250x_node_in_rocm5_spelling_reads_as_eight_gcds_and_the_second_die_is_fine(
    db,
) -> None:
    parsed = rocm_smi.parse(fixture_text("rocm-smi-mi250x.json"), db=db)
    assert parsed.errors == () and len(parsed.devices) == 8
    assert all(d.error is None for d in parsed.devices)
    assert {d.model for d in parsed.devices} == {"AMD-INSTINCT-MI200-MCM-OAM-LC-MBA-HPE-C2"}
    assert {d.vram_total_mib for d in parsed.devices} == {MI250X_GCD_MIB}
    primary, secondary = parsed.devices[0], parsed.devices[1]
    assert primary.telemetry.power_w == 91.0 and secondary.telemetry.power_w == 0.0
    assert primary.telemetry.temperature_c == 38.0  # junction before edge
    assert primary.telemetry.power_limit_w == 560.0
    assert parsed.devices[7].pci_bus_id == "0000:de:00.0"


def test_a_hygon_dcu_seen_through_rocm_smi_matches_its_profile(db) -> None:
    cards = json.loads(fixture_text("rocm-smi-mi300x.json"))
    for fields in cards.values():
        fields["Card Series"] = "K100_AI"
        fields["Card Vendor"] = "Chengdu Haiguang IC Design Co., Ltd."
    parsed = rocm_smi.parse(json.dumps(cards), db=db)
    first = parsed.devices[0]
    assert (first.vendor, first.model) == ("hygon", "K100-AI")
    assert first.compute.acu_profile > 0 and parsed.notes == ()
    assert first.uuid.startswith("hygon-")


def test_a_card_without_memory_readings_is_broken_and_the_others_stay_usable(db) -> None:
    cards = json.loads(fixture_text("rocm-smi-mi300x.json"))
    del cards["card3"]["VRAM Total Memory (B)"]
    cards["card6"]["VRAM Total Used Memory (B)"] = "N/A"
    parsed = rocm_smi.parse("WARNING: preamble line\n" + json.dumps(cards), db=db)
    broken = {d.index: d.error for d in parsed.devices if d.error}
    assert set(broken) == {3, 6}
    assert "vram total memory" in (broken[3] or "") and "--showmeminfo vram" in (broken[3] or "")
    assert parsed.devices[3].pci_bus_id == "0000:65:00.0" and parsed.devices[3].vendor == "amd"
    assert [e.device for e in parsed.errors] == [3, 6]
    assert len([d for d in parsed.devices if d.error is None]) == 6


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "no JSON object"),
        ('{"card0": {"Card Series": "AMD Instinct MI300X",', "no JSON object"),
        ('{"card0": {"Card Series": ] }', "not valid JSON"),
        ('{"system": {"Driver version": "6.8.5"}}', "no card"),
        ("[1, 2]", "no JSON object"),
    ],
)
def test_output_without_any_card_is_an_error_naming_why(db, text, reason) -> None:
    with pytest.raises(ValueError, match=reason):
        rocm_smi.parse(text, db=db)


def test_rocm_smi_is_chosen_when_it_is_on_path_and_not_otherwise(tmp_path, db, monkeypatch) -> None:
    monkeypatch.setattr(nvml, "available", lambda: False)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert [d.name for d in detecting.choose(db=db, timeout_s=1)] == []
    tool(tmp_path, "rocm-smi", f"cat {FIXTURES / 'rocm-smi-mi300x.json'}")
    assert [d.name for d in detecting.choose(db=db, timeout_s=1)] == ["rocm-smi"]


async def test_the_rocm_smi_detector_passes_the_flags_it_parses(tmp_path, db) -> None:
    args = tmp_path / "args"
    fake = tool(
        tmp_path, "rocm-smi", f'echo "$@" > {args}\ncat {FIXTURES / "rocm-smi-mi300x.json"}'
    )
    found = await detecting.detect_all(
        [detecting.rocm_smi_detector(db=db, timeout_s=2, tool=fake)], node="n1", now=1.0
    )
    assert len(found.devices) == 8 and found.events == []
    assert args.read_text().split() == list(rocm_smi.ARGS)


async def test_a_rocm_smi_that_finds_no_device_is_one_detector_error(tmp_path, db) -> None:
    # rocm-smi exits 0 and prints nothing on stdout when it finds no device
    fake = tool(tmp_path, "rocm-smi", 'echo "WARNING: No JSON data to report" >&2')
    detectors = [detecting.rocm_smi_detector(db=db, timeout_s=2, tool=fake)]
    first = await detecting.detect_all(detectors, node="n1", now=1.0)
    [event] = first.events
    assert event.kind == "detector_error" and "no JSON object" in event.message
    assert (await detecting.detect_all(detectors, node="n1", now=2.0)).events == []


async def test_a_dcu_reported_by_hy_smi_and_rocm_smi_counts_once(tmp_path, db) -> None:
    hy_table, hy_details = FIXTURES / "hy-smi-k100.txt", FIXTURES / "hy-smi-k100-details.txt"
    hy = tool(tmp_path, "hy-smi", f'[ -z "$1" ] && cat {hy_table} || cat {hy_details}')
    hy_parsed = await detecting.detect_all(
        [detecting.hy_smi_detector(db=db, timeout_s=2, tool=hy)], node="n1", now=1.0
    )
    # the same DCUs as a DTK's rocm-smi shows them: same bus ids
    cards = {
        f"card{d.index}": {
            "Card Series": "K100_AI",
            "Card Vendor": "Chengdu Haiguang IC Design Co., Ltd.",
            "PCI Bus": d.pci_bus_id.upper(),
            "VRAM Total Memory (B)": str(d.vram_total_mib * 2**20),
            "VRAM Total Used Memory (B)": "0",
        }
        for d in hy_parsed.devices
    }
    (tmp_path / "dtk.json").write_text(json.dumps(cards))
    rocm = tool(tmp_path, "rocm-smi", f"cat {tmp_path / 'dtk.json'}")
    both = [
        detecting.hy_smi_detector(db=db, timeout_s=2, tool=hy),
        detecting.rocm_smi_detector(db=db, timeout_s=2, tool=rocm),
    ]
    found = await detecting.detect_all(both, node="n1", now=1.0)
    assert len(found.devices) == len(hy_parsed.devices) == 8
    assert [d.pci_bus_id for d in found.devices] == [d.pci_bus_id for d in hy_parsed.devices]


async def test_a_parser_note_is_logged_once_per_detector(tmp_path, db, logs) -> None:
    fake = tool(tmp_path, "rocm-smi", f"cat {FIXTURES / 'rocm-smi-mi300x.json'}")
    detectors = [detecting.rocm_smi_detector(db=db, timeout_s=2, tool=fake)]
    await detecting.detect_all(detectors, node="n1", now=1.0)
    await detecting.detect_all(detectors, node="n1", now=2.0)
    notes = [e for e in logs if e["event"] == "detector_note"]
    assert len(notes) == 1 and "AMD-Instinct-MI300X" in notes[0]["note"]
