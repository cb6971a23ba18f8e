"""No fault is dropped for an outage of the Kubernetes API: a fatal event whose
taint the API refuses stays on the bus, redelivered with a growing delay and
never dead-lettered, until the taint is applied, by the leader of the moment.

The circuit breaker's window is on the bus too: a new leader starts with the
isolations its predecessor counted.

A 60 s outage is simulated as OUTAGE_S = 8 s, with a change of leader in it:
longer than five deliveries 1 to 2 s apart (a bounded retry would have buried
the event by then), and long enough for the first leader to fail the batch
and see it again."""

from __future__ import annotations

import asyncio
import uuid

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.streams import DLQ, HEALTH
from tests.apiserver import ApiServer
from tests.healer.conftest import fingerprint, health
from tests.healer.test_healing import (
    Make,
    collect,
    make,
    our_taint,
    publish,
    ready,
    wait_until,
)

__all__ = ["make"]  # the fixture, used by name

OUTAGE_S = 8.0


async def _dead_letters(bus: Bus) -> int:
    info = await bus.js.stream_info(DLQ, subjects_filter=">")
    return int(info.state.messages)


async def test_a_fault_during_an_api_outage_and_a_change_of_leader_is_applied_when_the_api_is_back(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    durable = f"t-outage-{uuid.uuid4().hex[:6]}"
    first = await make(kube, failed_share=0.25, durable=durable, identity="h1")
    await ready(first)
    first.actor.attempts = 2
    loop = asyncio.get_running_loop()
    down = loop.time()
    apiserver.fail("get", "nodes", code=503, times=10_000)  # the API is down
    await publish(bus, health("n1", code=79, device=0), subjects.health("n1"))
    consumer = f"{durable}-health"

    async def redelivered() -> int:
        info = await bus.js.consumer_info(HEALTH, consumer)
        return int(info.num_redelivered or 0)

    async with asyncio.timeout(OUTAGE_S):  # the batch failed and is waiting on the bus
        while await redelivered() < 1:
            await asyncio.sleep(0.05)
    await first.stop()  # the leader goes, mid-outage
    second = await make(kube, failed_share=0.25, durable=durable, identity="h2")
    await ready(second)
    second.actor.attempts = 2
    await asyncio.sleep(max(0.0, OUTAGE_S - (loop.time() - down)))  # the outage lasts this long
    assert our_taint(apiserver, "n1") is None
    apiserver._hooks.clear()  # the API is back
    await wait_until(lambda: our_taint(apiserver, "n1") is not None, timeout_s=40)
    assert our_taint(apiserver, "n1")["effect"] == "NoSchedule"  # type: ignore[index]
    assert await _dead_letters(bus) == 0
    async with asyncio.timeout(40):  # and, applied, the event is acknowledged at last
        while (await bus.js.consumer_info(HEALTH, consumer)).num_ack_pending:
            await asyncio.sleep(0.1)


async def test_a_new_leader_starts_with_the_isolations_its_predecessor_counted(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    nodes = [f"m{i}" for i in range(4)]
    for node in nodes:
        apiserver.add_node(node)
        await publish(bus, fingerprint(node), subjects.fp(node))
    durable = f"t-breaker-{uuid.uuid4().hex[:6]}"
    first = await make(kube, fraction=0.25, failed_share=0.25, durable=durable, identity="h1")
    await ready(first)
    await wait_until(lambda: len(first.fleet.nodes) == 4)
    await publish(bus, health("m0", code=79, device=0), subjects.health("m0"))
    await wait_until(lambda: our_taint(apiserver, "m0") is not None)  # 1 of 4: the limit
    await first.stop()
    second = await make(kube, fraction=0.25, failed_share=0.25, durable=durable, identity="h2")
    await ready(second)
    assert second.breaker.isolated(now=asyncio.get_running_loop().time()) == 1
    await wait_until(lambda: len(second.fleet.nodes) == 4)
    alerts, sub = await collect(bus, "hcs.health.*")
    await publish(bus, health("m1", code=79, device=0), subjects.health("m1"))
    await wait_until(lambda: any(a["kind"] == "breaker_open" for a in alerts))
    await sub.unsubscribe()
    assert our_taint(apiserver, "m1") is None
