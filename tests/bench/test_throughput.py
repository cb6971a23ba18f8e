"""bench.throughput at a tiny scale on the real control plane (``HCS_KUBE_BIN``):
its table has a row per burst and per kind's median, every pod is bound,
none refused, and the last line is the ratio."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.e2e.cluster import ROOT, find_binaries

NODES, PODS = 5, 20
ROW = re.compile(
    r"^(?P<label>\S+)\s+(?P<pods>\d+)\s+(?P<bound>\d+)\s+(?P<rate>[\d.]+)\s+(?P<p50>[\d.]+)"
    r"\s+(?P<p99>[\d.]+)\s+(?P<refused>\d+)\s+(?P<rss>\d+)(?P<cpu>(\s+[\d.]+){7})$"
)


@pytest.mark.timeout(600)
def test_a_tiny_run_binds_every_pod_of_both_kinds_and_ends_with_the_ratio() -> None:
    found = find_binaries()
    if isinstance(found, str):
        pytest.skip(found)
    argv = [sys.executable, "-m", "bench.throughput", "--nodes", str(NODES), "--pods", str(PODS)]
    done = subprocess.run(
        [*argv, "--rounds", "1", "--rest-s", "2", "--settle-s", "20", "--profile"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("burst"))
    assert lines[header].split()[-7:] == [
        "scheduler",
        "injector",
        "nats-server",
        "kube-scheduler",
        "kube-apiserver",
        "etcd",
        "others",
    ]
    rows = {m["label"]: m for line in lines[header + 1 :] if (m := ROW.match(line))}
    assert set(rows) == {"plain-1", "hcs-1", "median-plain", "median-hcs"}, lines[header:]
    for label, row in rows.items():
        assert int(row["pods"]) == PODS and int(row["bound"]) == PODS, (label, row.group(0))
        assert int(row["refused"]) == 0 and float(row["rate"]) > 0, (label, row.group(0))
        assert float(row["p50"]) <= float(row["p99"]), (label, row.group(0))
    assert int(rows["hcs-1"]["rss"]) > 0
    # --profile: the scheduler ran under bench.cpu_sampler, sampled through the HCS burst
    profile = next(i for i, line in enumerate(lines) if "CPU time through the first HCS" in line)
    sampled = re.search(r"burst: ([\d.]+) s \(", lines[profile])
    assert sampled and float(sampled.group(1)) > 0, lines[profile]
    function = re.compile(r"^\s+[\d.]+%\s+[\d.]+%\s+\S.* \(\S+:\d+\)$")  # name (file:line)
    assert function.match(lines[profile + 2]), lines[profile : profile + 3]
    last = re.fullmatch(rf"ratio bound/s hcs/plain: ([\d.]+) at {NODES} nodes", lines[-1])
    assert last and float(last.group(1)) > 0, lines[-1]


@pytest.mark.parametrize(
    ("asked", "env", "interval_s", "want"),
    [
        (None, None, 10.0, 35.0),  # the product's default where reports are frequent
        (None, None, 60.0, 210.0),  # three reports missed in a row, not one
        (90.0, "500", 60.0, 90.0),  # asked on the command line
        (None, "500", 60.0, 500.0),  # set in the environment
    ],
)
def test_a_node_is_stale_only_after_three_missed_reports_unless_told_otherwise(
    monkeypatch: pytest.MonkeyPatch,
    asked: float | None,
    env: str | None,
    interval_s: float,
    want: float,
) -> None:
    from bench.throughput import STALE_ENV, stale_after_s

    if env is None:
        monkeypatch.delenv(STALE_ENV, raising=False)
    else:
        monkeypatch.setenv(STALE_ENV, env)
    assert stale_after_s(asked, interval_s) == want
