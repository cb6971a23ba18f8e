"""Per-device isolation, decided purely: which events take a device out, which
take the node out, and when the share of devices out taints the node."""

from __future__ import annotations

import msgspec
import pytest

from hcs_bus import vocabulary
from healer import decisions, rules
from healer.decisions import NODE, NodeState
from healer.histories import DeviceHistory, NodeJudgement
from tests.healer.conftest import health

ADOPTED = -2  # healer.healing: a taint adopted from a previous leader


def with_share(base: rules.Rules, share: float) -> rules.Rules:
    return msgspec.structs.replace(base, taint_failed_share=share)


def decide(
    events: list[tuple[str, int | None, int | None]],
    *,
    devices: int,
    rule_set: rules.Rules,
) -> decisions.NodePlan:
    """Judge (kind, device, code) events on a fresh node of ``devices`` devices,
    as the healer does, and plan what to do about the node."""
    histories = {i: DeviceHistory("n1", i) for i in range(devices)}
    for at, (kind, device, code) in enumerate(events):
        index = decisions.history_index(device=device, kind=kind)
        history = histories.setdefault(index, DeviceHistory("n1", index))
        event = health(kind=kind, device=device, code=code, severity="fatal")
        rules.judge(history, event, now=float(at), rules=rule_set)
    judged = rules.judge_node(histories.values(), stale=False)
    return decisions.plan(NodeState(), judged, rules=rule_set, devices=devices)


@pytest.mark.parametrize(
    ("kind", "device", "code", "verdict", "taint", "evicted"),
    [
        ("xid", 2, 79, "degraded", None, (2,)),  # one device of eight: only it goes out
        ("device_lost", 5, None, "degraded", None, (5,)),
        ("row_remap_failure", 0, None, "degraded", None, (0,)),
        ("aer_fatal", None, None, "failed", "NoSchedule", (NODE,)),  # no device index
        ("nvswitch_down", 3, None, "failed", "NoSchedule", (NODE,)),  # node-wide kind
        ("driver_failure", 1, None, "failed", "NoSchedule", (NODE,)),
        ("fabric_down", None, None, "failed", "NoSchedule", (NODE,)),
        ("xid", 2, 13, "healthy", None, ()),  # an application Xid isolates nothing
        ("gremlins_v2031", 4, None, "healthy", None, ()),  # a kind from the future
        ("gremlins_v2031", None, None, "healthy", None, ()),
    ],
)
def test_one_event_isolates_its_device_or_for_a_node_wide_fault_the_node(
    kind: str,
    device: int | None,
    code: int | None,
    verdict: str,
    taint: str | None,
    evicted: tuple[int, ...],
    small_rules: rules.Rules,
) -> None:
    plan = decide([(kind, device, code)], devices=8, rule_set=small_rules)
    assert (plan.state.verdict, plan.taint, plan.evict_now) == (verdict, taint, evicted)
    assert plan.isolates == bool(evicted)  # any isolation passes the breaker


@pytest.mark.parametrize(
    ("failed", "devices", "share", "taint"),
    [
        (1, 8, 0.5, None),
        (3, 8, 0.5, None),
        (4, 8, 0.5, "NoSchedule"),  # half of the node out: at the threshold
        (7, 8, 0.5, "NoSchedule"),
        (2, 8, 0.25, "NoSchedule"),  # a stricter operator setting
        (1, 8, 0.25, None),
        (1, 2, 0.5, "NoSchedule"),
        (1, 1, 1.0, "NoSchedule"),  # a one-device node is out with its device
        (7, 8, 1.0, None),
    ],
)
def test_the_node_is_tainted_once_the_failed_share_reaches_the_setting(
    failed: int, devices: int, share: float, taint: str | None, small_rules: rules.Rules
) -> None:
    events: list[tuple[str, int | None, int | None]] = [("xid", i, 79) for i in range(failed)]
    plan = decide(events, devices=devices, rule_set=with_share(small_rules, share))
    assert plan.taint == taint
    assert plan.state.verdict == ("failed" if taint else "degraded")
    assert plan.evict_now == tuple(range(failed))  # only the failed devices' pods, either way


def test_the_device_that_tips_the_share_taints_and_evicts_only_its_own_pods(
    small_rules: rules.Rules,
) -> None:
    three = NodeJudgement("failed", failed=(0, 1, 2))
    before = decisions.plan(NodeState(), three, rules=small_rules, devices=8)
    assert before.taint is None and before.isolates
    four = NodeJudgement("failed", failed=(0, 1, 2, 3))
    after = decisions.plan(before.state, four, rules=small_rules, devices=8)
    assert (after.taint, after.evict_now, after.isolates) == ("NoSchedule", (3,), False)
    healthy = decisions.plan(after.state, NodeJudgement("healthy"), rules=small_rules, devices=8)
    assert (healthy.taint, healthy.state.verdict, healthy.evict_now) == ("", "healthy", ())


@pytest.mark.parametrize(
    ("judged", "devices", "verdict", "taint", "slow"),
    [
        (NodeJudgement("degraded", degraded=(1,)), 8, "degraded", None, (1,)),
        (
            NodeJudgement("degraded", degraded=tuple(range(8))),
            8,
            "degraded",
            "PreferNoSchedule",
            tuple(range(8)),
        ),
        (
            NodeJudgement("failed", failed=(0, 1), degraded=(2, 3)),
            8,
            "degraded",
            "PreferNoSchedule",
            (2, 3),
        ),
        (NodeJudgement("degraded", degraded=(NODE,)), 8, "degraded", "PreferNoSchedule", (NODE,)),
        (NodeJudgement("failed", failed=(ADOPTED,)), 8, "failed", "NoSchedule", ()),
        (NodeJudgement("lost", failed=(0,)), 8, "lost", "NoExecute", ()),
        (NodeJudgement("lost"), 8, "lost", "NoExecute", ()),
        (NodeJudgement("failed", failed=(3,)), 0, "failed", "NoSchedule", ()),  # size unknown
    ],
)
def test_degraded_adopted_lost_and_unknown_sized_nodes(
    judged: NodeJudgement,
    devices: int,
    verdict: str,
    taint: str | None,
    slow: tuple[int, ...],
    small_rules: rules.Rules,
) -> None:
    plan = decisions.plan(NodeState(), judged, rules=small_rules, devices=devices)
    assert (plan.state.verdict, plan.taint, plan.checkpoint_then_evict) == (verdict, taint, slow)
    if verdict == "lost":
        assert plan.evict_now == ()  # the NoExecute taint evicts


def test_a_refused_device_isolation_is_not_planned_again_for_the_same_verdict(
    small_rules: rules.Rules,
) -> None:
    one = NodeJudgement("failed", failed=(2,))
    refused = decisions.blocked(decisions.plan(NodeState(), one, rules=small_rules, devices=8))
    again = decisions.plan(refused, one, rules=small_rules, devices=8)
    assert again.empty and again.state.blocked
    whole = NodeJudgement("failed", failed=(NODE, 2))
    escalated = decisions.plan(refused, whole, rules=small_rules, devices=8)
    assert escalated.isolates and escalated.taint == "NoSchedule"  # asks the breaker again


def test_every_node_wide_kind_is_fatal_and_known() -> None:
    assert vocabulary.NODE_WIDE
    for kind in vocabulary.NODE_WIDE:
        assert vocabulary.kind_class(kind) == "fatal"
        assert decisions.history_index(device=0, kind=kind) == NODE


def test_the_share_setting_is_validated(small_rules: rules.Rules) -> None:
    for bad in (0.0, 1.5, -1.0):
        with pytest.raises(Exception, match="taint_failed_share"):
            rules.load(degraded_window_s=1.0, recovery_window_s=2.0, taint_failed_share=bad)
    loaded = rules.load(degraded_window_s=1.0, recovery_window_s=2.0, taint_failed_share=0.25)
    assert loaded.taint_failed_share == 0.25
    assert small_rules.taint_failed_share == 0.5  # the default
