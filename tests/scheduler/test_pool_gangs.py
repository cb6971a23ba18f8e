"""The shared pool in the gang loop, on a real nats-server (KV ``hcs_alloc``)
with a fake Kube: waiting gangs taken in the pool's queue order, ceilings
and borrowing holding gangs back with the reason, and reclaim taking back
the newest borrowed gangs (record reset in one compare-and-set, members
evicted, Events on both sides) for a namespace owed its guarantee."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError

from hcs_bus import kvkeys, plannotes, streams, subjects, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.errors import KubeNotFound
from hcs_bus.messages import Plan, PlanRequest, Policy, Requests, UsageAlert
from scheduler.plan import gang_records as records
from scheduler.plan.gang_loop import GangLoop
from scheduler.plan.gang_service import GangPins
from scheduler.plan.service import Planner
from scheduler.quota.source import QuotaSource
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import DB
from tests.scheduler.test_gang_rules import A100, ASCEND, fleet, occupy
from tests.scheduler.test_gangs import FakeKube

ALERTS = msgspec.json.Decoder(UsageAlert, strict=True)
ANY = Policy()
NOTE = plannotes.encode(
    plannotes.PlanNote(
        vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=81920, whole_device=True
    )
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class PoolKube(FakeKube):
    """Gang members of several gangs: an ungated member is bound (on
    ``gpu``); an eviction marks the member deleting, ``gone`` drops it."""

    def __init__(self) -> None:
        super().__init__([])
        self.evicted: list[str] = []

    async def patch_pod(self, namespace: str, name: str, ops: list[dict[str, Any]]) -> Any:
        pod = await super().patch_pod(namespace, name, ops)
        pod["spec"]["nodeName"] = "gpu"
        return pod

    async def evict_pod(
        self, namespace: str, name: str, *, dry_run: bool = False, uid: str | None = None
    ) -> Any:
        pod = self.pods.get(name)
        if pod is None or pod["metadata"].get("deletionTimestamp"):
            raise KubeNotFound(name)
        assert uid == pod["metadata"]["uid"]
        self.evicted.append(name)
        pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        return {}

    def gone(self) -> None:
        for name in [n for n, p in self.pods.items() if p["metadata"].get("deletionTimestamp")]:
            del self.pods[name]

    def told(self, reason: str) -> dict[str, str]:
        return {
            e["involvedObject"]["name"]: e["message"] for e in self.events if e["reason"] == reason
        }


def _pod(namespace: str, job: str, i: int, size: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{job}-{i}",
            "namespace": namespace,
            "uid": f"{namespace}-{job}-{i}",
            "annotations": {
                vocabulary.GANG: f"{namespace}/{job}/r1",
                vocabulary.GANG_SIZE: str(size),
                "batch.kubernetes.io/job-completion-index": str(i),
                vocabulary.PLAN: NOTE,
            },
        },
        "spec": {"schedulingGates": [{"name": records.GATE}]},
        "status": {"phase": "Pending"},
    }


class World:
    """One fleet, one KV, one fake Kube; gangs submitted through the gang
    pins (as admission does) and looked at by gang loops."""

    def __init__(self, bus: Bus, kv: Any, state: ClusterState, quotas: QuotaSource | None) -> None:
        self.bus, self.kv, self.state, self.quotas = bus, kv, state, quotas
        self.kube = PoolKube()
        self.clock = Clock()
        planner = Planner(state, profiles=DB, quotas=QuotaSource(kube=None, file=None))

        async def plan(request: PlanRequest) -> Plan:
            return await planner.plan(request)

        self.pins = GangPins(
            kv=kv,
            state=state,
            profiles=DB,
            known=records.Records(),
            held=dict,
            plan=plan,
            clock=self.clock,
            quotas=quotas,
        )

    async def submit(
        self, namespace: str, job: str, *, size: int, least: int = 0, policy: Policy = ANY
    ) -> None:
        """A gang of ``size`` members (elastic: ``least`` and up)."""
        self.clock.now += 1.0
        for i in range(size):
            plan = await self.pins.place(
                PlanRequest(
                    namespace=namespace,
                    requests=Requests(devices=1),
                    pod_name=f"{job}-{i}",
                    admission_uid=f"adm-{namespace}-{job}-{i}",
                    gang_key=f"{namespace}/{job}/r1",
                    gang_size=size,
                    gang_min=least,
                    policy=policy,
                )
            )
            assert plan.ok, plan.reason
            pod = _pod(namespace, job, i, size)
            self.kube.pods[pod["metadata"]["name"]] = pod

    async def gang_entries(self) -> list[Any]:
        """The gang records the ledger holds, each with its revision (the keys
        listed from the stream, ``hcs_bus.kvkeys``: a KV watch's "no more keys"
        can come before the last one)."""
        found = []
        for key in sorted(await kvkeys.stored_keys(self.bus, streams.KV_ALLOC)):
            if records.is_gang_key(key):
                with contextlib.suppress(KeyNotFoundError):  # deleted: its marker is stored
                    found.append(await self.kv.get(key))
        return found

    async def loop(
        self,
        *,
        reclaim_acu_per_min: float = float("inf"),
        checkpoint: Callable[[str, str, str], Awaitable[bool]] | None = None,
    ) -> GangLoop:
        known = records.Records()
        for entry in await self.gang_entries():
            known.apply(entry.key, entry.value, entry.revision)
        return GangLoop(
            kube=self.kube,
            kv=self.kv,
            state=self.state,
            known=known,
            held=dict,
            reserved=frozenset,
            profiles=DB,
            scheduler_name="hcs",
            clock=self.clock,
            quotas=self.quotas,
            reclaim_acu_per_min=reclaim_acu_per_min,
            publish=self.bus.nc.publish,
            checkpoint=checkpoint,
        )

    async def devices_of(self, namespace: str, job: str) -> list[Any]:
        entry = await self.kv.get(records.key_for(namespace, job, "r1"))
        return [d for r in records.DECODER.decode(entry.value).ranks for d in r.devices]

    async def state_of(self, namespace: str, job: str) -> str:
        """The state of the gang's record ("gone": none)."""
        try:
            entry = await self.kv.get(records.key_for(namespace, job, "r1"))
        except KeyNotFoundError:
            return "gone"
        return records.DECODER.decode(entry.value).state if entry.value else "gone"


def _quotas(tmp_path: Path, text: str) -> QuotaSource:
    path = tmp_path / "quotas.yaml"
    path.write_text(text)
    return QuotaSource(kube=None, file=str(path))


async def _world(bus: Bus, quotas: QuotaSource | None) -> World:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    return World(bus, kv, fleet(("gpu", A100, "g1")), quotas)  # 8 A100s


@pytest.mark.parametrize("pool", [True, False])
async def test_the_gang_of_the_namespace_with_the_lower_share_goes_first_though_younger(
    bus: Bus, tmp_path: Path, pool: bool
) -> None:
    world = await _world(bus, _quotas(tmp_path, "namespaces: {}\n") if pool else None)
    await world.submit("heavy", "one", size=4)
    assert await (await world.loop()).once() == 1
    await world.submit("heavy", "two", size=4)  # older than light's
    await world.submit("light", "one", size=4)
    assert await (await world.loop()).once() == 1
    first, second = ("light", "heavy") if pool else ("heavy", "light")
    second_job = "two" if second == "heavy" else "one"
    assert await world.state_of(first, "two" if first == "heavy" else "one") == "pledged"
    assert await world.state_of(second, second_job) == "pinned"
    assert f"{second_job}-0" in world.kube.told("GangWaiting")


async def test_a_gang_that_would_pass_its_namespaces_ceiling_waits_and_is_told_the_ceiling(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, "namespaces: {capped: {vram: 320Gi}}\n"))
    await world.submit("capped", "one", size=2)
    await world.submit("capped", "two", size=4)  # with one's 2: 6 devices, past 4
    assert await (await world.loop()).once() == 1
    assert await world.state_of("capped", "one") == "pledged"
    assert await world.state_of("capped", "two") == "pinned"
    assert "namespace capped at its ceiling" in world.kube.told("GangWaiting")["two-0"]


async def test_a_namespace_borrows_only_what_waiting_namespaces_below_their_guarantee_leave(
    bus: Bus, tmp_path: Path
) -> None:
    quotas = _quotas(tmp_path, "namespaces: {owed: {guaranteed: {vram: 320Gi}}}\n")
    world = await _world(bus, quotas)
    await world.submit("other", "one", size=4)
    assert await (await world.loop()).once() == 1
    await world.submit("owed", "big", size=6)  # waits: 4 free; beyond its guarantee (no reclaim)
    await world.submit("other", "two", size=4)  # fits, but the 4 free are owed's guarantee
    assert await (await world.loop()).once() == 0
    assert world.kube.evicted == []
    told = world.kube.told("GangWaiting")
    assert "kept for other namespaces' guarantees" in told["two-0"]
    assert "needs 6" in told["big-0"]


async def _borrowed(world: World) -> None:
    """``lender`` idle; ``borrower`` fills the pool
    with four gangs of 2, one per round (so each is newer than the last)."""
    for job in ("b1", "b2", "b3", "b4"):
        await world.submit("borrower", job, size=2)
        assert await (await world.loop()).once() == 1
        world.clock.now += 10.0


POOL = "namespaces: {lender: {guaranteed: {vram: 320Gi}}}\n"
FLOOR = "namespaces: {lender: {guaranteed: {vram: 240Gi}}, borrower: {guaranteed: {vram: 400Gi}}}\n"


async def test_a_gang_owed_its_guarantee_takes_back_the_newest_borrowed_gangs_once(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, POOL))
    await _borrowed(world)
    await world.submit("lender", "a", size=4)
    alerts: asyncio.Queue[UsageAlert] = asyncio.Queue()

    async def on_alert(msg: Any) -> None:
        alerts.put_nowait(ALERTS.decode(msg.data))

    await bus.nc.subscribe(subjects.USAGE_ALL, cb=on_alert)
    leaving = [d.index for job in ("b3", "b4") for d in await world.devices_of("borrower", job)]
    loops = [await world.loop(), await world.loop()]  # two replicas race
    assert await asyncio.gather(*(loop.once() for loop in loops)) == [0, 0]
    assert sorted(world.kube.evicted) == ["b3-0", "b3-1", "b4-0", "b4-1"]
    for job in ("b3", "b4"):  # their room is no longer held for them
        assert await world.state_of("borrower", job) == "gone"
    for job in ("b1", "b2"):
        assert await world.state_of("borrower", job) == "pledged"
    victims = world.kube.told("Reclaimed")
    assert sorted(victims) == ["b3-0", "b3-1", "b4-0", "b4-1"]
    assert "taken back for gang lender/a" in victims["b4-0"]
    assert sorted(world.kube.told("ReclaimedFor")) == [f"a-{i}" for i in range(4)]
    sent = [await asyncio.wait_for(alerts.get(), timeout=5.0) for _ in range(2)]
    assert {(a.kind, a.namespace, a.gang, a.reclaimed_for) for a in sent} == {
        ("reclaim", "borrower", "borrower/b3", "lender/a"),
        ("reclaim", "borrower", "borrower/b4", "lender/a"),
    }
    assert all(a.held_devices == 2 and a.held_vram_mib == 2 * 81920 for a in sent)

    # the victims' members still on their devices: nothing more is taken
    occupy(world.state, "gpu", [(i, 81920, True) for i in leaving])
    again = await world.loop()
    assert await again.once() == 0
    assert len(world.kube.evicted) == 4
    world.kube.gone()
    world.state.apply_reservations("gpu", None)
    assert await again.once() == 1
    assert await world.state_of("lender", "a") == "pledged"
    assert len(world.kube.evicted) == 4


async def test_a_reclaim_beyond_the_budget_left_this_minute_takes_nothing(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, POOL))
    await _borrowed(world)
    await world.submit("lender", "a", size=4)
    assert await (await world.loop(reclaim_acu_per_min=1.0)).once() == 0
    assert world.kube.evicted == []
    assert world.kube.told("Reclaimed") == {}


async def test_a_reclaim_that_would_take_a_namespace_below_its_own_guarantee_takes_nothing(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, FLOOR))  # borrower guaranteed 5 of the 8
    await _borrowed(world)
    await world.submit("lender", "a", size=3)  # b4 frees 2; b3 would leave the borrower 4
    assert await (await world.loop()).once() == 0
    assert world.kube.evicted == []
    for job in ("b1", "b2", "b3", "b4"):
        assert await world.state_of("borrower", job) == "pledged"


async def test_a_waiting_gang_is_pinned_only_to_a_class_its_policy_names(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))
    occupy(state, "gpu", [(i, 81920, True) for i in range(8)])  # every A100 taken
    world = World(bus, kv, state, None)
    for i in range(4):
        plan = await world.pins.place(
            PlanRequest(
                namespace="ns1",
                requests=Requests(devices=1),
                policy=Policy(models=("A100-80G",)),
                pod_name=f"p-{i}",
                admission_uid=f"adm-{i}",
                gang_key="ns1/named/r1",
                gang_size=4,
            )
        )
        assert plan.ok, plan.reason
        assert (plan.vendor, plan.model) == ("nvidia", "A100-80G")  # not the idle Ascends
    entry = await kv.get(records.key_for("ns1", "named", "r1"))
    assert records.DECODER.decode(entry.value).class_key == "nvidia/A100-80G"
