"""bench.gangs: its job mix, its bookkeeping on made-up pods, and a tiny run
on the real control plane (``HCS_KUBE_BIN``): a row per run, every job
ended, no gang split or partly held."""

from __future__ import annotations

import re
import subprocess
import sys
from typing import Any

import pytest

from bench.gangs import SIZES, Job, Progress, job_mix
from tests.e2e.cluster import ROOT, find_binaries

ROW = re.compile(
    r"^(?P<label>independent|gangs)\s+(?P<jobs>\d+)\s+(?P<ended>\d+)\s+(?P<makespan>[\d.]+)"
    r"\s+(?P<idle>\d+)\s+(?P<split>\d+)\s+(?P<partial>\d+)\s+(?P<p50>[\d.]+)\s+(?P<p99>[\d.]+)"
    r"\s+(?P<refused>\d+)$"
)


def test_the_job_mix_is_seeded_and_keeps_to_the_stated_sizes_and_shares() -> None:
    jobs = job_mix(1000, seed=3, min_s=10, max_s=30)
    assert jobs == job_mix(1000, seed=3, min_s=10, max_s=30)
    for share, low, high in SIZES:
        count = sum(low <= j.ranks <= high for j in jobs)
        assert abs(count / len(jobs) - share) < 0.05, (low, high, count)
    assert all(10 <= j.duration_s <= 30 for j in jobs)
    assert len({j.name for j in jobs}) == len(jobs)


def _pod(node: str | None) -> dict[str, Any]:
    return {"metadata": {}, "spec": {"nodeName": node} if node else {}}


def test_a_job_partly_bound_while_another_waits_counts_as_a_partial_hold_and_ends_on_time() -> None:
    big, small = Job("big", 2, 5.0), Job("small", 1, 5.0)
    progress = Progress(jobs=[big, small], devices=4, partial_s=1.0, started_at=0.0)
    pods = {"big-0": _pod("n1"), "big-1": _pod(None), "small-0": _pod(None)}
    for now in (0.0, 1.0, 2.0, 3.0):
        assert progress.tick(now, pods=pods, running={"big-0": 0.5}) == []
    assert progress.partial["big"] == 3.0
    assert progress.idle_device_s == 3 * 3.0  # one of four devices held, three seconds
    pods = {"big-0": _pod("n1"), "big-1": _pod("n2"), "small-0": _pod("n1")}
    running = {"big-0": 0.5, "big-1": 3.5, "small-0": 3.6}
    assert progress.tick(4.0, pods=pods, running=running) == []
    assert progress.tick(9.0, pods=pods, running=running) == [big, small]
    labels = {"n1": {"hcs.io/model": "A", "hcs.io/network-group": "g"}}
    labels["n2"] = {"hcs.io/model": "B", "hcs.io/network-group": "g"}
    progress.created_at = {"big-0": 0.0, "big-1": 0.1, "small-0": 0.2}
    for job in (big, small):
        progress.end(job, 9.0)
    figures = progress.figures(labels)
    assert figures["split"] == ["big"] and figures["partial"] == ["big"]
    assert figures["ended"] == 2 and figures["makespan_s"] == 9.0
    assert figures["start_p50_s"] == pytest.approx((3.5 - 0.1 + 3.6 - 0.2) / 2)


@pytest.mark.timeout(300)
def test_a_tiny_run_ends_every_job_both_ways_and_no_gang_is_split_or_partly_held() -> None:
    found = find_binaries()
    if isinstance(found, str):
        pytest.skip(found)
    argv = [sys.executable, "-m", "bench.gangs", "--jobs", "5", "--nodes", "10", "--seed", "2"]
    done = subprocess.run(
        [*argv, "--min-s", "2", "--max-s", "4", "--stuck-s", "30"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("run "))
    rows = {m["label"]: m for line in lines[header + 1 :] if (m := ROW.match(line))}
    assert set(rows) == {"independent", "gangs"}, lines[header:]
    for label, row in rows.items():
        assert int(row["jobs"]) == int(row["ended"]) == 5, (label, row.group(0))
        assert float(row["makespan"]) > 0 and float(row["p50"]) <= float(row["p99"]), row.group(0)
    assert int(rows["gangs"]["split"]) == 0 and int(rows["gangs"]["partial"]) == 0, lines[header:]
