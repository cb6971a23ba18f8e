"""Vendor-tool parsers on recorded outputs, and on truncated / garbled ones."""

from __future__ import annotations

import json

import pytest

from agents import overquota
from agents.parsing import (
    cards_of,
    cnmon,
    hy_smi,
    normalize_bus_id,
    npu_smi,
    nvml_readings,
    rocm_smi,
)
from healer import rules, signals
from healer.histories import DeviceHistory, FingerprintSample
from tests.agents.conftest import FIXTURES, fixture_text


def test_bus_ids_from_every_tool_normalise_to_the_sysfs_spelling() -> None:
    assert normalize_bus_id("00000000:07:00.0") == "0000:07:00.0"
    assert normalize_bus_id("0000:C1:00.0") == "0000:c1:00.0"
    assert normalize_bus_id("4F:00.0") == "0000:4f:00.0"


def test_npu_smi_info_lists_eight_910b2_with_hbm_and_health(db) -> None:
    parsed = npu_smi.parse_info(fixture_text("npu-smi-info-910b.txt"), db=db)
    assert parsed.errors == ()
    assert [d.index for d in parsed.devices] == list(range(8))
    first = parsed.devices[0]
    assert (first.vendor, first.model) == ("huawei", "Ascend910B2")
    assert (first.vram_total_mib, first.vram_free_mib) == (65536, 65536 - 3161)
    assert first.pci_bus_id == "0000:c1:00.0"
    assert first.telemetry.temperature_c == 40 and first.telemetry.power_w == 93.6
    assert first.compute.acu_profile > 0
    assert parsed.devices[2].telemetry.utilisation_pct == 12
    assert parsed.devices[4].health_score == 70  # "Warning"


def test_npu_smi_hbm_no_process_holds_is_the_drivers_and_never_promised(db) -> None:
    text = fixture_text("npu-smi-info-910b.txt")
    parsed = npu_smi.parse_info(text, db=db)
    # at rest (no process listed) all of the HBM in use is the driver's and firmware's
    idle = [d for d in parsed.devices if d.index != 2]
    assert all(d.vram_driver_mib == d.vram_total_mib - d.vram_free_mib for d in idle)
    assert parsed.devices[0].vram_driver_mib == 3161
    assert parsed.devices[0].vram_usable_mib == 65536 - 3161
    # NPU 2 runs a process of 31,568 MB in 34,728 MB used: the driver's is the rest
    [process] = npu_smi.processes(text)
    assert (process.npu, process.chip, process.memory_mib) == (2, 0, 31568)
    assert parsed.devices[2].vram_driver_mib == 34728 - 31568
    # a torn reading (processes holding more than is used) tells nothing
    torn = text.replace(
        "| python3.9                | 31568 ", "| python3.9                | 40000 "
    )
    assert npu_smi.parse_info(torn, db=db).devices[2].vram_driver_mib == 0


def test_npu_smi_truncated_output_marks_the_cut_device_and_keeps_the_others(db) -> None:
    lines = fixture_text("npu-smi-info-910b.txt").splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("| 3     910B2"))
    parsed = npu_smi.parse_info("\n".join(lines[: cut + 1]), db=db)
    assert [d.index for d in parsed.devices] == [0, 1, 2, 3]
    assert all(d.error is None for d in parsed.devices[:3])
    assert parsed.devices[3].error and "truncated" in parsed.devices[3].error
    assert [e.device for e in parsed.errors] == [3]


def test_npu_smi_garbled_row_gives_a_clear_error_for_that_device_only(db) -> None:
    text = fixture_text("npu-smi-info-910b.txt").replace("0000:81:00.0", "0000:ZZ:00.0")
    text = text.replace("3162 / 65536", "31x2 / 65536", 1)
    parsed = npu_smi.parse_info(text, db=db)
    broken = {d.index: d.error for d in parsed.devices if d.error}
    assert set(broken) == {1, 4}
    assert "not a PCI bus id" in broken[4] and "memory usage" in broken[1]
    assert len([d for d in parsed.devices if d.error is None]) == 6


def test_npu_smi_garbage_is_one_error_and_no_devices(db) -> None:
    parsed = npu_smi.parse_info("npu-smi: command failed, dcmi module initialize failed", db=db)
    assert parsed.devices == () and "no NPU rows" in parsed.errors[0].reason


def test_npu_smi_board_and_health_key_values() -> None:
    board = npu_smi.parse_kv(fixture_text("npu-smi-info-t-board-910b.txt"))
    assert board["Serial Number"] == "102375029830" and board["PCI Device ID"] == "0xD802"
    status, code = npu_smi.health_of(
        npu_smi.parse_kv(fixture_text("npu-smi-info-t-health-910b.txt"))
    )
    assert (status, code) == ("Warning", "80E18005")


def test_an_a3_board_names_its_die_s_bin_and_an_a2_board_names_none(db) -> None:
    a3 = npu_smi.parse_kv(fixture_text("npu-smi-info-t-board-a3.txt"))
    assert npu_smi.a3_soc(a3) == "Ascend910_9392"
    assert npu_smi.a3_soc(npu_smi.parse_kv(fixture_text("npu-smi-info-t-board-910b.txt"))) is None
    assert npu_smi.a3_soc({**a3, "NPU Name": "NA"}) is None
    [die, *_] = npu_smi.parse_info(fixture_text("npu-smi-info-a3.txt"), db=db).devices
    named = npu_smi.with_soc(die, "Ascend910_9392", db=db)
    profile = db.get("huawei/Ascend910_9392")
    assert named is not None and named.model == "Ascend910_9392"
    assert (
        named.compute.tflops_fp16_profile == profile.tflops_fp16 > die.compute.tflops_fp16_profile
    )
    assert (named.uuid, named.vram_total_mib) == (die.uuid, die.vram_total_mib)
    assert npu_smi.with_soc(die, "Ascend910_9999", db=db) is None  # a bin with no profile


def test_npu_smi_on_an_a3_lists_each_die_as_a_910c_die_with_its_processes(db) -> None:
    text = fixture_text("npu-smi-info-a3.txt")
    parsed = npu_smi.parse_info(text, db=db)
    assert parsed.errors == ()  # the second die's Power is "-"
    assert [(d.index, d.model, d.vram_total_mib) for d in parsed.devices] == [
        (i, "Ascend910C-die", 65536) for i in range(4)
    ]
    assert db.match("huawei", "Ascend910").model == "Ascend910A"  # the name alone says 910A
    # until its bin is read from the board, a die is promised the least bin's compute
    die = db.get("huawei/Ascend910C-die")
    assert parsed.devices[0].compute.tflops_fp16_profile == die.tflops_fp16
    bins = [p for p in db.all() if p.model.startswith("Ascend910_93")]
    assert len(bins) == 7 and die.tflops_fp16 == min(p.tflops_fp16 for p in bins)
    assert [(d.npu, d.chip, d.device) for d in npu_smi.a3_dies(text)] == [
        (0, 0, 0),
        (0, 1, 1),
        (1, 0, 2),
        (1, 1, 3),
    ]
    assert npu_smi.a3_dies(fixture_text("npu-smi-info-910b.txt")) == []
    assert parsed.devices[1].telemetry.power_w == 0 and parsed.devices[0].telemetry.power_w == 166.4
    # npu-smi 26's processes table has a column after the memory
    assert [(p.npu, p.chip, p.device, p.memory_mib) for p in npu_smi.processes(text)] == [
        (1, 0, 2, 35232),
        (1, 1, 3, 35222),
    ]
    assert [d.vram_driver_mib for d in parsed.devices] == [3158, 2882, 38390 - 35232, 38104 - 35222]
    assert len({d.uuid for d in parsed.devices}) == 4


def test_npu_smi_310p3_duo_chips_are_devices_of_their_own(db) -> None:
    text = fixture_text("npu-smi-info-310p3-duo.txt")
    parsed = npu_smi.parse_info(text, db=db)
    assert parsed.errors == ()
    assert [(d.index, d.model, d.pci_bus_id) for d in parsed.devices] == [
        (0, "Ascend310P", "0000:01:00.0"),
        (1, "Ascend310P", "0000:01:00.0"),
        (2, "Ascend310P", "0000:03:00.0"),
        (3, "Ascend310P", "0000:03:00.0"),
    ]
    assert len({d.uuid for d in parsed.devices}) == 4  # one Bus-Id, two chips
    assert parsed.devices[0].uuid == "ascend-0000:01:00.0"  # a first chip's as before
    [process] = npu_smi.processes(text)  # NPU 0, chip 1: device 1, its name empty
    assert (process.device, process.name, process.memory_mib) == (1, "", 34086)
    assert parsed.devices[1].vram_driver_mib == 35270 - 34086
    assert [u.device for u in overquota.npu_smi_processes(text)] == [1]


def test_npu_smi_on_an_ascend_950_reads_its_own_layout(db) -> None:
    text = fixture_text("npu-smi-info-950.txt")
    parsed = npu_smi.parse_info(text, db=db)
    assert parsed.errors == ()
    assert [(d.index, d.model, d.vram_total_mib, d.pci_bus_id) for d in parsed.devices] == [
        (0, "Ascend950DT", 98304, ""),
        (1, "Ascend950DT", 98304, ""),
    ]
    one = parsed.devices[1]
    assert (one.health_score, one.telemetry.utilisation_pct, one.telemetry.power_w) == (
        70,
        37,
        402.3,
    )
    assert one.vram_driver_mib == 52110 - 47340  # its process, on NPU 1
    assert [(p.device, p.memory_mib) for p in npu_smi.processes(text)] == [(1, 47340)]


def test_npu_smi_310b_without_a_bus_id_is_read(db) -> None:
    text = fixture_text("npu-smi-info-910b.txt").replace("0000:C1:00.0", "NA          ")
    zero = npu_smi.parse_info(text, db=db).devices[0]
    assert zero.error is None and zero.pci_bus_id == "" and zero.uuid == "ascend-npu0-0"


def _hy(text_table: str, text_details: str, db):
    table, errors = hy_smi.parse_table(text_table)
    return hy_smi.parse(
        hy_smi.merge(table, hy_smi.parse_details(text_details)), db=db, errors=errors
    )


def test_hy_smi_table_and_details_give_eight_k100_ai(db) -> None:
    parsed = _hy(fixture_text("hy-smi-k100.txt"), fixture_text("hy-smi-k100-details.txt"), db)
    assert parsed.errors == ()
    assert len(parsed.devices) == 8
    five = parsed.devices[5]
    assert (five.vendor, five.model) == ("hygon", "K100-AI")
    assert (five.vram_total_mib, five.vram_free_mib) == (65520, 65520 - 2048)
    assert five.telemetry.utilisation_pct == 97 and five.telemetry.power_limit_w == 350
    assert five.pci_bus_id == "0000:9d:00.0" and five.uuid.startswith("hygon-0x")


def test_hy_smi_json_output_with_a_warning_line_in_front(db) -> None:
    parsed = hy_smi.parse(hy_smi.parse_json(fixture_text("hy-smi-k100.json")), db=db)
    assert [d.model for d in parsed.devices] == ["K100-AI", "K100-AI"]
    assert parsed.devices[1].telemetry.temperature_c == 48


def test_hy_smi_missing_memory_lines_break_only_that_dcu(db) -> None:
    details = "\n".join(
        line
        for line in fixture_text("hy-smi-k100-details.txt").splitlines()
        if not (line.startswith("DCU[7]") and "vram" in line)
    )
    parsed = _hy(fixture_text("hy-smi-k100.txt"), details, db)
    assert [d.index for d in parsed.devices if d.error] == [7]
    assert "--showmeminfo vram" in (parsed.devices[7].error or "")
    assert parsed.errors[0].device == 7


def test_hy_smi_garbled_table_row_names_the_column_mismatch(db) -> None:
    table = fixture_text("hy-smi-k100.txt").replace("52.0C    133.0W", "52.0C")
    parsed = _hy(table, fixture_text("hy-smi-k100-details.txt"), db)
    assert [d.index for d in parsed.devices if d.error] == [5]
    assert "columns" in str(parsed.errors[0])


def test_hyhal_hy_smi_names_its_devices_hcu_and_gives_four_bw(db) -> None:
    parsed = _hy(fixture_text("hy-smi-bw1000.txt"), fixture_text("hy-smi-bw1000-details.txt"), db)
    assert parsed.errors == ()
    assert [(d.index, d.vendor, d.model) for d in parsed.devices] == [
        (i, "hygon", "BW") for i in range(4)
    ]
    # an unknown model (the "BW" card series names no one model and has no published
    # figures): its VRAM is offered, no profile compute
    assert {d.compute.acu_profile for d in parsed.devices} == {0.0}
    two = parsed.devices[2]  # its bus line ends "--> SN: N/A"
    assert (two.vram_total_mib, two.vram_free_mib) == (65520, 65520 - 64169)
    assert two.telemetry.utilisation_pct == 100 and two.telemetry.power_limit_w == 1000
    assert two.pci_bus_id == "0000:86:00.0" and two.uuid == "hygon-TCH19625050402"
    assert parsed.devices[0].pci_bus_id == "0000:05:00.0"  # "--> SN: 2500238601000586"


def test_hyhal_json_missing_commas_is_read_by_hy_smi_and_by_its_rocm_smi(db) -> None:
    text = fixture_text("hy-smi-bw1000.json")
    with pytest.raises(json.JSONDecodeError, match="Expecting ',' delimiter"):
        json.loads(text)  # as printed: not JSON
    parsed = hy_smi.parse(hy_smi.parse_json(text), db=db)
    assert [d.model for d in parsed.devices] == ["BW", "BW"] and parsed.errors == ()
    one = parsed.devices[1]
    assert (one.telemetry.utilisation_pct, one.telemetry.power_w) == (37.5, 84)
    assert (one.vram_total_mib, one.vram_free_mib) == (65520, 65520 - 1166)
    rocm = rocm_smi.parse(text, db=db)  # the DTK's rocm-smi prints the same
    assert [(d.vendor, d.model, d.pci_bus_id) for d in rocm.devices] == [
        ("hygon", "BW", "0000:05:00.0"),
        ("hygon", "BW", "0000:2b:00.0"),
    ]
    assert rocm.devices[1].telemetry.utilisation_pct == 37.5


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ('{"card0": {"a": "1" 2}}', "not valid JSON"),  # a missing comma before no string
        ('{"card0": {"a": "1",, "b": "2"}}', "not valid JSON"),
        ('{"system": {"a": "1"}}', "no card"),
        ("rocm-smi: not found", "no JSON object"),
    ],
)
def test_smi_json_that_is_not_only_missing_commas_is_refused_naming_the_tool(
    text: str, why: str
) -> None:
    with pytest.raises(ValueError, match=f"^(hy-smi --json output is )?.*{why}"):
        cards_of(text, tool="hy-smi")


def test_smi_json_keeps_empty_values_and_drops_empty_keys() -> None:
    # an empty value, then a missing comma, as HyHAL prints them
    cards = cards_of('{"card3": {"": "", "Unique ID": """Card Series": "BW"}}', tool="hy-smi")
    assert cards == {3: {"Unique ID": "", "Card Series": "BW"}}


def test_cnmon_table_with_info_gives_eight_mlu370(db) -> None:
    info = cnmon.parse_info(fixture_text("cnmon-info-mlu370-x8.txt"))
    assert info[0]["Physical Memory Usage.Total"] == "23374 MiB"
    parsed = cnmon.parse_table(fixture_text("cnmon-mlu370-x8.txt"), db=db, info=info)
    assert parsed.errors == ()
    assert len(parsed.devices) == 8
    three = parsed.devices[3]
    assert (three.vendor, three.model) == ("cambricon", "MLU370-X8")
    assert (three.vram_total_mib, three.vram_free_mib) == (23374, 23374 - 18210)
    assert three.telemetry.utilisation_pct == 63 and three.telemetry.power_limit_w == 250
    assert parsed.devices[0].uuid == "mlu-4C1B3E0A-8D4F-2C3A-0000-000000000000"
    assert three.pci_bus_id == "0000:54:00.0"


def test_cnmon_v5_10_reporting_no_ecc_count_keeps_every_mlu(db) -> None:
    """MLU370 with v5.10 drivers print ``N/A`` for Ecc-Error (recorded in
    public install guides); each MLU is still read, its ECC count 0."""
    table = fixture_text("cnmon-mlu370-x8.txt").replace(
        "| 63%         0         |", "| 63%               N/A |"
    )
    assert "N/A |" in table
    parsed = cnmon.parse_table(table, db=db)
    assert parsed.errors == () and len(parsed.devices) == 8
    three = parsed.devices[3]
    assert (three.model, three.vram_free_mib, three.telemetry.utilisation_pct) == (
        "MLU370-X8",
        23374 - 18210,
        63,
    )
    assert three.telemetry.ecc_uncorrected == 0


def test_cnmon_v4_without_a_bus_column_takes_the_bus_from_cnmon_info(db) -> None:
    table = fixture_text("cnmon-mlu370-x4-v4.txt")
    alone = cnmon.parse_table(table, db=db)
    assert alone.errors == ()
    assert [(d.model, d.vram_total_mib, d.pci_bus_id) for d in alone.devices] == [
        ("MLU370-X4", 23308, "")
    ] * 3
    assert alone.devices[1].vram_free_mib == 23308 - 9318  # the MLU column, not vMemory
    assert [d.uuid for d in alone.devices] == ["mlu-0", "mlu-1", "mlu-2"]
    info = cnmon.parse_info(
        "Card 1\nUUID : ABC-1\nPCI\n    Domain ID : 0\n    Bus num : 4F\n"
        "    Device : 0\n    Function : 0\n"
    )
    with_info = cnmon.parse_table(table, db=db, info=info)
    assert (with_info.devices[1].pci_bus_id, with_info.devices[1].uuid) == (
        "0000:4f:00.0",
        "mlu-ABC-1",
    )


def test_cnmon_info_indented_as_recorded_reads_the_same(db) -> None:
    """Recordings of real ``cnmon info`` indent the top-level keys (four
    spaces) and their sub-keys further: the same readings come out."""
    flat = fixture_text("cnmon-info-mlu370-x8.txt")
    indented = "\n".join(
        line if not line.strip() or line.startswith("Card ") else "    " + line
        for line in flat.splitlines()
    )
    assert "\n    UUID " in indented and "\n            Total " in indented
    assert cnmon.parse_info(indented) == cnmon.parse_info(flat)
    card = cnmon.parse_info(indented)[0]
    assert (
        card["UUID"].startswith("4C1B3E0A") and card["Physical Memory Usage.Total"] == "23374 MiB"
    )


def test_cnmon_truncated_table_marks_the_half_printed_mlu(db) -> None:
    lines = fixture_text("cnmon-mlu370-x8.txt").splitlines()
    cut = next(i for i, line in enumerate(lines) if line.startswith("| 5     /"))
    parsed = cnmon.parse_table("\n".join(lines[: cut + 1]), db=db)
    assert [d.index for d in parsed.devices] == [0, 1, 2, 3, 4, 5]
    assert [d.index for d in parsed.devices if d.error] == [5]


def test_cnmon_garbled_memory_cell_is_an_error_for_that_mlu(db) -> None:
    text = fixture_text("cnmon-mlu370-x8.txt").replace("18210 MiB/ 23374 MiB", "?????????????????")
    parsed = cnmon.parse_table(text, db=db)
    assert [d.index for d in parsed.devices if d.error] == [3]
    assert "MiB" in str(parsed.errors[0])


def _readings() -> list[dict]:
    return json.loads((FIXTURES / "nvml-readings-a100x4.json").read_text())


def test_nvml_readings_become_a100_fingerprints_with_nvlink_per_peer(db) -> None:
    parsed = nvml_readings.convert(_readings(), db=db)
    assert parsed.errors == ()
    zero = parsed.devices[0]
    assert (zero.model, zero.compute_capability, zero.vram_total_mib) == ("A100-80G", "8.0", 81920)
    assert zero.pci_bus_id == "0000:07:00.0" and zero.numa_node == 0
    assert zero.compute.acu_profile == 100
    assert [(link.peer_index, link.type, link.bandwidth_gbps) for link in zero.links] == [
        (1, "nvlink", 200.0),
        (2, "nvlink", 200.0),
        (3, "nvlink", 200.0),
    ]
    assert zero.links[0].peer_bus_id == "0000:0f:00.0"
    two, three = parsed.devices[2], parsed.devices[3]
    assert two.telemetry.throttle_reasons == ("sw_power_cap", "hw_thermal_slowdown")
    assert three.telemetry.ecc_corrected == 12 and three.telemetry.remap_pending
    assert three.telemetry.remapped_rows == 1


def test_a_real_h100_in_a_vm_becomes_an_h100_sxm_fingerprint_that_is_healthy_at_idle(db) -> None:
    # read by agents.nvml.read_all() on a lent H100 (scripts/gpu-check.sh): the
    # driver reports 81,559 MiB, not the datasheet's 80 GiB; the VM shows no
    # NUMA node and no NVLink; idle, the SM clock sits at 345 of 1,980 MHz
    readings = json.loads((FIXTURES / "nvml-readings-h100-vm.json").read_text())
    parsed = nvml_readings.convert(readings, db=db)
    assert parsed.errors == ()
    (h100,) = parsed.devices
    assert (h100.model, h100.compute_capability) == ("H100-SXM", "9.0")
    assert h100.vram_total_mib == 81559 < db.get("nvidia/H100-SXM").vram_mib
    # recorded before the agent read NVML's v2 ``reserved``: nothing held back
    assert "memory_reserved_b" not in readings[0]
    assert h100.vram_driver_mib == 0 and h100.vram_usable_mib == 81559
    assert (h100.pci_bus_id, h100.numa_node, h100.links) == ("0000:00:06.0", None, ())
    assert (h100.pcie_gen, h100.pcie_width) == (5, 16)
    assert h100.compute.acu_profile == pytest.approx(317.15)
    assert h100.telemetry.throttle_reasons == ("gpu_idle",)
    health = rules.load(degraded_window_s=60, recovery_window_s=300)
    sample = FingerprintSample("n1", 0, h100.model, h100.telemetry, fleet_sm_clock_median=1980.0)
    assert signals.fatal_telemetry(h100.telemetry, rules=health) == ""
    assert signals.degraded_signal(DeviceHistory("n1", 0), sample, now=0.0, rules=health) == ""
    judged = rules.judge(DeviceHistory("n1", 0), sample, now=0.0, rules=health)
    assert (judged.verdict, judged.health_score) == ("healthy", 100)


@pytest.mark.parametrize(
    ("reserved_b", "driver_mib"),
    [(503316480, 480), (503316481, 481), (None, 0), (0, 0)],
)
def test_nvmls_reserved_memory_is_the_drivers_rounded_up_to_whole_mib(
    db, reserved_b: int | None, driver_mib: int
) -> None:
    # 480 MiB: what the lent H100 used at rest (81,559 MiB total, v1 API)
    readings = _readings()
    readings[0]["memory_reserved_b"] = reserved_b
    zero = nvml_readings.convert(readings, db=db).devices[0]
    assert zero.vram_driver_mib == driver_mib
    assert zero.vram_usable_mib == zero.vram_total_mib - driver_mib


def test_gpus_without_nvlink_get_pcie_links_scaled_by_common_ancestor(db) -> None:
    readings = _readings()
    for reading in readings:
        reading["nvlinks"] = []
    zero = nvml_readings.convert(readings, db=db).devices[0]
    by_peer = {link.peer_index: link for link in zero.links}
    assert {link.type for link in zero.links} == {"pcie"}
    assert by_peer[1].bandwidth_gbps > by_peer[2].bandwidth_gbps  # same NUMA node vs across
    assert by_peer[1].bandwidth_gbps < 200


def test_nvswitch_links_reach_every_gpu_at_the_full_bandwidth(db) -> None:
    readings = _readings()
    for reading in readings:
        reading["nvlinks"] = [
            {"link": k, "version": 3, "remote_bus_id": "00000000:C1:00.0", "remote_type": "switch"}
            for k in range(12)
        ]
    zero = nvml_readings.convert(readings, db=db).devices[0]
    assert [(link.type, link.bandwidth_gbps) for link in zero.links] == [("nvlink", 600.0)] * 3


def test_a_gpu_nvml_could_not_read_is_reported_broken_and_the_rest_stay(db) -> None:
    readings = _readings()
    readings[1] = {"index": 1, "error": "GPU is lost"}
    del readings[2]["memory_total_b"]
    parsed = nvml_readings.convert(readings, db=db)
    assert [d.index for d in parsed.devices if d.error] == [1, 2]
    assert "GPU is lost" in (parsed.devices[1].error or "")
    assert "memory_total_b" in (parsed.devices[2].error or "")
    assert [link.peer_index for link in parsed.devices[0].links] == [3]


def test_clock_event_reasons_decode_names_and_keep_unknown_bits() -> None:
    assert nvml_readings.clock_event_reasons(0x0) == ()
    assert nvml_readings.clock_event_reasons(0x4 | 0x8) == ("sw_power_cap", "hw_slowdown")
    assert nvml_readings.clock_event_reasons(0x10000) == ("unknown_0x10000",)
