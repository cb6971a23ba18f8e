"""The benchmarks run at tiny size and print their tables."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    ("module", "rows"),
    [
        (
            "bench.extender",
            [
                "bare aiohttp decode+encode",
                "filter (names)",
                "prioritize (names)",
                "plans over hcs.place",
                "binds, 2 replicas contending",
                "peak RSS",
            ],
        ),
        (
            "bench.ingest",
            [
                "bare ordered push, decode",
                "bare pull, decode+AckAll",
                "ClusterView (+ the ledger)",
                "ratio ≥ 0.7",
                "ready ≤ 5 s",
            ],
        ),
    ],
)
def test_the_benchmarks_run_small_and_print_their_tables(module: str, rows: list[str]) -> None:
    out = subprocess.run(
        [sys.executable, "-m", module, "--small"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    for row in rows:
        assert row in out.stdout, out.stdout + out.stderr
