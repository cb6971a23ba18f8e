"""Sanitizer builds (ASan+UBSan, TSan) of the interceptor, the stubs and the
scenario runner must run clean; the benchmark must produce its table."""

from __future__ import annotations

import re
import subprocess

import pytest

from .conftest import BUILD, SRC


@pytest.mark.parametrize("target", ["asan", "tsan"])
def test_sanitizer_build_runs_every_scenario_cleanly(built: object, target: str) -> None:
    proc = subprocess.run(
        ["make", "-C", str(SRC), "-j2", target], capture_output=True, text=True, timeout=300
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    assert f"{target}: all scenarios passed" in output
    assert "ERROR: AddressSanitizer" not in output
    assert "WARNING: ThreadSanitizer" not in output
    assert "runtime error:" not in output


def test_benchmark_reports_baseline_and_interceptor_cost_per_pair(built: object) -> None:
    proc = subprocess.run(
        [str(BUILD / "tests" / "bench"), str(BUILD / "libhcs_interceptor.so"), "20000"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line.split() for line in proc.stdout.splitlines() if re.match(r"^\d+\s", line)]
    assert [row[0] for row in rows] == ["1", "8"]
    for row in rows:
        # threads | baseline best, median | interceptor best, median |
        # added best, median | Mpairs/s baseline, interceptor | ratio
        assert len(row) == 10, row
        base_best, base_med, with_best, with_med, added_best, added_med = map(float, row[1:7])
        tp_base, tp_with, ratio = map(float, row[7:])
        assert 0 < base_best <= base_med and 0 < with_best <= with_med
        assert abs(with_best - base_best - added_best) < 0.2
        assert abs(with_med - base_med - added_med) < 0.2
        assert tp_base > 0 and tp_with > 0
        assert ratio > 0 and abs(tp_with / tp_base - ratio) <= 0.05 * ratio + 0.01
