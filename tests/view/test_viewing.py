"""The cluster view rebuilt from a real nats-server."""

from __future__ import annotations

import asyncio

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeReservations
from hcs_bus.settings import SchedulerSettings
from scheduler.viewing import ClusterView
from tests.view.factories import fingerprint, reservation, verdict


async def _until(predicate: object, *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():  # type: ignore[operator]
            await asyncio.sleep(0.02)


async def test_the_view_is_ready_only_after_replaying_what_the_stream_holds(bus: Bus) -> None:
    for i in range(50):
        for seq in (1, 2):
            fp = fingerprint(f"node-{i}", seq=seq, devices=seq * 2)
            await bus.publish(subjects.fp(fp.node), fp, msg_id=f"{fp.node}:b1:{seq}")
    await bus.publish(subjects.healer_health("node-3"), verdict("node-3", 0, "failed"), msg_id="v1")
    view = ClusterView(bus, settings=SchedulerSettings())
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        assert len(view.state.nodes) == 50
        assert all(len(n.devices) == 4 for n in view.state.nodes.values())
        assert view.state.nodes["node-3"].devices[0].verdict == "failed"
    finally:
        await view.stop()


async def test_the_view_follows_live_fingerprints_and_reservations(bus: Bus) -> None:
    view = ClusterView(bus, settings=SchedulerSettings())
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        fp = fingerprint("gpu-1.example.com", devices=2)
        await bus.publish(subjects.fp(fp.node), fp, msg_id="live:1")
        await _until(lambda: "gpu-1.example.com" in view.state.nodes)
        kv = await bus.js.key_value(streams.KV_ALLOC)
        doc = NodeReservations(
            node=fp.node, reservations=(reservation("ml", "p", [(1, 4096, False)]),)
        )
        await kv.put(subjects.alloc_key(fp.node), messages.encode(doc))
        await _until(lambda: view.state.nodes[fp.node].devices[1].reserved_mib == 4096)
    finally:
        await view.stop()


async def test_a_node_whose_fingerprints_stop_is_marked_stale(bus: Bus) -> None:
    fp = fingerprint("quiet", devices=1)
    await bus.publish(subjects.fp("quiet"), fp, msg_id="q:1")
    view = ClusterView(bus, settings=SchedulerSettings(stale_after_s=0.3))
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        await _until(lambda: view.state.nodes["quiet"].stale, timeout_s=3)
        assert not list(view.state.schedulable())
    finally:
        await view.stop()
