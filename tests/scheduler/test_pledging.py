"""Pledges in KV ``hcs_alloc`` on a real nats-server: made by the plan service
for non-dry-run plans, counted by every replica's plans and quota verdicts,
spent at bind (single use), released and swept."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest

from hcs_bus import kvkeys, streams
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import PlanRequest, PodRef, Policy, Requests
from hcs_bus.settings import BusSettings
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger import release_loop as watching
from scheduler.ledger.pledge_store import Pledger
from scheduler.plan import rules as planning
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.plan.service import ask_plan
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_TWO, node_fp, pod_info, publish_fleet, until

NODES = ("gpu-0", "gpu-1")
WHOLE = PlanAnnotation(**{**A100_TWO, "devices": 1})  # one whole A100-80G


def _quota_file(tmp_path: Path, *, gib: int) -> str:
    path = tmp_path / "quotas.yaml"
    path.write_text(f"namespaces:\n  ml: {{vram: {gib}Gi}}\n")
    return str(path)


def _request(i: int, *, dry_run: bool = False) -> PlanRequest:
    return PlanRequest(
        namespace="ml",
        requests=Requests(devices=1),
        policy=Policy(),
        pod_name=f"p{i}",
        dry_run=dry_run,
        admission_uid="" if dry_run else f"admission-{i}",
    )


def _pod(name: str, *, pledge: str, uid: str | None = None) -> PodInfo:
    return pod_info(name, uid=uid, annotation=WHOLE, pledge=pledge)


async def _doc(bus: Bus) -> pledges.NamespacePledges | None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    entry = await kv.get(pledges.key_for("ml"))
    return msgspec.json.decode(entry.value or b"", type=pledges.NamespacePledges)


async def _stored(bus: Bus) -> list[pledges.Pledge]:
    """Every pledge of namespace ml in KV: its document's and its own keys'."""
    out: list[pledges.Pledge] = []
    for key, value in await kvkeys.stored_values(
        bus, streams.KV_ALLOC, wanted=pledges.is_pledge_key
    ):
        ns, pledge_id = pledges.parse_key(key)
        if ns != "ml":
            continue
        if pledge_id:
            out.append(msgspec.json.decode(value, type=pledges.Pledge))
        else:
            out.extend(msgspec.json.decode(value, type=pledges.NamespacePledges).pledges)
    return out


async def test_twenty_plans_at_once_on_two_replicas_pledge_exactly_the_quota(
    bus: Bus, bus_settings: BusSettings, start_scheduler: Start, tmp_path: Path
) -> None:
    await publish_fleet(bus, *(node_fp(n) for n in NODES))
    quota = _quota_file(tmp_path, gib=2 * 80)
    buses = [await connect(bus_settings, name=f"replica-{i}") for i in range(2)]
    replicas = []
    try:
        replicas = [await start_scheduler(b, http=False, quota_file=quota) for b in buses]
        for r in replicas:
            await until(lambda r=r: len(r.view.state.nodes) == len(NODES))
        plans = await asyncio.gather(
            *(ask_plan(bus, _request(i), timeout_s=5.0) for i in range(20))
        )
        dry = await ask_plan(bus, _request(99, dry_run=True), timeout_s=5.0)

        def known(r: object) -> int:
            held = r.planner.pledger.docs.get("ml")  # type: ignore[attr-defined]
            return len(held.doc.pledges) if held is not None and held.doc is not None else 0

        # each replica's view follows the other's pledges (KV watch)
        await until(lambda: all(known(r) == 2 for r in replicas))
    finally:
        for r in replicas:
            await r.stop()
        for b in buses:
            await b.nc.close()
    admitted = [p for p in plans if p.ok]
    assert len(admitted) == 2, [p.reason for p in plans]
    assert all(p.pledge for p in admitted) and len({p.pledge for p in admitted}) == 2
    assert all("quota of namespace ml exceeded" in p.reason for p in plans if not p.ok)
    doc = await _doc(bus)
    assert doc is not None and {p.id for p in doc.pledges} == {p.pledge for p in admitted}
    assert {p.name for p in doc.pledges} <= {f"p{i}" for i in range(20)}
    # a dry run records nothing and is refused by the same count
    assert not dry.ok and not dry.pledge


async def test_bind_spends_the_pledge_once_and_a_copied_pledge_is_replanned_against_the_quota(
    bus: Bus, start_scheduler: Start, tmp_path: Path
) -> None:
    await publish_fleet(bus, node_fp("gpu-0"))
    sched = await start_scheduler(bus, http=False, quota_file=_quota_file(tmp_path, gib=80))
    await until(lambda: "gpu-0" in sched.view.state.nodes)
    plan = await sched.planner.place(_request(1))
    assert plan.ok and plan.pledge, plan.reason
    assert await sched.booker.bind(_pod("p1", pledge=plan.pledge), WHOLE, node="gpu-0") in (
        "",
        "no cluster: Binding not posted",
    )
    held = (await sched.booker.read("gpu-0")).doc
    assert held is not None and [r.pledge for r in held.reservations] == [plan.pledge]
    # another pod presenting the same pledge (a copied plan note): re-planned,
    # and the quota (80 GiB, held by p1) refuses it with the reason
    error = await sched.booker.bind(_pod("p2", pledge=plan.pledge), WHOLE, node="gpu-0")
    assert f"pledge {plan.pledge} was already used by pod p1" in error
    assert "quota of namespace ml exceeded" in error
    held = (await sched.booker.read("gpu-0")).doc
    assert held is not None and [r.pod.name for r in held.reservations] == ["p1"]
    # p1's bind retried: its own pledge again, no second reservation
    await sched.booker.bind(_pod("p1", pledge=plan.pledge), WHOLE, node="gpu-0")
    held = (await sched.booker.read("gpu-0")).doc
    assert held is not None and len(held.reservations) == 1


async def test_a_pod_deleted_before_bind_gives_its_pledge_back(
    bus: Bus, start_scheduler: Start, tmp_path: Path
) -> None:
    await publish_fleet(bus, node_fp("gpu-0"))
    sched = await start_scheduler(bus, http=False, quota_file=_quota_file(tmp_path, gib=80))
    await until(lambda: "gpu-0" in sched.view.state.nodes)
    first = await sched.planner.place(_request(1))
    assert first.ok
    refused = await sched.planner.place(_request(2))
    assert not refused.ok and "quota" in refused.reason
    pod = {
        "metadata": {
            "namespace": "ml",
            "name": "p1",
            "uid": "u1",
            "annotations": {"hcs.io/pledge": first.pledge},
        }
    }
    await watching.on_pod_event(sched.booker, "DELETED", pod)
    doc = await _doc(bus)
    assert doc is not None and doc.pledges == ()
    again = await sched.planner.place(_request(2))
    assert again.ok, again.reason


@pytest.mark.parametrize("quoted", [True, False], ids=["document", "own-keys"])
async def test_pledges_never_bound_expire_and_spent_ones_go_once_their_reservation_is_seen(
    bus: Bus, quoted: bool
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    now = [1000.0]
    reserved: set[str] = set()

    def summary() -> planning.Summary:
        return planning.Summary(classes={}, usage={}, pledge_ids=frozenset(reserved))

    book = Pledger(kv=kv, summary=summary, clock=lambda: now[0], ttl_s=60.0, grace_s=5.0)

    async def plan(request: PlanRequest, _summary: planning.Summary) -> object:
        from hcs_bus.messages import Plan

        return Plan(ok=True, vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=1)

    a = await book.place(_request(1), plan, quoted=quoted)  # type: ignore[arg-type]
    b = await book.place(_request(2), plan, quoted=quoted)  # type: ignore[arg-type]
    assert {p.id for p in await _stored(bus)} == {a.pledge, b.pledge}
    error, spent = await book.spend(
        PodRef(namespace="ml", name="p2", uid="u2"), b.pledge, sizing=WHOLE, quota=None
    )
    assert (error, spent) == ("", b.pledge)
    now[0] += 30.0
    assert await book.sweep() == 0  # p1 not expired yet; p2's reservation not seen
    reserved.add(b.pledge)
    assert await book.sweep() == 1  # p2 done
    now[0] += 31.0
    assert await book.sweep() == 1  # p1 expired
    assert await _stored(bus) == []
    assert a.pledge != b.pledge


async def test_compute_quota_status_used_counts_reservations_and_pledges(
    bus: Bus, start_scheduler: Start
) -> None:
    from scheduler.quota.source import UsedWriter, used_by_namespace
    from tests.scheduler.helpers import FakeKube

    kube = FakeKube()
    kube.quotas["ml"] = [{"metadata": {"name": "team"}, "spec": {"hard": {"vram": "160Gi"}}}]
    await publish_fleet(bus, node_fp("gpu-0"))
    sched = await start_scheduler(bus, kube, http=False)
    await until(lambda: "gpu-0" in sched.view.state.nodes)
    first = await sched.planner.place(_request(1))
    second = await sched.planner.place(_request(2))
    assert first.ok and second.ok
    await sched.booker.bind(_pod("p1", pledge=first.pledge), WHOLE, node="gpu-0")
    pledger = sched.planner.pledger
    assert pledger is not None

    def used() -> dict:  # as the replica writes it: the planner's parts, told of every change
        return used_by_namespace(sched.planner.usage(), pledger.by_namespace(fresh=True))

    # p1 bound (its pledge spent, its reservation in the view), p2 pledged only
    await until(lambda: used().get("ml") is not None and used()["ml"].pledges == 1)
    writer = UsedWriter(kube=kube, quotas=sched.planner.quotas, used=used)
    assert await writer.write() == 1
    assert kube.quotas["ml"][0]["status"]["used"] == {
        "vram": "160Gi",
        "acu": 200.0,
        "devices": 2,
        "pledges": 1,
    }
    assert await writer.write() == 0  # unchanged: not written again


@pytest.mark.parametrize("quoted", [True, False], ids=["document", "own-keys"])
async def test_a_pledge_no_pod_carries_is_dropped_as_an_orphan_once_old_enough(
    bus: Bus, quoted: bool
) -> None:
    """The admission was answered but the pod never came to be (another
    webhook refused it): nothing would spend its pledge before the TTL."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    now = [1000.0]
    carried: list[str] = []

    listed: list[float] = []

    async def pods(namespace: str) -> list[dict]:
        assert namespace == "ml"
        listed.append(now[0])
        return [{"metadata": {"name": "p1", "annotations": {"hcs.io/pledge": c}}} for c in carried]

    def summary() -> planning.Summary:
        return planning.Summary(classes={}, usage={})

    book = Pledger(
        kv=kv, summary=summary, clock=lambda: now[0], ttl_s=600.0, pods=pods, orphan_after_s=30.0
    )

    async def plan(request: PlanRequest, _summary: planning.Summary) -> object:
        from hcs_bus.messages import Plan

        return Plan(ok=True, vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=1)

    kept = await book.place(_request(1), plan, quoted=quoted)  # type: ignore[arg-type]
    lost = await book.place(_request(2), plan, quoted=quoted)  # type: ignore[arg-type]
    carried.append(kept.pledge)
    assert await book.sweep() == 0  # too young to tell
    now[0] += 15.0
    late = await book.place(_request(3), plan, quoted=quoted)  # type: ignore[arg-type]
    now[0] += 16.0
    assert await book.sweep() == 1
    assert {p.id for p in await _stored(bus)} == {kept.pledge, late.pledge}
    assert lost.pledge != kept.pledge
    # the late one is old enough 15 s on, but the pods were listed lately:
    # listed again (and it dropped) only once the window has passed
    now[0] += 15.0
    assert await book.sweep() == 0 and listed == [1031.0]
    now[0] += 15.0
    assert await book.sweep() == 1 and listed == [1031.0, 1061.0]
    assert [p.id for p in await _stored(bus)] == [kept.pledge]


async def test_without_a_quota_each_pledge_is_its_own_key_a_burst_spreads_and_bind_writes_none(
    bus: Bus, start_scheduler: Start
) -> None:
    """No quota to serialize against: a burst writes one small key per pledge
    (never a growing document), still counted by the next plan at once."""
    await publish_fleet(
        bus, node_fp("gpu-0", count=2), node_fp("gpu-1", "nvidia/H100-SXM", count=2)
    )
    sched = await start_scheduler(bus, http=False)
    await until(lambda: len(sched.view.state.nodes) == 2)
    plans = await asyncio.gather(*(sched.planner.place(_request(i)) for i in range(5)))
    ok = [p for p in plans if p.ok]
    placed = [p for p in ok if "waits for devices" not in p.reason]
    assert sorted(p.model for p in placed) == ["A100-80G", "A100-80G", "H100-SXM", "H100-SXM"]
    assert len(ok) == 5 and "waits for devices" in plans[4].reason  # every device pledged
    stored = await kvkeys.stored_keys(bus, streams.KV_ALLOC)
    keys = [k for k in stored if pledges.is_pledge_key(k)]
    assert sorted(keys) == sorted(pledges.key_for("ml", p.pledge) for p in ok)
    assert {p.id for p in await _stored(bus)} == {p.pledge for p in ok}
    pledger = sched.planner.pledger
    assert pledger is not None
    first, second = ok[0], ok[1]
    p1 = PodRef(namespace="ml", name="p0", uid="u1")
    # no quota: bind writes nothing (the reservation carries the id and
    # retires the pledge); a copy is held to nothing but bind's CAS
    copy = PodRef(namespace="ml", name="intruder", uid="u9")
    for ref in (p1, p1, copy):
        assert await pledger.spend(ref, first.pledge, sizing=WHOLE, quota=None) == (
            "",
            first.pledge,
        )
    held = {p.id: p for p in await _stored(bus)}
    assert held[first.pledge].spent_s is None and not held[first.pledge].uid
    # the pod of the second plan deleted before bind: its key goes
    assert await pledger.release("ml", second.pledge, reason="pod deleted")
    assert second.pledge not in {p.id for p in await _stored(bus)}
    assert pledger.by_namespace(fresh=True)["ml"][1] == 4


@pytest.mark.parametrize(("placement", "classes"), [("pack", 2), ("spread", 3)])
async def test_a_burst_of_plans_fills_the_cheapest_class_under_pack_and_goes_over_all_under_spread(
    bus: Bus, start_scheduler: Start, placement: str, classes: int
) -> None:
    """12 slices of 16 GiB at once on 3 classes of 2 devices (10, 10 and 8
    slices): each plan counts the pledges of those before it."""
    await publish_fleet(
        bus,
        node_fp("gpu-0", count=2),
        node_fp("gpu-1", "nvidia/H100-SXM", count=2),
        node_fp("npu-0", "huawei/Ascend910B2", count=2),
    )
    sched = await start_scheduler(bus, http=False, placement=placement)
    await until(lambda: len(sched.view.state.nodes) == 3)
    requests = [
        PlanRequest(namespace="ml", requests=Requests(vram_mib=16384), pod_name=f"s{i}")
        for i in range(12)
    ]
    plans = await asyncio.gather(*(sched.planner.place(r) for r in requests))
    assert all(p.ok and "waits" not in p.reason for p in plans), [p.reason for p in plans]
    per_class: dict[str, int] = {}
    for p in plans:
        per_class[p.model] = per_class.get(p.model, 0) + 1
    assert len(per_class) == classes, per_class
    if placement == "spread":
        assert max(per_class.values()) <= 5, per_class
    assert len({p.pledge for p in plans}) == 12  # each pledged, once


async def test_pledges_of_admissions_whose_pods_never_appear_stop_holding_the_quota_in_seconds(
    bus: Bus, start_scheduler: Start, tmp_path: Path
) -> None:
    """Admissions answered for pods that never came to be (another webhook
    refused them, the client gave up) hold a namespace's quota only until
    ``pledge_unclaimed_s`` has passed with no pod carrying their pledge."""
    await publish_fleet(bus, node_fp("gpu-0", count=8))
    sched = await start_scheduler(
        bus, http=False, quota_file=_quota_file(tmp_path, gib=80), pledge_unclaimed_s=10.0
    )
    await until(lambda: "gpu-0" in sched.view.state.nodes)
    pledger = sched.planner.pledger
    assert pledger is not None and pledger.orphan_after_s == 10.0
    now = [pledger.clock()]
    pledger.clock = lambda: now[0]
    carried: list[str] = []

    async def pods(namespace: str) -> list[dict]:
        notes = [{"hcs.io/pledge": c} for c in carried]
        return [{"metadata": {"name": f"p{i}", "annotations": a}} for i, a in enumerate(notes)]

    pledger.pods = pods
    ghost = await sched.planner.place(_request(1))  # 80 GiB: the whole quota
    assert ghost.ok and ghost.pledge, ghost.reason
    refused = await sched.planner.place(_request(2))
    assert not refused.ok and "quota" in refused.reason, refused.reason
    assert await pledger.sweep() == 0  # inside the window: its pod may still come
    now[0] += 10.5
    assert await pledger.sweep() == 1  # no pod carries it: gone
    admitted = await sched.planner.place(_request(3))
    assert admitted.ok and admitted.pledge, admitted.reason
    carried.append(admitted.pledge)  # this one's pod exists: kept past the window
    now[0] += 30.0
    assert await pledger.sweep() == 0
    assert [p.id for p in await _stored(bus)] == [admitted.pledge]


async def test_a_plan_that_pledges_without_naming_its_admission_and_pod_is_refused_unwritten(
    bus: Bus, start_scheduler: Start, tmp_path: Path
) -> None:
    await publish_fleet(bus, node_fp("gpu-0"))
    sched = await start_scheduler(bus, http=False, quota_file=_quota_file(tmp_path, gib=80))
    await until(lambda: "gpu-0" in sched.view.state.nodes)
    anonymous = msgspec.structs.replace(_request(1), admission_uid="")
    nameless = msgspec.structs.replace(_request(2), pod_name="")
    for request in (anonymous, nameless):
        plan = await ask_plan(bus, request, timeout_s=5.0)
        assert not plan.ok and "must name its admission" in plan.reason, plan.reason
    assert await _stored(bus) == []
    named = await ask_plan(bus, _request(3), timeout_s=5.0)
    assert named.ok and named.pledge, named.reason
    assert [p.admission for p in await _stored(bus)] == ["admission-3"]


async def test_a_gang_ranks_pledge_is_spent_at_bind_under_a_quota_without_a_second_pledge(
    bus: Bus,
) -> None:
    """The gang loop pledged the rank under the quota already: its bind takes
    that pledge (the reservation carries its id) instead of re-planning a
    fresh one that would count the rank twice."""
    from scheduler.plan import gang_records

    kv = await bus.js.key_value(streams.KV_ALLOC)
    book = Pledger(kv=kv, summary=lambda: planning.Summary(classes={}, usage={}), ttl_s=600.0)
    rank = pledges.Pledge(
        id="rank-0",
        vendor="nvidia",
        model="A100-80G",
        devices=1,
        vram_mib_per_device=81920,
        whole_device=True,
        name="train-0",
    )
    record = gang_records.GangRecord(
        namespace="ml",
        job="train",
        run="u1",
        size=1,
        vendor="nvidia",
        model="A100-80G",
        state="pledged",
        ranks=(gang_records.RankPledge(pod="train-0", node="gpu-0", pledge=rank),),
    )
    book.apply(record.key, msgspec.json.encode(record), 1)
    sizing = WHOLE  # one whole A100-80G, as the rank's plan note says
    quota = planning.QuotaLimits(vram_mib=81920)
    mine = PodRef(namespace="ml", name="train-0", uid="u-0")
    assert await book.spend(mine, "rank-0", sizing=sizing, quota=quota) == ("", "rank-0")
    assert await _stored(bus) == []  # nothing written: the record holds it
    copied = PodRef(namespace="ml", name="intruder", uid="u-9")
    refusal, _ = await book.spend(copied, "rank-0", sizing=sizing, quota=quota)
    assert "quota of namespace ml exceeded" in refusal  # the rank holds the quota
