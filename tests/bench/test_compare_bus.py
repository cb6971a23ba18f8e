"""``--compare-bus`` runs the benchmark on one server, on a three-server
cluster and on that cluster fsyncing every write, and prints one table."""

from __future__ import annotations

import subprocess
import sys

import pytest

from bench.buses import KINDS


@pytest.mark.parametrize(
    ("module", "header"),
    [("bench.extender", "binds/s"), ("bench.ingest", "writes/s")],
)
def test_the_comparison_prints_one_row_per_bus(module: str, header: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--small", "--compare-bus"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    table = lines[next(i for i, line in enumerate(lines) if header in line) + 1 :]
    assert [row.split()[0] for row in table if row.strip()] == list(KINDS), out.stdout
    assert "1.00×" in table[0], out.stdout  # the single server is the base


def test_an_unknown_bus_is_refused_naming_the_choices() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "bench.extender", "--small", "--bus", "raft"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2 and "cluster-sync" in out.stderr
