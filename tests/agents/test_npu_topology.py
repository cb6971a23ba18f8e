"""``npu-smi info -t topo`` on recorded layouts: every cell read, and each
device's links as the scheduler reads NVLink (one per peer)."""

from __future__ import annotations

import itertools

from agents.parsing import npu_smi
from hcs_bus.messages import DeviceFingerprint
from tests.agents.conftest import fixture_text


def _devices(name: str, db) -> tuple[DeviceFingerprint, ...]:
    return npu_smi.parse_info(fixture_text(name), db=db).devices


def test_a_910b_board_reads_as_a_full_hccs_mesh_of_seven_56_gbps_links_per_npu(db) -> None:
    cells, errors = npu_smi.parse_topo(fixture_text("npu-smi-info-t-topo-910b.txt"))
    assert errors == []
    pairs = [(a, b) for a, b in itertools.product(range(8), repeat=2) if a != b]
    assert [(c.device, c.peer, c.kind) for c in cells] == [(a, b, "HCCS") for a, b in pairs]
    devices = _devices("npu-smi-info-910b.txt", db)
    linked, notes = npu_smi.with_links(devices, cells, db=db)
    assert notes == ()
    bus = {d.index: d.pci_bus_id for d in devices}
    for device in linked:
        assert [(x.peer_index, x.type, x.bandwidth_gbps, x.peer_bus_id) for x in device.links] == [
            (p, "hccs", 56.0, bus[p]) for p in range(8) if p != device.index
        ]
    # nothing else of a device changes
    assert [d.model for d in linked] == [d.model for d in devices]


def test_an_a3_reads_sio_and_the_hccs_switch_as_hccs_at_the_dies_whole_interconnect(db) -> None:
    cells, errors = npu_smi.parse_topo(fixture_text("npu-smi-info-t-topo-a3.txt"))
    assert errors == []
    assert {(c.device, c.peer): c.kind for c in cells} == {
        (0, 1): "SIO",
        (1, 0): "SIO",
        (2, 3): "SIO",
        (3, 2): "SIO",
        **{(a, b): "HCCS_SW" for a in (0, 1) for b in (2, 3)},
        **{(a, b): "HCCS_SW" for a in (2, 3) for b in (0, 1)},
    }
    linked, notes = npu_smi.with_links(_devices("npu-smi-info-a3.txt", db), cells, db=db)
    die = db.get("huawei/Ascend910C-die").interconnect_bandwidth_gbps
    assert notes == ()
    for device in linked:
        assert [(x.peer_index, x.type, x.bandwidth_gbps) for x in device.links] == [
            (p, "hccs", die) for p in range(4) if p != device.index
        ]


def test_npus_over_pcie_only_get_pcie_links_scaled_by_the_path_and_none_for_na(db) -> None:
    cells, errors = npu_smi.parse_topo(fixture_text("npu-smi-info-t-topo-pcie.txt"))
    assert errors == [] and len(cells) == 8 * 7 - 2  # NPU4-NPU7 is NA both ways
    kinds = {(c.device, c.peer): c.kind for c in cells}
    assert (kinds[(0, 1)], kinds[(0, 2)], kinds[(0, 3)], kinds[(0, 4)]) == (
        "PIX",
        "PXB",
        "PHB",
        "SYS",
    )
    assert (4, 7) not in kinds and (7, 4) not in kinds
    linked, _ = npu_smi.with_links(_devices("npu-smi-info-910b.txt", db), cells, db=db)
    links = {(d.index, x.peer_index): x for d in linked for x in d.links}
    assert {x.type for x in links.values()} == {"pcie"}
    assert [links[(0, p)].bandwidth_gbps for p in (1, 2, 3, 4)] == [31.5, 28.4, 25.2, 15.8]
    assert (4, 7) not in links and len(links) == len(cells)


def test_a_row_cut_short_is_an_error_naming_its_line_and_the_other_rows_are_read() -> None:
    lines = fixture_text("npu-smi-info-t-topo-910b.txt").splitlines()
    lines[3] = lines[3].rsplit("HCCS", 4)[0]  # NPU2's row, cut after four cells
    cells, errors = npu_smi.parse_topo("\n".join(lines))
    [error] = errors
    assert error.device == 2 and "topo line 4" in error.reason and "8 NPUs" in error.reason
    assert {c.device for c in cells} == {0, 1, 3, 4, 5, 6, 7} and len(cells) == 7 * 7


def test_a_device_without_the_command_and_garbage_give_no_links_and_no_error(db) -> None:
    for text in ("This device does not support querying topo.", "", "garbage\n\x00\n"):
        assert npu_smi.parse_topo(text) == ([], [])


def test_an_unknown_link_word_or_npu_is_a_note_and_the_rest_are_links(db) -> None:
    text = fixture_text("npu-smi-info-t-topo-910b.txt").replace("HCCS", "WARP", 1)
    text = text.replace("NPU7       CPU", "NPU9       CPU")  # the header names an NPU not listed
    cells, errors = npu_smi.parse_topo(text)
    assert errors == []
    linked, notes = npu_smi.with_links(_devices("npu-smi-info-910b.txt", db), cells, db=db)
    assert any("'WARP' is not known" in n for n in notes)
    assert any("not listed by npu-smi info" in n for n in notes)
    assert [x.peer_index for x in linked[0].links] == [2, 3, 4, 5, 6]  # 1 was WARP, 7 is "9"
    assert {x.type for d in linked for x in d.links} == {"hccs"}


def test_a_broken_device_keeps_no_links_and_its_peers_still_reach_it(db) -> None:
    text = fixture_text("npu-smi-info-910b.txt").replace("0000:81:00.0", "0000:ZZ:00.0")
    devices = npu_smi.parse_info(text, db=db).devices
    assert devices[4].error
    cells, _ = npu_smi.parse_topo(fixture_text("npu-smi-info-t-topo-910b.txt"))
    linked, _ = npu_smi.with_links(devices, cells, db=db)
    assert linked[4].links == ()
    assert 4 in {x.peer_index for x in linked[0].links}
