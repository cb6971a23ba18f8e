"""``bench.pool`` at small scale: the simulation runs both policies on one
trace, keeps every ceiling and guarantee, and the shared pool keeps the
devices busier than first-come-first-served with hard limits."""

from __future__ import annotations

import json

import pytest

from bench import pool


def test_the_trace_is_seeded_and_within_its_stated_bounds() -> None:
    gangs = pool.trace(gangs=60, seed=3)
    assert gangs == pool.trace(gangs=60, seed=3)
    assert all(1 <= g.ranks <= 16 and 60.0 <= g.run_s <= 7200.0 for g in gangs)
    assert {g.namespace for g in gangs} == {ns for ns, *_ in pool.NAMESPACES}


def test_a_small_run_keeps_ceilings_and_guarantees_and_beats_fcfs_on_utilisation() -> None:
    gangs = pool.trace(gangs=60, seed=3, gap_s=5.0)
    shared = pool.simulate(gangs, policy="pool")
    fcfs = pool.simulate(gangs, policy="fcfs")
    for result in (shared, fcfs):
        assert sum(len(w) for w in result.waits_s.values()) == 60  # every gang ran
        assert result.borrowed_peak_over_ceiling == 0.0
        assert result.guarantee_broken == 0
    assert shared.utilisation_waiting > fcfs.utilisation_waiting
    assert fcfs.reclaims == 0


def test_the_command_prints_both_policies_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    assert pool.main(["--gangs", "40", "--seed", "2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"pool", "fcfs"}
    assert set(out["pool"]["wait_s"]) == {ns for ns, *_ in pool.NAMESPACES}
