"""Two replicas, separate connections and views, never book the same slice."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator

from hcs_bus.bus import Bus, connect
from hcs_bus.settings import BusSettings
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.replica import Scheduler
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_WHOLE, node_fp, pod_info, publish_fleet, until

NODES = [f"gpu-{i}" for i in range(4)]
WHOLE = PlanAnnotation(**A100_WHOLE)
SLICE = PlanAnnotation(
    vendor="nvidia",
    model="A100-80G",
    devices=1,
    vram_mib_per_device=20480,
    whole_device=False,
    acu_per_device=25.0,
)


def _pod(i: int) -> PodInfo:
    return pod_info(f"p{i}", uid=f"u{i}")


@contextlib.asynccontextmanager
async def _two_replicas(
    bus: Bus, bus_settings: BusSettings, start_scheduler: Start
) -> AsyncIterator[list[Scheduler]]:
    """Two replicas on connections of their own, each seeing the whole fleet."""
    await publish_fleet(bus, *(node_fp(n) for n in NODES))
    buses = [await connect(bus_settings, name=f"replica-{i}") for i in range(2)]
    replicas: list[Scheduler] = []
    try:
        replicas = [await start_scheduler(b, http=False) for b in buses]
        for r in replicas:
            await until(lambda r=r: len(r.view.state.nodes) == len(NODES))
        yield replicas
    finally:
        for r in replicas:
            await r.stop()
        for b in buses:
            await b.nc.close()


async def test_two_replicas_never_book_the_same_slice(
    bus: Bus, bus_settings: BusSettings, start_scheduler: Start
) -> None:
    async with _two_replicas(bus, bus_settings, start_scheduler) as replicas:
        rng = random.Random(7)
        jobs = []
        for i in range(200):
            demand = WHOLE if i % 3 == 0 else SLICE
            replica = replicas[i % 2]
            jobs.append(replica.booker.bind(_pod(i), demand, node=rng.choice(NODES)))
        errors = await asyncio.gather(*jobs)
        docs = {n: (await replicas[0].booker.read(n)).doc for n in NODES}
    booked: dict[str, int] = {}
    for node, doc in docs.items():
        assert doc is not None
        per_device: dict[int, int] = {}
        whole: dict[int, int] = {}
        slices: dict[int, int] = {}
        for r in doc.reservations:
            booked[r.pod.name] = booked.get(r.pod.name, 0) + 1
            for s in r.devices:
                per_device[s.index] = per_device.get(s.index, 0) + s.vram_mib
                target = whole if s.whole else slices
                target[s.index] = target.get(s.index, 0) + 1
        assert all(v <= 81920 for v in per_device.values()), node
        assert all(count == 1 for count in whole.values()), node
        assert not set(whole) & set(slices), node
    succeeded = {f"p{i}" for i, e in enumerate(errors) if not e}
    assert set(booked) == succeeded and all(c == 1 for c in booked.values())
    failed = [e for e in errors if e]
    assert failed and all("no longer fits" in e for e in failed)
    assert len(succeeded) >= 4 * 8  # every device was usable by someone


async def test_binds_of_one_pod_to_two_nodes_on_two_replicas_leave_it_on_one_node(
    bus: Bus, bus_settings: BusSettings, start_scheduler: Start
) -> None:
    """kube-scheduler retried a pod's scheduling cycle and each bind went to
    another replica and node: the pod's claim lets exactly one through, the
    other is refused naming the node that holds it, and once the pod is
    released it can be bound anywhere again."""
    async with _two_replicas(bus, bus_settings, start_scheduler) as replicas:
        pods = [_pod(i) for i in range(20)]
        errors = await asyncio.gather(
            *(replicas[k].booker.bind(pod, SLICE, node=NODES[k]) for pod in pods for k in (0, 1))
        )
        docs = {n: (await replicas[0].booker.read(n)).doc for n in NODES}
        holders: dict[str, list[str]] = {}
        for node, doc in docs.items():
            for r in doc.reservations if doc is not None else ():
                holders.setdefault(r.pod.name, []).append(node)
        assert sorted(holders) == sorted(p.ref.name for p in pods)
        assert all(len(nodes) == 1 for nodes in holders.values()), holders
        refused = [e for e in errors if e and "no cluster" not in e]
        assert len(refused) == len(pods), errors
        assert all("not binding it to" in e for e in refused), refused
        # released: the pod may go anywhere again (its claim went with it)
        moved = pods[0]
        await replicas[0].booker.release(moved.ref, reason="test", node=holders["p0"][0])
        other = next(n for n in NODES if n != holders["p0"][0])
        assert await replicas[1].booker.bind(moved, SLICE, node=other) in (
            "",
            "no cluster: Binding not posted",
        )
