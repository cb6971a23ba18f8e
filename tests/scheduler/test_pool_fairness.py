"""The shared pool's fairness rules in the gang loop, on a real nats-server
(KV ``hcs_alloc``) with a fake Kube, as ``share_rules.admit`` applies them:
the queue ordered by the share a namespace has once the gang runs (the
share now for a gang waiting past the starvation time), as ``hcs queue``
shows it; elastic ranks above their least size lent back to a gang waiting
for room; a fair reclaim from a namespace whose share stays above the
waiting gang's, within the reclaim budget; and a gang that fits on several
classes pinned, at its first member's admission, to the fairest."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hcs_bus import streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import Policy, UsageAlert
from scheduler.plan import gang_records as records
from scheduler.plan.rules import summarise
from scheduler.quota import queue_view
from tests.scheduler.test_gang_rules import A100, ASCEND, fleet, occupy
from tests.scheduler.test_pool_gangs import World, _quotas, _world

ALERTS = msgspec.json.Decoder(UsageAlert, strict=True)
OPEN = "namespaces: {}\n"  # no guarantee, no ceiling: nothing is owed a reclaim


async def _record(world: World, namespace: str, job: str) -> records.GangRecord:
    entry = await world.kv.get(records.key_for(namespace, job, "r1"))
    return records.DECODER.decode(entry.value)


async def _shown(world: World) -> list[str]:
    """The waiting gangs in the order ``hcs queue`` shows them."""
    gangs = []
    for entry in await world.gang_entries():
        gangs.append(records.DECODER.decode(entry.value))
    classes = dict(summarise(world.state.schedulable()).classes)
    found = queue_view.view(
        [],
        [],
        limits={},
        pool=queue_view.pool_of(classes),
        now=world.clock.now,
        gangs=gangs,
        classes=classes,
    )
    return [q["job"] for q in found["queue"]]


@pytest.mark.parametrize("starving", [False, True])
async def test_a_large_ask_waits_behind_a_small_one_unless_it_waited_past_the_starvation_time(
    bus: Bus, tmp_path: Path, starving: bool
) -> None:
    world = await _world(bus, _quotas(tmp_path, OPEN))
    occupy(world.state, "gpu", [(i, 81920, True) for i in range(2)])  # 6 of 8 free
    await world.submit("x", "big", size=6)  # older; both namespaces hold nothing
    if starving:
        world.clock.now += 301.0  # past the loop's starvation time: the share now counts
    await world.submit("y", "small", size=2)
    first, then = ("x/big/r1", "y/small/r1") if starving else ("y/small/r1", "x/big/r1")
    assert await _shown(world) == [first, then]

    assert await (await world.loop()).once() == 1
    started, waits = first.split("/"), then.split("/")
    assert (await _record(world, started[0], started[1])).state == "pledged"
    assert (await _record(world, waits[0], waits[1])).state == "pinned"
    assert f"{waits[1]}-0" in world.kube.told("GangWaiting")


async def test_elastic_ranks_above_the_least_size_are_lent_back_to_a_gang_waiting_for_room(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, OPEN))
    await world.submit("ml", "el", size=8, least=2)
    loop = await world.loop()
    for _ in range(2):
        await loop.once()  # starts with 2, grows to 8 with the idle devices
    assert len((await _record(world, "ml", "el")).ranks) == 8
    await world.submit("cv", "a", size=4)  # no guarantee: not owed a reclaim
    before = await _record(world, "ml", "el")
    leaving = [d for r in before.ranks if r.pod >= "el-4" for d in r.devices]
    alerts: asyncio.Queue[UsageAlert] = asyncio.Queue()

    async def on_alert(msg: Any) -> None:
        alerts.put_nowait(ALERTS.decode(msg.data))

    await bus.nc.subscribe(subjects.USAGE_ALL, cb=on_alert)

    taker = await world.loop()
    assert await taker.once() == 0
    record = await _record(world, "ml", "el")
    assert sorted(r.pod for r in record.ranks) == [f"el-{i}" for i in range(4)]
    assert sorted(world.kube.evicted) == [f"el-{i}" for i in range(4, 8)]
    victims = world.kube.told("Reclaimed")
    assert sorted(victims) == [f"el-{i}" for i in range(4, 8)]
    assert "lent back" in victims["el-7"] and "runs on with 4" in victims["el-7"]
    assert "taken back for gang cv/a" in victims["el-7"]
    waiting = world.kube.told("ReclaimedFor")
    assert sorted(waiting) == [f"a-{i}" for i in range(4)] and "lent back" in waiting["a-0"]
    sent = await asyncio.wait_for(alerts.get(), timeout=5.0)
    assert (sent.kind, sent.namespace, sent.gang, sent.reclaimed_for) == (
        "reclaim",
        "ml",
        "ml/el",
        "cv/a",
    )
    assert "lent back" in sent.message and sent.held_devices == 4

    occupy(world.state, "gpu", [(d.index, 81920, True) for d in leaving])  # not gone yet
    assert await taker.once() == 0  # leaving: nothing more is taken
    assert len(world.kube.evicted) == 4 and len((await _record(world, "ml", "el")).ranks) == 4
    world.kube.gone()
    world.state.apply_reservations("gpu", None)
    assert await taker.once() == 1
    assert (await _record(world, "cv", "a")).state == "pledged"
    assert len((await _record(world, "ml", "el")).ranks) == 4


async def _two_gangs(world: World, namespace: str, *, size: int = 4) -> None:
    """Two gangs of ``namespace`` started one round apart (the second newer)."""
    for job in ("g1", "g2"):
        await world.submit(namespace, job, size=size)
        assert await (await world.loop()).once() == 1
        world.clock.now += 10.0


@pytest.mark.parametrize("budget", [float("inf"), 1.0])
async def test_a_fair_reclaim_takes_the_newest_gang_of_a_namespace_whose_share_stays_above(
    bus: Bus, tmp_path: Path, budget: float
) -> None:
    world = await _world(bus, _quotas(tmp_path, OPEN))
    await _two_gangs(world, "big")  # all 8 A100s
    await world.submit("small", "a", size=2)  # once it runs: 2/8; big without g2: 4/8
    assert await (await world.loop(reclaim_acu_per_min=budget)).once() == 0
    if budget < float("inf"):  # over the budget left this minute: nothing taken
        assert world.kube.evicted == [] and world.kube.told("Reclaimed") == {}
        assert (await _record(world, "big", "g2")).state == "pledged"
        return
    assert sorted(world.kube.evicted) == ["g2-0", "g2-1", "g2-2", "g2-3"]
    assert await world.state_of("big", "g2") == "gone"
    assert (await _record(world, "big", "g1")).state == "pledged"
    victims = world.kube.told("Reclaimed")
    assert "fair reclaim" in victims["g2-0"] and "taken back for gang small/a" in victims["g2-0"]
    assert "fair reclaim" in world.kube.told("ReclaimedFor")["a-0"]


async def test_a_fair_reclaim_never_takes_a_namespace_down_to_the_waiting_gangs_share(
    bus: Bus, tmp_path: Path
) -> None:
    world = await _world(bus, _quotas(tmp_path, OPEN))
    for namespace, job in (("one", "g1"), ("two", "g2")):  # 4 A100s each: without it, 0
        await world.submit(namespace, job, size=4)
        assert await (await world.loop()).once() == 1
    await world.submit("small", "a", size=2)
    assert await (await world.loop()).once() == 0
    assert world.kube.evicted == [] and world.kube.told("Reclaimed") == {}
    assert "a-0" in world.kube.told("GangWaiting")


@pytest.mark.parametrize("rival_waits", [True, False])
async def test_a_gang_that_fits_on_several_classes_is_pinned_to_the_one_that_leaves_shares_fairest(
    bus: Bus, tmp_path: Path, rival_waits: bool
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))  # 8 A100s, 8 Ascends
    world = World(bus, kv, state, _quotas(tmp_path, OPEN))
    on_a100 = Policy(models=("A100-80G",))
    await world.submit("rich", "r", size=6, policy=on_a100)
    assert await (await world.loop()).once() == 1  # rich holds 6 A100s
    if rival_waits:
        await world.submit("rich", "w", size=8, policy=on_a100)  # waits: rich asks too
    for entry in await world.gang_entries():  # the pins see them as the KV watch does
        world.pins.known.apply(entry.key, entry.value, entry.revision)
    await world.submit("poor", "p", size=2)  # fits on either class now
    pinned = (await _record(world, "poor", "p")).class_key
    # 2 A100s are worth a larger share of the pool than 2 Ascends: with rich
    # waiting (its share far above), poor takes the class worth more; alone,
    # the one that adds least to its share (it borrows: no guarantee)
    assert pinned == ("nvidia/A100-80G" if rival_waits else "huawei/Ascend910B2")
