"""Vendor-tool detectors: a hang or garbage is one detector_error; others go on."""

from __future__ import annotations

import stat
from pathlib import Path

from agents import detecting
from tests.agents.conftest import FIXTURES


def tool(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return str(path)


async def test_a_hanging_tool_is_a_detector_error_and_the_others_still_report(tmp_path, db) -> None:
    good = tool(tmp_path, "npu-smi", f"cat {FIXTURES / 'npu-smi-info-910b.txt'}")
    hung = tool(tmp_path, "cnmon", "sleep 30")
    detectors = [
        detecting.npu_smi_detector(db=db, timeout_s=0.5, tool=good),
        detecting.cnmon_detector(db=db, timeout_s=0.5, tool=hung),
    ]
    first = await detecting.detect_all(detectors, node="n1", now=1.0)
    assert len(first.devices) == 8 and {d.vendor for d in first.devices} == {"huawei"}
    [error] = first.events
    assert (error.kind, error.source, error.severity, error.device) == (
        "detector_error",
        "agent",
        "warning",
        None,
    )
    assert "no answer within 0.5s" in error.message and error.evidence["detector"] == "cnmon"
    again = await detecting.detect_all(detectors, node="n1", now=2.0)
    assert again.events == []  # still failing: no repeat alert


async def test_a_failing_then_recovering_tool_reports_both_changes(tmp_path, db) -> None:
    script = tmp_path / "mode"
    script.write_text("fail")
    fixture = FIXTURES / "hy-smi-k100.txt"
    details = FIXTURES / "hy-smi-k100-details.txt"
    body = (
        f'[ "$(cat {script})" = fail ] && {{ echo garbage; exit 3; }}\n'
        f'[ -z "$1" ] && cat {fixture} || cat {details}'
    )
    detectors = [detecting.hy_smi_detector(db=db, timeout_s=2, tool=tool(tmp_path, "hy-smi", body))]
    failed = await detecting.detect_all(detectors, node="n1", now=1.0)
    assert [e.kind for e in failed.events] == ["detector_error"]
    assert "exit status 3" in failed.events[0].message and failed.devices == []
    script.write_text("ok")
    ok = await detecting.detect_all(detectors, node="n1", now=2.0)
    assert [e.kind for e in ok.events] == ["detector_recovered"]
    assert len(ok.devices) == 8 and ok.devices[0].model == "K100-AI"


async def test_hyhal_hy_smi_is_detected_with_every_device(tmp_path, db) -> None:
    fixture, details = FIXTURES / "hy-smi-bw1000.txt", FIXTURES / "hy-smi-bw1000-details.txt"
    body = f'[ -z "$1" ] && cat {fixture} || cat {details}'
    detectors = [detecting.hy_smi_detector(db=db, timeout_s=2, tool=tool(tmp_path, "hy-smi", body))]
    found = await detecting.detect_all(detectors, node="n1", now=1.0)
    assert found.events == []
    assert [(d.vendor, d.model, d.vram_total_mib) for d in found.devices] == [
        ("hygon", "BW", 65520)
    ] * 4


def a3_npu_smi(tmp_path: Path, *, boards: str) -> tuple[str, Path]:
    """An npu-smi that prints the A3 table for ``info``, its matrix for ``info
    -t topo`` and, for ``info -t board -i N -c C``, runs ``boards`` (shell,
    with $5 = N), counting those calls."""
    calls = tmp_path / "board-calls"
    calls.write_text("")
    body = (
        f'[ "$2" = "-t" ] || {{ cat {FIXTURES / "npu-smi-info-a3.txt"}; exit 0; }}\n'
        f'[ "$3" = topo ] && {{ cat {FIXTURES / "npu-smi-info-t-topo-a3.txt"}; exit 0; }}\n'
        f'echo "$5 $7" >> {calls}\n'
        f"{boards}"
    )
    return tool(tmp_path, "npu-smi", body), calls


async def test_an_a3_die_is_named_by_its_bin_read_once_from_its_board(tmp_path, db) -> None:
    board = FIXTURES / "npu-smi-info-t-board-a3.txt"
    # NPU 0's dies are 9392s, NPU 1's 9362s
    npu_smi, calls = a3_npu_smi(
        tmp_path, boards=f'[ "$5" = 0 ] && cat {board} || sed s/9392/9362/ {board}'
    )
    detectors = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=npu_smi)]
    for now in (1.0, 2.0):
        found = await detecting.detect_all(detectors, node="n1", now=now)
        assert found.events == []
        assert [d.model for d in found.devices] == ["Ascend910_9392"] * 2 + ["Ascend910_9362"] * 2
    top, least = db.get("huawei/Ascend910_9392"), db.get("huawei/Ascend910_9362")
    assert [d.compute.acu_profile for d in found.devices] == [round(top.acu, 2)] * 2 + [
        round(least.acu, 2)
    ] * 2
    assert sorted(calls.read_text().split("\n")[:-1]) == ["0 0", "0 1", "1 0", "1 1"]


async def test_an_a3_die_whose_board_fails_or_names_an_unknown_bin_is_the_least_bin(
    tmp_path, db
) -> None:
    npu_smi, calls = a3_npu_smi(tmp_path, boards="echo busy >&2; exit 2")
    detectors = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=npu_smi)]
    found = await detecting.detect_all(detectors, node="n1", now=1.0)
    assert [d.model for d in found.devices] == ["Ascend910C-die"] * 4 and found.events == []
    await detecting.detect_all(detectors, node="n1", now=2.0)
    assert len(calls.read_text().split("\n")[:-1]) == 4  # not asked again before the retry
    retrying = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=npu_smi, board_retry_s=0)]
    await detecting.detect_all(retrying, node="n1", now=1.0)
    await detecting.detect_all(retrying, node="n1", now=2.0)
    assert len(calls.read_text().split("\n")[:-1]) == 4 + 8
    board = FIXTURES / "npu-smi-info-t-board-a3.txt"
    unknown, _ = a3_npu_smi(tmp_path, boards=f"sed s/9392/9999/ {board}")
    detectors = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=unknown)]
    found = await detecting.detect_all(detectors, node="n1", now=1.0)
    assert [d.model for d in found.devices] == ["Ascend910C-die"] * 4


def npu_smi_with_topo(tmp_path: Path, *, topo: str) -> tuple[str, Path]:
    """An npu-smi that prints the 910B table for ``info`` and runs ``topo``
    (shell) for ``info -t topo``, counting those runs."""
    runs = tmp_path / "topo-runs"
    runs.write_text("")
    body = (
        f'[ "$3" = topo ] || {{ cat {FIXTURES / "npu-smi-info-910b.txt"}; exit 0; }}\n'
        f"echo run >> {runs}\n"
        f"{topo}"
    )
    return tool(tmp_path, "npu-smi", body), runs


async def test_a_910b_node_s_fingerprint_carries_its_hccs_links_read_once(tmp_path, db) -> None:
    npu_smi, runs = npu_smi_with_topo(
        tmp_path, topo=f"cat {FIXTURES / 'npu-smi-info-t-topo-910b.txt'}"
    )
    detectors = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=npu_smi)]
    for now in (1.0, 2.0):
        found = await detecting.detect_all(detectors, node="n1", now=now)
        assert found.events == [] and len(found.devices) == 8
        for device in found.devices:
            assert sorted(x.peer_index for x in device.links if x.type == "hccs") == [
                p for p in range(8) if p != device.index
            ]
    assert runs.read_text().split() == ["run"]  # the matrix is read once for these NPUs


async def test_npus_whose_matrix_cannot_be_read_are_reported_without_links_and_asked_again(
    tmp_path, db, logs
) -> None:
    npu_smi, runs = npu_smi_with_topo(tmp_path, topo="echo busy >&2; exit 2")
    detectors = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=npu_smi, board_retry_s=0)]
    for now in (1.0, 2.0):
        found = await detecting.detect_all(detectors, node="n1", now=now)
        assert found.events == []  # the devices are there: no detector_error
        assert len(found.devices) == 8 and all(d.links == () for d in found.devices)
    assert runs.read_text().split() == ["run", "run"]  # tried again after the retry
    noted = [e for e in logs if e["event"] == "detector_note" and "no NPU links" in e["note"]]
    assert len(noted) == 1 and "exit status 2" in noted[0]["note"]  # logged once


async def test_an_a3_node_s_dies_are_linked_over_sio_and_the_hccs_switch(tmp_path, db) -> None:
    board = FIXTURES / "npu-smi-info-t-board-a3.txt"
    npu_smi, _ = a3_npu_smi(tmp_path, boards=f"cat {board}")
    detectors = [detecting.npu_smi_detector(db=db, timeout_s=2, tool=npu_smi)]
    found = await detecting.detect_all(detectors, node="n1", now=1.0)
    whole = db.get("huawei/Ascend910_9392").interconnect_bandwidth_gbps
    assert [d.model for d in found.devices] == ["Ascend910_9392"] * 4
    for device in found.devices:
        assert [(x.peer_index, x.type, x.bandwidth_gbps) for x in device.links] == [
            (p, "hccs", whole) for p in range(4) if p != device.index
        ]
