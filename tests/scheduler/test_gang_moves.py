"""Gangs move and restart as a whole: re-planning never takes one rank alone
(a waiting gang is pinned to another class and every member admitted again,
only under substitution allow), a pledged gang whose members were replaced
waits again whole, every rank binds with one resume point, and preemption
never takes part of a gang. Pure rules, then a real nats-server with the API
double and the running replica."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from hcs_bus import messages, streams, subjects, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.messages import CheckpointEvent, Plan, PodRef, Policy, Requests
from scheduler.extender import rules as placing
from scheduler.ledger.pledge_rules import Pledge
from scheduler.plan import gang_records as records
from scheduler.plan import rules as planning
from scheduler.plan.pods import PodInfo
from scheduler.replan import rules as replanning
from tests.apiserver import ApiServer
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_TWO, A100_WHOLE, DB, k8s_doc, until
from tests.scheduler.helpers import pod as pod_doc
from tests.scheduler.test_extender import _post, _ready
from tests.scheduler.test_gang_rules import A100, ASCEND, fleet, occupy
from tests.scheduler.test_gangs import RUN as GANGS_RUN
from tests.scheduler.test_gangs import FakeKube, _loop, _member, _pins, _record, _request
from tests.scheduler.test_stranding import _fill_a100, _scans, _start
from tests.view.factories import reservation

NS, SCHED, RUN = "ml", "hcs-scheduler", "ml/train/uid-1"
JOB = {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "uid-1"}


def _pending(i: int, *, owned: bool = True, recreate: bool = False) -> replanning.Pending:
    doc = pod_doc(f"train-{i}", namespace=NS, plan=A100_WHOLE)
    doc["spec"]["schedulerName"] = SCHED
    doc["status"] = {"phase": "Pending"}
    notes = doc["metadata"]["annotations"]
    notes[vocabulary.GANG] = RUN
    if recreate:
        notes[vocabulary.REPLAN] = vocabulary.REPLAN_RECREATE
        notes[vocabulary.SUBMITTED] = json.dumps({"spec": {"containers": []}})
    doc["metadata"]["ownerReferences"] = [{**JOB, "controller": True}] if owned else []
    found = replanning.pending(doc, scheduler_name=SCHED)
    assert found is not None
    return found


def _waiting(substitution: str, *, size: int = 4) -> records.GangRecord:
    return records.GangRecord(
        namespace=NS,
        job="train",
        run="uid-1",
        size=size,
        vendor="nvidia",
        model="A100-80G",
        library="nccl",
        requests=Requests(devices=1),
        policy=Policy(substitution=substitution),  # type: ignore[arg-type]
    )


def _a100_full_ascend_free() -> Any:
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))
    occupy(state, "gpu", [(i, 81920, True) for i in range(8)])
    return state


# ---------------------------------------------------------------- rules --


def test_a_stranded_gang_member_is_never_replanned_alone() -> None:
    member = _pending(0)
    assert member.gang == records.key_of_run(RUN)
    state = _a100_full_ascend_free()
    summary = planning.summarise(state.schedulable())
    elsewhere = Plan(
        ok=True, vendor="huawei", model="Ascend910B2", devices=1, vram_mib_per_device=65536
    )
    assert replanning.request_of(member) is None
    assert replanning.stranded(member, fresh=elsewhere, summary=summary) is None
    alone, members = replanning.by_gang([member, _pending(1)])
    assert alone == [] and list(members) == [records.key_of_run(RUN)]


def test_a_waiting_gang_is_moved_whole_under_substitution_allow() -> None:
    members = [_pending(i) for i in range(4)]
    move = replanning.gang_move(
        _waiting("allow"), members, state=_a100_full_ascend_free(), held={}, profiles=DB
    )
    assert move is not None
    assert move.target == "huawei/Ascend910B2"
    assert sorted(s.pod.ref.name for s in move.stranded()) == [f"train-{i}" for i in range(4)]
    assert {s.action for s in move.stranded()} == {"evict"}
    moved = records.moved(move.record, vendor=move.vendor, model=move.model)
    assert (moved.vendor, moved.model, moved.library, moved.state) == (
        "huawei",
        "Ascend910B2",
        "hccl",
        "pinned",
    )


@pytest.mark.parametrize("substitution", ["deny", "ask"])
def test_a_waiting_gang_is_not_moved_unless_substitution_allows(substitution: str) -> None:
    members = [_pending(i) for i in range(4)]
    move = replanning.gang_move(
        _waiting(substitution), members, state=_a100_full_ascend_free(), held={}, profiles=DB
    )
    assert move is None


def test_a_waiting_gang_whose_class_can_hold_it_stays() -> None:
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))
    members = [_pending(i) for i in range(4)]
    assert replanning.gang_move(_waiting("allow"), members, state=state, held={}) is None


def test_a_gang_with_a_bare_member_nothing_recreates_is_not_moved_at_all() -> None:
    members = [_pending(i) for i in range(3)] + [_pending(3, owned=False)]
    state = _a100_full_ascend_free()
    assert replanning.gang_move(_waiting("allow"), members, state=state, held={}) is None
    recreated = [_pending(i) for i in range(3)] + [_pending(3, owned=False, recreate=True)]
    move = replanning.gang_move(_waiting("allow"), recreated, state=state, held={})
    assert move is not None
    assert sorted(s.action for s in move.stranded()) == ["evict", "evict", "evict", "recreate"]


def test_a_pledged_gang_is_never_moved() -> None:
    pledged = msgspec.structs.replace(_waiting("allow"), state="pledged")
    state = _a100_full_ascend_free()
    members = [_pending(i) for i in range(4)]
    assert replanning.gang_move(pledged, members, state=state, held={}) is None


def test_preemption_victims_never_split_a_gang() -> None:
    gangs = {"g": frozenset({"ml/r0", "ml/r1"}), "h": frozenset({"ml/s0"})}
    assert placing.split_gang({"ml/r0", "ml/other"}, gangs) == "g"
    assert placing.split_gang({"ml/r0", "ml/r1", "ml/s0"}, gangs) == ""
    assert placing.split_gang({"ml/other"}, gangs) == ""


def test_preemption_passes_over_gang_members_for_lower_priority_victims() -> None:
    state = fleet(("gpu", A100, "g1"), devices=2)
    node = state.nodes["gpu"]
    rank = msgspec.structs.replace(
        reservation("ml", "r0", [(0, 81920, True)]),
        pod=PodRef(namespace="ml", name="r0", uid="u-r0"),
    )
    other = msgspec.structs.replace(
        reservation("ml", "web", [(1, 81920, True)]),
        pod=PodRef(namespace="ml", name="web", uid="u-web"),
        priority=5,
    )
    doc = messages.NodeReservations(node="gpu", reservations=(rank, other))
    demand = placing.Demand(
        vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=81920, whole_device=True
    )
    free = placing.victims_for(node, doc, demand, priority=10, already=set())
    assert free is not None and [v.pod.name for v in free] == ["r0"]  # lowest priority first
    spared = placing.victims_for(node, doc, demand, priority=10, already=set(), spared={"u-r0"})
    assert spared is not None and [v.pod.name for v in spared] == ["web"]
    none = placing.victims_for(node, doc, demand, priority=3, already=set(), spared={"u-r0"})
    assert none is None


def test_a_pledged_gang_whose_members_were_replaced_is_restarted() -> None:
    pledge = Pledge(
        id="p0",
        vendor="nvidia",
        model="A100-80G",
        devices=1,
        vram_mib_per_device=81920,
        time_s=1_800_000_000.0,
    )
    rank = records.RankPledge(pod="train-0", node="gpu", pledge=pledge)
    pledged = msgspec.structs.replace(_waiting("deny", size=1), state="pledged", ranks=(rank,))
    running = _member(0, gates=())
    assert not records.restarted(pledged, [running])
    same_second = _member(0)  # the pledge was made at 2027-01-15T08:00:00.0Z
    same_second["metadata"]["creationTimestamp"] = "2027-01-15T08:00:00Z"
    assert not records.restarted(pledged, [same_second])  # may be the rank itself
    replaced = _member(0)  # same name, created later: a StatefulSet's replacement
    replaced["metadata"]["creationTimestamp"] = "2027-01-15T08:00:05Z"
    assert records.restarted(pledged, [replaced])
    stranger = _member(7)  # no rank of the pledge, behind HCS's gate
    assert records.restarted(pledged, [stranger])
    again = records.reset(records.resumed(pledged, "s3://c/900"))
    assert (again.state, again.ranks, again.resume_from, again.group) == ("pinned", (), None, "")


# ------------------------------------------------------- on nats-server --


async def test_a_pledged_gang_whose_members_were_replaced_waits_again_and_is_pledged_whole(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    await _pins(kv, state, records.Records()).place(_request(0))
    kube = FakeKube([_member(i) for i in range(4)])
    known = records.Records()
    entry = await kv.get(records.key_of_run(GANGS_RUN))
    known.apply(entry.key, entry.value, entry.revision)
    loop = _loop(kube, kv, state, known)
    assert await loop.once() == 1
    first = await _record(kv)
    assert first is not None and first.state == "pledged"
    # the healer evicted every rank; the Job made four new ones, behind the gate again
    kube.pods = {p["metadata"]["name"]: p for p in (_member(i + 10) for i in range(4))}
    for pod in kube.pods.values():
        pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] = str(
            int(pod["metadata"]["name"].split("-")[1]) - 10
        )
    kube.patched.clear()
    assert await loop.once() == 0  # reset: pinned again, no ranks
    waiting = await _record(kv)
    assert waiting is not None and waiting.state == "pinned" and waiting.ranks == ()
    assert await loop.once() == 1  # the new members pledged whole
    second = await _record(kv)
    assert second is not None and second.state == "pledged"
    assert sorted(r.pod for r in second.ranks) == [f"train-{i + 10}" for i in range(4)]
    assert sorted(n for n, _ in kube.patched) == sorted(kube.pods)


def _gang_pod(api: ApiServer, i: int) -> str:
    resources = {"limits": {"ai.compute/devices": "1"}, "requests": {"ai.compute/devices": "1"}}
    notes = {"hcs.io/plan": json.dumps(A100_WHOLE), vocabulary.GANG: RUN}
    api.add_pod(
        NS,
        f"train-{i}",
        phase="Pending",
        scheduler_name=SCHED,
        annotations=notes,
        resources=resources,
    )

    def gang(pod: dict[str, Any]) -> None:
        pod["metadata"]["ownerReferences"] = [{**JOB, "controller": True}]
        pod["spec"]["schedulingGates"] = [{"name": records.GATE}]

    api.update_pod(NS, f"train-{i}", gang)
    return str(api.pods[(NS, f"train-{i}")]["metadata"]["uid"])


async def _waiting_gang(bus: Bus, api: ApiServer, substitution: str) -> None:
    await _fill_a100(bus, api)
    kv = await bus.js.key_value(streams.KV_ALLOC)
    record = msgspec.structs.replace(_waiting(substitution), time_s=1.0)
    await kv.put(record.key, records.ENCODER.encode(record))
    for i in range(4):
        _gang_pod(api, i)


async def test_a_waiting_gang_on_a_full_class_is_moved_whole_and_every_member_evicted(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _waiting_gang(bus, apiserver, "allow")
    sched = await _start(bus, start_scheduler, kube)
    await until(lambda: not any((NS, f"train-{i}") in apiserver.pods for i in range(4)))
    kv = await bus.js.key_value(streams.KV_ALLOC)
    stored = records.DECODER.decode((await kv.get(records.key_of_run(RUN))).value)
    assert (stored.vendor, stored.model, stored.state) == ("huawei", "Ascend910B2", "pinned")
    evicted = sorted(
        r.path.split("/")[-2] for r in apiserver.requests if r.resource == "pods/eviction"
    )
    assert evicted == [f"train-{i}" for i in range(4)]  # each once
    await _scans(sched, 3)
    assert len([r for r in apiserver.requests if r.resource == "pods/eviction"]) == 4


async def test_a_waiting_gang_under_substitution_deny_is_not_moved_nor_any_rank_alone(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _waiting_gang(bus, apiserver, "deny")
    sched = await _start(bus, start_scheduler, kube)
    await until(lambda: sched.view.ready.is_set())
    await _scans(sched, 12)  # well past replan_after_s
    assert all((NS, f"train-{i}") in apiserver.pods for i in range(4))
    assert not [r for r in apiserver.requests if r.resource == "pods/eviction"]
    kv = await bus.js.key_value(streams.KV_ALLOC)
    stored = records.DECODER.decode((await kv.get(records.key_of_run(RUN))).value)
    assert (stored.vendor, stored.model) == ("nvidia", "A100-80G")


async def test_every_rank_of_a_gang_binds_with_the_resume_point_the_first_rank_recorded(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await start_scheduler(bus, None, http=False)
    kv = await bus.js.key_value(streams.KV_ALLOC)
    ckpt = await bus.js.key_value(streams.KV_CKPT)
    pledge = Pledge(id="p", vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=81920)
    ranks = tuple(records.RankPledge(pod=f"train-{i}", node="gpu", pledge=pledge) for i in range(4))
    record = msgspec.structs.replace(_waiting("deny"), state="pledged", ranks=ranks)
    await kv.put(record.key, records.ENCODER.encode(record))

    async def saved(step: int) -> None:
        event = CheckpointEvent(
            namespace=NS, job="train", uri=f"s3://c/{step}", step=step, time_s=1.0, run="uid-1"
        )
        await ckpt.put(subjects.ckpt_key(NS, "train", "uid-1"), messages.encode(event))

    def rank(i: int) -> PodInfo:
        return PodInfo(
            ref=PodRef(namespace=NS, name=f"train-{i}", uid=f"u{i}"),
            requests=None,
            policy=Policy(job="train"),
            annotation=None,
            priority=0,
            job="train",
            run="uid-1",
        )

    await saved(900)
    points = [await sched.booker._resume_from(rank(0))]
    await saved(950)  # a late save of an old rank, after the first new rank bound
    points += [await sched.booker._resume_from(rank(i)) for i in range(1, 4)]
    assert points == ["s3://c/900"] * 4
    stored = records.DECODER.decode((await kv.get(record.key)).value)
    assert stored.resume_from == "s3://c/900"
    alone = msgspec.structs.replace(rank(0), job="solo")  # a pod of no gang reads its own
    await ckpt.put(
        subjects.ckpt_key(NS, "solo", "uid-1"),
        messages.encode(
            CheckpointEvent(
                namespace=NS, job="solo", uri="s3://s/1", step=1, time_s=1.0, run="uid-1"
            )
        ),
    )
    assert await sched.booker._resume_from(alone) == "s3://s/1"


async def test_preempt_never_proposes_part_of_a_pledged_gang(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    base = Pledge(id="p", vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=81920)
    names = [f"low-{i}" for i in range(7)] + ["low-elsewhere"]  # one rank on another node
    record = records.GangRecord(
        namespace="batch",
        job="low",
        run="r1",
        size=len(names),
        vendor="nvidia",
        model="A100-80G",
        state="pledged",
        ranks=tuple(
            records.RankPledge(
                pod=n,
                node="gpu-node-a" if n == "low-elsewhere" else "gpu-node-b",
                pledge=msgspec.structs.replace(base, id=f"p-{n}"),
            )
            for n in names
        ),
    )
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(record.key, records.ENCODER.encode(record))
    pledger = sched.planner.pledger
    await until(lambda: pledger.gangs.get(record.key) is not None)
    args = k8s_doc("extender-preempt-args-nodecache.json")
    args["Pod"] = pod_doc("trainer", plan=A100_TWO, priority=100)
    args["NodeNameToMetaVictims"] = {"gpu-node-b": {"Pods": [], "NumPDBViolations": 0}}
    status, out = await _post(sched.port, "preempt", args)
    assert status == 200 and out["NodeNameToMetaVictims"] == {}  # only gang ranks hold devices
    chosen = {"Pods": [{"UID": "uid-low-0"}], "NumPDBViolations": 0}  # kube-scheduler's pick
    args["NodeNameToMetaVictims"] = {"gpu-node-b": chosen}
    status, out = await _post(sched.port, "preempt", args)
    assert status == 200 and out["NodeNameToMetaVictims"] == {}  # one rank of eight: never
    await kv.delete(record.key)
    await until(lambda: pledger.gangs.get(record.key) is None)
    status, out = await _post(sched.port, "preempt", args)
    assert [p["UID"] for p in out["NodeNameToMetaVictims"]["gpu-node-b"]["Pods"]] == ["uid-low-0"]
