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
    for _, base, with_interceptor, added in rows:
        assert float(base) > 0 and float(with_interceptor) > 0
        assert abs(float(with_interceptor) - float(base) - float(added)) < 0.2
