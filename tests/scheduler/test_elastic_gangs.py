"""Elastic gangs in the gang loop, on a real nats-server (KV ``hcs_alloc``)
with a fake Kube: a gang with a least size starts with it, grows with idle
devices while no gang waits, gives up its highest ranks to a reclaim (asked
to checkpoint first), runs on when a rank's member goes, grows back to its least
size first when ranks' members go, and restarts whole when all are gone."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hcs_bus import vocabulary
from hcs_bus.bus import Bus
from hcs_bus.messages import Plan, QuotaVerdict
from scheduler.plan import gang_records as records
from scheduler.plan.gang_service import _queued_at_ceiling
from tests.scheduler.test_gang_rules import occupy
from tests.scheduler.test_pool_gangs import POOL, World, _pod, _quotas, _world


async def _record(world: World, namespace: str, job: str) -> records.GangRecord:
    entry = await world.kv.get(records.key_for(namespace, job, "r1"))
    return records.DECODER.decode(entry.value)


def _gated(world: World) -> list[str]:
    return sorted(
        name for name, pod in world.kube.pods.items() if pod["spec"].get("schedulingGates")
    )


async def test_an_elastic_gang_starts_with_its_least_size_on_a_busy_node_and_grows_as_it_empties(
    bus: Bus,
) -> None:
    world = await _world(bus, None)
    occupy(world.state, "gpu", [(i, 81920, True) for i in range(5)])  # 3 of 8 free
    await world.submit("ml", "el", size=8, least=2)
    loop = await world.loop()
    assert await loop.once() == 1
    record = await _record(world, "ml", "el")
    assert (record.state, len(record.ranks), record.least, record.size) == ("pledged", 2, 2, 8)
    assert _gated(world) == [f"el-{i}" for i in range(2, 8)]  # ranks 0 and 1 run

    await loop.once()  # one device left idle: it grows by one, lowest rank first
    assert sorted(r.pod for r in (await _record(world, "ml", "el")).ranks) == [
        "el-0",
        "el-1",
        "el-2",
    ]
    assert "el-2" in world.kube.told("GangGrown")
    await loop.once()  # nothing idle: nothing more
    assert len((await _record(world, "ml", "el")).ranks) == 3

    world.state.apply_reservations("gpu", None)  # the other pods finish
    await loop.once()
    record = await _record(world, "ml", "el")
    assert len(record.ranks) == 8 and _gated(world) == []
    assert len({d.index for r in record.ranks for d in r.devices}) == 8  # no device twice


async def test_an_elastic_gang_does_not_grow_while_another_gang_waits_for_room(bus: Bus) -> None:
    world = await _world(bus, None)
    occupy(world.state, "gpu", [(i, 81920, True) for i in range(4)])
    await world.submit("ml", "el", size=8, least=2)
    loop = await world.loop()
    assert await loop.once() == 1  # 2 of the 4 free
    await world.submit("ml", "big", size=3)  # needs 3, 2 free: waits
    assert await (await world.loop()).once() == 0  # a loop that knows both records
    assert len((await _record(world, "ml", "el")).ranks) == 2  # the 2 free stay for it
    assert "big-0" in world.kube.told("GangWaiting")


async def test_a_reclaim_takes_an_elastic_gangs_highest_ranks_and_asks_it_to_checkpoint_first(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, POOL))  # lender guaranteed 4 of the 8
    await world.submit("borrower", "el", size=8, least=2)
    loop = await world.loop()
    for _ in range(2):
        await loop.once()  # starts with 2, grows to 8 with the idle devices
    assert len((await _record(world, "borrower", "el")).ranks) == 8
    await world.submit("lender", "a", size=4)
    for name, pod in world.kube.pods.items():  # its members run the checkpoint sidecar
        if name.startswith("el-"):
            pod["metadata"]["annotations"][vocabulary.CHECKPOINT_DIR] = "/ckpt"
    before = await _record(world, "borrower", "el")
    leaving = [d for r in before.ranks if r.pod >= "el-4" for d in r.devices]

    asked: list[tuple[str, str]] = []
    evicted_when_asked: list[int] = []
    release = asyncio.Event()

    async def checkpoint(namespace: str, job: str, reason: str) -> bool:
        asked.append((namespace, job))
        evicted_when_asked.append(len(world.kube.evicted))
        await release.wait()
        return True

    taker = await world.loop(checkpoint=checkpoint)
    assert await taker.once() == 0
    record = await _record(world, "borrower", "el")
    assert sorted(r.pod for r in record.ranks) == [f"el-{i}" for i in range(4)]
    occupy(world.state, "gpu", [(d.index, 81920, True) for d in leaving])  # not gone yet
    await asyncio.wait_for(_until(lambda: asked == [("borrower", "el")]), timeout=5.0)
    assert evicted_when_asked == [0]  # nothing evicted before the checkpoint
    release.set()
    await asyncio.wait_for(_until(lambda: len(world.kube.evicted) == 4), timeout=5.0)
    assert sorted(world.kube.evicted) == [f"el-{i}" for i in range(4, 8)]
    told = world.kube.told("Reclaimed")
    assert sorted(told) == [f"el-{i}" for i in range(4, 8)]
    assert "checkpointed first" in told["el-7"] and "runs on with 4" in told["el-7"]

    # the dropped ranks still on their devices count as leaving: nothing more is taken
    assert await taker.once() == 0
    assert len((await _record(world, "borrower", "el")).ranks) == 4
    world.kube.gone()
    world.state.apply_reservations("gpu", None)
    assert await taker.once() == 1
    assert (await _record(world, "lender", "a")).state == "pledged"


async def test_an_elastic_gang_runs_on_without_a_gone_rank_and_restarts_below_its_least_size(
    bus: Bus,
) -> None:
    world = await _world(bus, None)
    occupy(world.state, "gpu", [(i, 81920, True) for i in range(4)])
    await world.submit("ml", "el", size=6, least=3)
    loop = await world.loop()
    await loop.once()
    await loop.once()
    assert len((await _record(world, "ml", "el")).ranks) == 4  # 3, grown by the 1 left
    del world.kube.pods["el-1"]  # its member is gone (its controller makes it again, gated)
    await loop.once()
    record = await _record(world, "ml", "el")
    assert (record.state, sorted(r.pod for r in record.ranks)) == (
        "pledged",
        ["el-0", "el-2", "el-3"],
    )
    _again(world, 1)
    await loop.once()  # it waits to grow the gang back
    assert "el-1-again" in {r.pod for r in (await _record(world, "ml", "el")).ranks}

    for name in ("el-0", "el-2"):
        del world.kube.pods[name]  # two of four left: below its least size of 3
    _again(world, 0)
    await world.submit("ml", "big", size=3)  # a gang waits for room: no growth for the el...
    await (await world.loop()).once()
    record = await _record(world, "ml", "el")
    assert sorted(r.pod for r in record.ranks) == ["el-1-again", "el-3"]
    await (await world.loop()).once()  # ...but back to its least size first
    record = await _record(world, "ml", "el")
    assert (record.state, sorted(r.pod for r in record.ranks)) == (
        "pledged",
        ["el-0-again", "el-1-again", "el-3"],
    )

    for name in ("el-0-again", "el-1-again", "el-3"):  # every rank's member gone: it restarts whole
        del world.kube.pods[name]
    _again(world, 3)
    await (await world.loop()).once()
    record = await _record(world, "ml", "el")
    assert (record.state, record.ranks) == ("pinned", ())


def _again(world: World, index: int) -> None:
    """Rank ``index``'s member made again by its controller (a new pod), behind the gate."""
    pod = _pod("ml", "el", index, 6)
    pod["metadata"]["name"] = name = f"el-{index}-again"
    pod["metadata"]["uid"] += "-again"
    world.kube.pods[name] = pod


async def _until(done: Any) -> None:
    while not done():
        await asyncio.sleep(0.01)


def test_a_member_refused_only_by_a_full_ceiling_is_admitted_unless_its_gang_never_fits() -> None:
    full = QuotaVerdict(ok=False, reason="quota of namespace ml exceeded", vram_mib_hard=4 * 81920)
    refused = Plan(
        ok=False,
        reason="quota of namespace ml exceeded",
        vendor="nvidia",
        model="A100-80G",
        devices=1,
        vram_mib_per_device=81920,
        quota=full,
    )
    queued = _queued_at_ceiling(refused, size=4)  # 4 ranks fit under the ceiling once free
    assert queued.ok and "waits at its namespace's ceiling" in queued.reason
    never = _queued_at_ceiling(refused, size=5)  # 5 ranks never fit under it
    assert not never.ok and "above the ceiling" in never.reason
    no_room = Plan(ok=False, reason="no device free", vendor="nvidia", devices=1)
    assert _queued_at_ceiling(no_room, size=2) == no_room  # other refusals stand
