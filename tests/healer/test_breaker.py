"""Circuit breaker and node plans (pure)."""

from __future__ import annotations

from healer import decisions, rules
from healer.breaker import Breaker
from healer.histories import NodeJudgement


def test_the_breaker_refuses_beyond_ten_percent_within_the_window() -> None:
    breaker = Breaker(max_fraction=0.10, window_s=600.0)
    allowed = [breaker.admit(f"n{i}", known_nodes=50, now=float(i)).allowed for i in range(8)]
    assert allowed == [True] * 5 + [False] * 3
    assert breaker.admit("n0", known_nodes=50, now=9.0).allowed  # already isolated
    assert breaker.admit("n99", known_nodes=50, now=700.0).allowed  # window passed


def test_two_hundred_faults_over_five_thousand_nodes_do_not_trip_it() -> None:
    breaker = Breaker(max_fraction=0.10, window_s=600.0)
    assert all(breaker.admit(f"n{i}", known_nodes=5000, now=i * 0.01).allowed for i in range(200))


def test_a_small_cluster_can_still_isolate_one_node() -> None:
    breaker = Breaker(max_fraction=0.10, window_s=600.0)
    assert breaker.admit("a", known_nodes=3, now=0.0).allowed
    assert not breaker.admit("b", known_nodes=3, now=1.0).allowed


def test_plans_follow_the_verdicts(small_rules: rules.Rules) -> None:
    healthy = decisions.NodeState()
    failed = decisions.plan(healthy, NodeJudgement("failed", failed=(1,)), rules=small_rules)
    assert (failed.taint, failed.evict_now, failed.isolates) == ("NoSchedule", (1,), True)
    again = decisions.plan(failed.state, NodeJudgement("failed", failed=(1, 2)), rules=small_rules)
    assert (again.taint, again.evict_now, again.isolates) == (None, (2,), False)
    degraded = decisions.plan(healthy, NodeJudgement("degraded", degraded=(0,)), rules=small_rules)
    assert degraded.taint == "PreferNoSchedule" and degraded.checkpoint_then_evict == (0,)
    lost = decisions.plan(healthy, NodeJudgement("lost"), rules=small_rules)
    assert lost.taint == "NoExecute" and not lost.evict_now
    back = decisions.plan(failed.state, NodeJudgement("healthy"), rules=small_rules)
    assert back.taint == "" and not back.isolates


def test_a_blocked_isolation_is_not_retried_for_the_same_verdict(
    small_rules: rules.Rules,
) -> None:
    p = decisions.plan(
        decisions.NodeState(), NodeJudgement("failed", failed=(0,)), rules=small_rules
    )
    state = decisions.blocked(p)
    assert decisions.plan(state, NodeJudgement("failed", failed=(0,)), rules=small_rules).empty
