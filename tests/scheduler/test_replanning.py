"""The pure rules for stranded and parked pods (``scheduler.replan.rules``)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from hcs_bus.messages import NodeReservations, PlanRequest, Policy
from scheduler.ledger.pledge_rules import Pledge
from scheduler.plan import rules as planning
from scheduler.plan.gang_records import GangRecord, RankPledge
from scheduler.replan import rules as replanning
from tests.scheduler.helpers import DB, node_fp, state_of
from tests.view.factories import reservation

SCHED = "hcs-scheduler"
A100 = {"vendor": "nvidia", "model": "A100-80G", "devices": 1}
A100_PLAN = {**A100, "vram_mib_per_device": 81920, "whole_device": True, "acu_per_device": 100.0}


def _summary(*, a100_full: bool = True, ascend_full: bool = False) -> planning.Summary:
    state = state_of(
        node_fp("a100-1", "nvidia/A100-80G"), node_fp("ascend-1", "huawei/Ascend910B2")
    )
    for node, full in (("a100-1", a100_full), ("ascend-1", ascend_full)):
        if full:
            r = reservation("other", f"hog-{node}", [(i, 65536, True) for i in range(8)])
            state.apply_reservations(node, NodeReservations(node=node, reservations=(r,)))
    return planning.summarise(state.nodes.values())


def _pod(
    *,
    name: str = "p",
    plan: dict[str, Any] | None = None,
    models: str = "A100-80G",
    substitution: str = "allow",
    owner: str | None = "ReplicaSet",
    **changes: Any,
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "ml",
        "uid": f"uid-{name}",
        "annotations": {
            "hcs.io/plan": json.dumps(plan or A100_PLAN),
            "hcs.io/models": models,
            "hcs.io/substitution": substitution,
        },
    }
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "web-1", "controller": True}]
    pod: dict[str, Any] = {
        "metadata": meta,
        "spec": {
            "schedulerName": SCHED,
            "containers": [
                {"name": "m", "resources": {"limits": {"ai.compute/devices": "1"}}},
            ],
        },
        "status": {"phase": "Pending"},
    }
    for path, value in changes.items():
        section, key = path.split("__")
        pod[section][key] = value
    return pod


def _pending(pod: dict[str, Any]) -> replanning.Pending:
    found = replanning.pending(pod, scheduler_name=SCHED)
    assert found is not None
    return found


def _fresh(pod: replanning.Pending, summary: planning.Summary) -> Any:
    request = replanning.request_of(pod)
    assert isinstance(request, PlanRequest) and request.dry_run
    return planning.plan(request, summary=summary, profiles=DB)


def _judge(pod: dict[str, Any], summary: planning.Summary) -> replanning.Stranded | None:
    found = _pending(pod)
    return replanning.stranded(found, fresh=_fresh(found, summary), summary=summary)


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        ({"spec__nodeName": "a100-1"}, "bound"),
        ({"spec__schedulerName": "default-scheduler"}, "another scheduler"),
        ({"status__phase": "Failed"}, "finished"),
    ],
)
def test_only_unbound_pending_pods_of_the_hcs_profile_count(
    changes: dict[str, Any], why: str
) -> None:
    assert replanning.pending(_pod(**changes), scheduler_name=SCHED) is None, why


def test_a_pod_being_deleted_or_without_a_plan_note_is_not_pending_here() -> None:
    going = _pod()
    going["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    bare = _pod()
    del bare["metadata"]["annotations"]["hcs.io/plan"]
    assert replanning.pending(going, scheduler_name=SCHED) is None
    assert replanning.pending(bare, scheduler_name=SCHED) is None


def test_a_pod_whose_class_is_full_while_another_allowed_class_has_room_is_stranded() -> None:
    found = _judge(_pod(), _summary(a100_full=True))
    assert found is not None
    assert found.target == "huawei/Ascend910B2"
    assert "nvidia/A100-80G" in found.reason and "huawei/Ascend910B2" in found.reason
    assert found.action == "evict"
    assert found.pod.owner == "ReplicaSet/web-1"


def test_a_pod_whose_class_has_room_is_not_stranded() -> None:
    assert _judge(_pod(), _summary(a100_full=False)) is None


def test_a_pod_whose_policy_allows_no_other_class_waits_for_its_own() -> None:
    assert _judge(_pod(substitution="deny"), _summary(a100_full=True)) is None


def test_a_pod_is_not_stranded_when_every_class_it_may_use_is_full() -> None:
    assert _judge(_pod(), _summary(a100_full=True, ascend_full=True)) is None


def test_a_bare_pod_is_reported_not_evicted() -> None:
    found = _judge(_pod(owner=None), _summary(a100_full=True))
    assert found is not None and found.action == "report"
    at = "2026-01-01T00:00:00Z"
    condition = replanning.condition(found, now_iso=at)
    assert (condition["type"], condition["status"]) == (replanning.CONDITION, "True")
    assert found.reason in condition["message"]
    event = replanning.event(found, now_iso=at, reporter="hcs-scheduler")
    assert event["involvedObject"]["uid"] == "uid-p"
    assert event["type"] == "Warning" and "re-create" in event["message"]


def test_the_event_name_is_one_per_pod_incarnation() -> None:
    summary = _summary()
    one = _judge(_pod(), summary)
    again = _judge(_pod(), summary)
    other = _judge(_pod(name="q"), summary)
    assert one and again and other
    assert replanning.event_name(one.pod.ref) == replanning.event_name(again.pod.ref)
    assert replanning.event_name(one.pod.ref) != replanning.event_name(other.pod.ref)


def test_the_deadline_counts_from_the_first_sighting_and_restarts_after_a_break() -> None:
    found = _judge(_pod(), _summary())
    assert found is not None
    clock = replanning.Clock()
    assert clock.due([found], now=100.0, after_s=30) == []
    assert clock.due([found], now=129.0, after_s=30) == []
    assert clock.due([found], now=130.0, after_s=30) == [found]
    clock.acted(found)
    assert clock.due([found], now=131.0, after_s=30) == []  # acted on once
    assert clock.due([], now=132.0, after_s=30) == []  # no longer stranded: forgotten
    assert clock.due([found], now=140.0, after_s=30) == []
    assert clock.due([found], now=170.0, after_s=30) == [found]


def test_freed_names_the_classes_that_gained_room() -> None:
    full, free = _summary(a100_full=True), _summary(a100_full=False)
    assert replanning.freed(None, replanning.capacity(full)) is None  # first look: everyone
    grown = replanning.freed(replanning.capacity(full), replanning.capacity(free))
    assert grown == {"nvidia/A100-80G"}
    assert replanning.freed(replanning.capacity(free), replanning.capacity(full)) == set()


def _gang(job: str, model: str, *ranks: int, state: str = "pledged") -> GangRecord:
    def rank(i: int, devices: int) -> RankPledge:
        pledge = Pledge(
            id=f"{job}-{i}", vendor="nvidia", model=model, devices=devices, vram_mib_per_device=1
        )
        return RankPledge(pod=f"{job}-{i}", node="n1", pledge=pledge)

    return GangRecord(
        namespace="ml",
        job=job,
        size=len(ranks),
        vendor="nvidia",
        model=model,
        state=state,  # type: ignore[arg-type]
        ranks=tuple(rank(i, d) for i, d in enumerate(ranks)),
    )


def test_unplanned_names_the_classes_where_pledged_gangs_hold_fewer_ranks() -> None:
    a, h = "nvidia/A100-80G", "nvidia/H100-SXM"
    big, small = _gang("big", "A100-80G", 4, 4), _gang("small", "A100-80G", 4)
    before = replanning.planned([big, _gang("waits", "A100-80G", 8, state="pinned")])
    assert before == {a: 8}  # a gang not pledged yet keeps no room
    assert replanning.unplanned(None, before) == set()  # first look: the capacity wakes all
    after = replanning.planned([small, _gang("new", "H100-SXM", 8)])
    assert replanning.unplanned(before, after) == {a}  # shrunk; a new gang frees nothing
    assert replanning.unplanned(after, {}) == {a, h}  # every gang released
    assert replanning.unplanned(after, after) == set()  # its ranks booked or not: the same


def test_the_waker_picks_pods_of_freed_classes_at_most_once_per_interval() -> None:
    on_a100 = _pending(_pod(name="a"))
    ascend_plan = {**A100_PLAN, "vendor": "huawei", "model": "Ascend910B2"}
    on_ascend = _pending(_pod(name="b", plan=ascend_plan))
    waker = replanning.Waker(min_interval_s=5)
    assert waker.pick([on_a100, on_ascend], classes=None, now=0.0) == [on_a100, on_ascend]
    assert waker.pick([on_a100, on_ascend], classes=None, now=1.0) == []
    assert waker.pick([on_a100, on_ascend], classes={"nvidia/A100-80G"}, now=6.0) == [on_a100]
    assert waker.pick([on_ascend], classes=None, now=7.0) == [on_ascend]
    assert waker.pick([on_a100], classes=None, now=7.5) == [on_a100]  # gone between: forgotten


def test_a_pod_without_requests_is_never_planned_again() -> None:
    pod = _pod()
    pod["spec"]["containers"][0]["resources"] = {}
    found = _pending(pod)
    assert replanning.request_of(found) is None
    assert found.policy == Policy(models=("A100-80G",), substitution="allow")
    assert found.requests is None


SUBMITTED_SPEC = {"containers": [{"name": "m", "image": "trainer:1", "env": [{"name": "A"}]}]}
COPY = json.dumps({"v": 1, "annotations": {"hcs.io/models": "A100-80G"}, "spec": SUBMITTED_SPEC})


def _recreatable(*, copy: str | None = COPY, owner: str | None = None) -> dict[str, Any]:
    pod = _pod(owner=owner)
    notes = pod["metadata"]["annotations"]
    notes |= {"hcs.io/replan": "recreate", "hcs.io/devices": "0", "team": "vision"}
    if copy is not None:
        notes["hcs.io/submitted"] = copy
    pod["metadata"]["labels"] = {"app": "train"}
    return pod


@pytest.mark.parametrize(
    ("pod", "action"),
    [
        (_recreatable(), "recreate"),
        (_recreatable(copy=None), "report"),  # asked, but admitted without a copy
        (_recreatable(owner="ReplicaSet"), "evict"),  # its owner re-creates it
    ],
)
def test_a_bare_pod_asking_for_it_with_its_copy_is_recreated(
    pod: dict[str, Any], action: str
) -> None:
    found = _judge(pod, _summary(a100_full=True))
    assert found is not None and found.action == action
    if action == "recreate":
        event = replanning.event(found, now_iso="2026-01-01T00:00:00Z", reporter="r")
        assert "created again as submitted" in event["message"]


def test_the_recreated_pod_is_the_submitted_one_under_the_same_name() -> None:
    body = replanning.recreation(_recreatable())
    assert body == {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "p",
            "namespace": "ml",
            "labels": {"app": "train"},
            # every hcs.io/* note of the pod dropped; the user's come from the copy
            "annotations": {"team": "vision", "hcs.io/models": "A100-80G"},
        },
        "spec": SUBMITTED_SPEC,
    }


@pytest.mark.parametrize("copy", [None, "{not json", json.dumps({"v": 1, "spec": "x"}), "[]"])
def test_no_recreation_without_a_readable_copy(copy: str | None) -> None:
    assert replanning.recreation(_recreatable(copy=copy)) is None


def test_the_failure_event_says_where_the_copy_is() -> None:
    ref = _pending(_pod()).ref
    event = replanning.failed_event(ref, error="denied", now_iso="t", reporter="r")
    assert event["reason"] == replanning.FAILED_REASON and event["type"] == "Warning"
    assert "denied" in event["message"] and "pod_recreating" in event["message"]
    assert event["metadata"]["name"] != replanning.event_name(ref)


def test_a_pod_whose_class_has_room_only_on_nodes_taking_no_new_pods_is_stranded() -> None:
    state = state_of(
        node_fp("a100-1", "nvidia/A100-80G"), node_fp("ascend-1", "huawei/Ascend910B2")
    )
    assert _judge(_pod(), planning.summarise(state.nodes.values())) is None
    state.apply_node("a100-1", {}, blocked="taint node.kubernetes.io/unreachable:NoSchedule")
    found = _judge(_pod(), planning.summarise(state.nodes.values()))
    assert found is not None and found.target == "huawei/Ascend910B2"
