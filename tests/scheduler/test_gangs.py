"""Gang records in KV ``hcs_alloc`` on a real nats-server: the class pinned
by the first member at admission, the whole gang pledged in one
compare-and-set by the gang loop (of two racing replicas, exactly one), the
rank pledges counted by planning, the record gone with its pods."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from hcs_bus import streams, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.errors import KubeInvalid
from hcs_bus.messages import DeviceSlice, Plan, PlanRequest, PodRef, Policy, Requests
from scheduler.ledger.pledge_rules import Pledge
from scheduler.ledger.pledge_store import Pledger
from scheduler.plan import gang_records as records
from scheduler.plan import rules as planning
from scheduler.plan.gang_loop import GangLoop
from scheduler.plan.gang_service import GangPins
from scheduler.plan.service import Planner
from scheduler.quota.source import QuotaSource
from scheduler.view.state import ClusterState
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_TWO, A100_WHOLE, DB, until
from tests.scheduler.helpers import pod as pod_doc
from tests.scheduler.test_extender import _args, _post, _ready
from tests.scheduler.test_gang_rules import A100, ASCEND, fleet, occupy

RUN = "ns1/train/uid-1"


def _request(i: int, *, size: int = 4, devices: int = 1) -> PlanRequest:
    return PlanRequest(
        namespace="ns1",
        requests=Requests(devices=devices),
        pod_name=f"train-{i}",
        admission_uid=f"adm-{i}",
        gang_key=RUN,
        gang_size=size,
    )


def _pins(kv: Any, state: ClusterState, known: records.Records) -> GangPins:
    planner = Planner(state, profiles=DB, quotas=QuotaSource(kube=None, file=None))

    async def plan(request: PlanRequest) -> Plan:
        return await planner.plan(request)

    return GangPins(kv=kv, state=state, profiles=DB, known=known, held=dict, plan=plan)


def _member(i: int, *, gates: tuple[str, ...] = (records.GATE,)) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"train-{i}",
            "namespace": "ns1",
            "uid": f"u{i}",
            "annotations": {
                vocabulary.GANG: RUN,
                vocabulary.GANG_SIZE: "4",
                "batch.kubernetes.io/job-completion-index": str(i),
            },
        },
        "spec": {"schedulingGates": [{"name": g} for g in gates]},
        "status": {"phase": "Pending"},
    }


class FakeKube:
    """The pods of one gang; patches apply the JSON patch's gate removal."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.patched: list[tuple[str, list[dict[str, Any]]]] = []
        self.events: list[dict[str, Any]] = []

    async def list_pods(self, **_kw: Any) -> list[dict[str, Any]]:
        return list(self.pods.values())

    async def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> Any:
        pod = self.pods[name]
        gates = pod["spec"]["schedulingGates"]
        for op in ops:
            if op["op"] == "test" and gates[int(op["path"].split("/")[3])]["name"] != op["value"]:
                raise KubeInvalid(f"test failed on {name}")
        await asyncio.sleep(0)
        self.patched.append((name, ops))
        pod["spec"]["schedulingGates"] = [g for g in gates if g["name"] != records.GATE]
        pod["metadata"]["annotations"][vocabulary.PLEDGE] = ops[-1]["value"]
        return pod

    async def create_event(self, namespace: str, body: dict[str, Any]) -> Any:
        self.events.append(body)
        return body


def _loop(kube: FakeKube, kv: Any, state: ClusterState, known: records.Records) -> GangLoop:
    return GangLoop(
        kube=kube,
        kv=kv,
        state=state,
        known=known,
        held=dict,
        reserved=frozenset,
        profiles=DB,
        scheduler_name="hcs",
    )


async def _record(kv: Any) -> records.GangRecord | None:
    entry = await kv.get(records.key_of_run(RUN))
    return records.DECODER.decode(entry.value) if entry.value else None


async def test_racing_members_on_two_replicas_all_get_the_one_class_the_first_pinned(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))
    pins = [_pins(kv, state, records.Records()) for _ in range(2)]
    plans = await asyncio.gather(*(pins[i % 2].place(_request(i)) for i in range(8)))
    assert all(p.ok for p in plans), [p.reason for p in plans]
    assert len({(p.vendor, p.model) for p in plans}) == 1
    assert all(p.pledge == "" for p in plans)
    stored = await _record(kv)
    assert stored is not None and stored.state == "pinned"
    assert (stored.vendor, stored.model) == (plans[0].vendor, plans[0].model)


async def test_a_gang_larger_than_the_fleet_is_refused_and_nothing_is_written(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    plan = await _pins(kv, state, records.Records()).place(_request(0, size=12))
    assert not plan.ok
    assert "can never fit" in plan.reason
    assert await _record_or_none(kv) is None


async def test_a_member_whose_size_disagrees_with_the_first_is_refused_by_name(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    pins = _pins(kv, state, records.Records())
    assert (await pins.place(_request(0, size=4))).ok
    refused = await pins.place(_request(1, size=6))
    assert not refused.ok
    assert "6 members" in refused.reason and "said 4" in refused.reason
    asks_more = await pins.place(_request(2, size=4, devices=2))
    assert not asks_more.ok and "asks differently" in asks_more.reason


async def _record_or_none(kv: Any) -> records.GangRecord | None:
    try:
        return await _record(kv)
    except Exception:  # KeyNotFoundError: never written
        return None


async def test_two_gang_loops_racing_pledge_the_gang_exactly_once(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    await _pins(kv, state, records.Records()).place(_request(0))
    kube = FakeKube([_member(i) for i in range(4)])
    loops = []
    for _ in range(2):
        known = records.Records()
        entry = await kv.get(records.key_of_run(RUN))
        known.apply(entry.key, entry.value, entry.revision)
        loops.append(_loop(kube, kv, state, known))
    won = await asyncio.gather(*(loop.once() for loop in loops))
    assert sorted(won) == [0, 1]
    stored = await _record(kv)
    assert stored is not None and stored.state == "pledged"
    assert sorted(r.pod for r in stored.ranks) == [f"train-{i}" for i in range(4)]
    assert {r.node for r in stored.ranks} == {"gpu"}
    assert len({r.pledge.id for r in stored.ranks}) == 4
    assert sorted(name for name, _ in kube.patched) == [f"train-{i}" for i in range(4)]
    for rank in stored.ranks:
        pod = kube.pods[rank.pod]
        assert pod["metadata"]["annotations"][vocabulary.PLEDGE] == rank.pledge.id
        assert records.gates_of(pod) == []


async def test_a_gang_that_does_not_fit_holds_nothing_and_its_members_are_told_why(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    occupy(state, "gpu", [(0, 81920, True)])
    assert (await _pins(kv, state, records.Records()).place(_request(0, devices=2))).ok
    kube = FakeKube([_member(i) for i in range(4)])
    known = records.Records()
    entry = await kv.get(records.key_of_run(RUN))
    known.apply(entry.key, entry.value, entry.revision)
    assert await _loop(kube, kv, state, known).once() == 0
    stored = await _record(kv)
    assert stored is not None and stored.state == "pinned" and stored.ranks == ()
    assert kube.patched == []
    assert {e["reason"] for e in kube.events} == {"GangWaiting"}
    assert len(kube.events) == 4
    assert "needs 8 devices" in kube.events[0]["message"]


async def test_a_member_behind_a_foreign_gate_keeps_the_gang_unplanned(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    await _pins(kv, state, records.Records()).place(_request(0))
    foreign = "kueue.x-k8s.io/admission"
    kube = FakeKube([_member(i, gates=(foreign, records.GATE)) for i in range(4)])
    known = records.Records()
    entry = await kv.get(records.key_of_run(RUN))
    known.apply(entry.key, entry.value, entry.revision)
    loop = _loop(kube, kv, state, known)
    assert await loop.once() == 0
    assert foreign in kube.events[0]["message"]
    for pod in kube.pods.values():
        pod["spec"]["schedulingGates"] = [{"name": records.GATE}]
    assert await loop.once() == 1


async def test_pledged_rank_pledges_count_in_planning_until_their_pods_hold_devices(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    await _pins(kv, state, records.Records()).place(_request(0))
    kube = FakeKube([_member(i) for i in range(4)])
    known = records.Records()
    entry = await kv.get(records.key_of_run(RUN))
    known.apply(entry.key, entry.value, entry.revision)
    assert await _loop(kube, kv, state, known).once() == 1
    entry = await kv.get(records.key_of_run(RUN))
    pledger = Pledger(kv=kv, summary=lambda: planning.summarise(state.schedulable()))
    pledger.apply(entry.key, entry.value, entry.revision)
    charged = pledger.charged(planning.summarise(state.schedulable()))
    assert charged.classes["nvidia/A100-80G"].pledged.whole_devices == 4
    assert pledger.by_namespace(fresh=True)["ns1"][1] == 4


async def test_the_record_of_a_gang_whose_pods_are_gone_is_deleted(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"))
    await _pins(kv, state, records.Records()).place(_request(0))
    kube = FakeKube([_member(i) for i in range(4)])
    known = records.Records()
    entry = await kv.get(records.key_of_run(RUN))
    known.apply(entry.key, entry.value, entry.revision)
    loop = _loop(kube, kv, state, known)
    assert await loop.once() == 1
    for pod in kube.pods.values():
        pod["status"]["phase"] = "Succeeded"
    await loop.once()
    assert await _record_or_none(kv) is None


async def test_the_extender_keeps_a_pledged_rank_on_its_node_and_other_pods_off_its_devices(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    ranks = tuple(
        records.RankPledge(
            pod=f"g-{i}",
            node="gpu-node-a",
            pledge=Pledge(
                id=f"p{i}",
                vendor="nvidia",
                model="A100-80G",
                devices=1,
                vram_mib_per_device=81920,
                whole_device=True,
            ),
            devices=(DeviceSlice(index=i, uuid=f"GPU-a-{i}", vram_mib=81920, whole=True),),
        )
        for i in range(8)
    )
    record = records.GangRecord(
        namespace="ml-team",
        job="big",
        run="r1",
        size=8,
        vendor="nvidia",
        model="A100-80G",
        state="pledged",
        ranks=ranks,
    )
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(record.key, records.ENCODER.encode(record))
    pledger = sched.planner.pledger
    await until(lambda: pledger.gangs.get(record.key) is not None)

    member = _args("extender-filter-args-nodecache.json", plan=A100_WHOLE)
    member["Pod"] = pod_doc("g-3", plan=A100_WHOLE)
    member["Pod"]["metadata"]["annotations"][vocabulary.GANG] = "ml-team/big/r1"
    status, out = await _post(sched.port, "filter", member)
    assert status == 200, out
    assert out["NodeNames"] == ["gpu-node-a"]
    assert "planned this rank on gpu-node-a" in out["FailedNodes"]["gpu-node-c"]

    other = _args("extender-filter-args-nodecache.json", plan=A100_TWO)
    status, out = await _post(sched.port, "filter", other)
    assert status == 200, out
    assert out["NodeNames"] == ["gpu-node-c"]
    assert "pledged gang" in out["FailedNodes"]["gpu-node-a"]


def test_a_gang_pinned_but_not_yet_pledged_counts_against_the_next_gangs_pin() -> None:
    """A burst of gangs spreads over the classes: the second 8-rank gang does
    not pin the class the first is already waiting to fill."""
    from tests.scheduler.test_gang_rules import H100, gang

    state = fleet(("a100-0", A100, "g1"), ("h100-0", H100, "g1"))
    first = records.pin(state, gang(8, name="one"), held={}, profiles=DB)
    assert first.vendor == "nvidia" and first.model in ("A100-80G", "H100")
    waiting = records.GangRecord(
        namespace="ns1",
        job="one",
        size=8,
        vendor=first.vendor,
        model=first.model,
        requests=Requests(devices=1),
    )
    classes = planning.summarise(state.schedulable()).classes
    held = records.waiting_held([waiting], classes, DB)
    assert held[f"nvidia/{first.model}"].devices == 8
    second = records.pin(state, gang(8, name="two"), held=held, profiles=DB)
    assert {first.model, second.model} == {"A100-80G", "H100"}
    pledged = msgspec.structs.replace(waiting, state="pledged")
    assert records.waiting_held([pledged], classes, DB) == {}  # its pledges count instead


async def test_every_rank_of_a_pledged_gang_binds_with_the_jobs_one_set_of_collective_flags(
    bus: Bus,
) -> None:
    """Ranks configured differently fail to connect: the flags come from the
    whole job's placement, fixed on the gang's record when it is pledged and
    read by every rank's bind, whatever its own node's links."""
    from scheduler.ledger.reservation_store import Booker
    from scheduler.plan import gang_rules
    from scheduler.plan.pods import PodInfo
    from tests.scheduler.test_gang_rules import gang

    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu-a", A100, "g1"), ("gpu-b", A100, "g1"))
    plan = gang_rules.plan_gang(state, gang(16, name="train"), held={}, profiles=DB)
    assert plan.ok and {r.node for r in plan.ranks} == {"gpu-a", "gpu-b"}
    record = records.GangRecord(
        namespace="ns1", job="train", run="uid-1", size=16, vendor="nvidia", model="A100-80G"
    )
    names = {r.member: f"train-{i}" for i, r in enumerate(plan.ranks)}
    pledged = records.pledged(record, plan, pods=names, ids=(f"p{i}" for i in range(16)), now=1.0)
    assert pledged.flags == gang_rules.collective_flags(plan) and pledged.flags
    await kv.put(pledged.key, records.ENCODER.encode(pledged))
    booker = Booker(bus, kv=kv, ckpt=None, state=state, kube=None, replica="r1")
    seen = []
    for rank in pledged.ranks:
        member = PodInfo(
            ref=PodRef(namespace="ns1", name=rank.pod, uid=f"u-{rank.pod}"),
            requests=None,
            policy=Policy(job="train"),
            annotation=None,
            priority=0,
            job="train",
            run="uid-1",
            gang=True,
        )
        seen.append(await booker._gang_flags(member))
    assert all(flags == pledged.flags for flags in seen)
    alone = PodInfo(
        ref=PodRef(namespace="ns1", name="solo", uid="u-solo"),
        requests=None,
        policy=Policy(),
        annotation=None,
        priority=0,
        job=None,
    )
    assert await booker._gang_flags(alone) == {}
