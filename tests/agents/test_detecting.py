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
