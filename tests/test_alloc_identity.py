"""An AllocationEvent is believed only on its own node's subject: a body naming
another node than ``hcs.alloc.<node>`` is dead-lettered by every reader of
HCS_ALLOC, with the reason, and never handed on."""

from __future__ import annotations

import asyncio

from hcs_bus import messages, subjects
from hcs_bus.bus import Bus, Consumer, Delivery, Follower
from hcs_bus.messages import AllocationEvent, PodRef
from hcs_bus.streams import ALLOC, DLQ
from hcs_bus.tasks import start, stop


def _event(node: str, name: str) -> AllocationEvent:
    pod = PodRef(namespace="ml", name=name, uid=f"uid-{name}")
    return AllocationEvent(node=node, pod=pod, state="bound", time_s=1.0)


async def _letters(bus: Bus, count: int) -> list[str]:
    async with asyncio.timeout(5):
        while (await bus.js.stream_info(DLQ)).state.messages < count:
            await asyncio.sleep(0.02)
    found = [await bus.js.get_msg(DLQ, seq) for seq in range(1, count + 1)]
    return [(m.headers or {}).get("Hcs-Reason", "") for m in found]


async def test_an_allocation_naming_another_node_than_its_subject_is_dead_lettered(
    bus: Bus,
) -> None:
    # a forged body on gpu-a's subject, then a true one
    await bus.js.publish(subjects.alloc("gpu-a"), messages.encode(_event("gpu-b", "forged")))
    await bus.publish(subjects.alloc("gpu-a"), _event("gpu-a", "true"), msg_id="alloc-true")
    followed: list[str] = []
    follower = Follower(
        bus,
        stream=ALLOC,
        subject=subjects.ALLOC_ALL,
        kind=AllocationEvent,
        handle=lambda item: followed.append(item.value.pod.name),
    )
    consumed: list[str] = []

    async def handle(items: list[Delivery[AllocationEvent]]) -> None:
        consumed.extend(item.value.pod.name for item in items)

    consumer = Consumer(
        bus, stream=ALLOC, kind=AllocationEvent, handle=handle, durable="t-alloc-identity"
    )
    await follower.start()
    await consumer.start()
    task = start(consumer.run(), name="test:alloc-consumer")
    try:
        async with asyncio.timeout(5):
            while followed != ["true"] or consumed != ["true"]:
                await asyncio.sleep(0.02)
    finally:
        await stop(task)
        await follower.stop()
    # each reader refused it itself; the letter is kept once per stream sequence
    assert follower.dead == 1 and consumer.dead == 1
    [reason] = await _letters(bus, 1)
    assert "allocation event body names node 'gpu-b'" in reason
