"""The cluster view rebuilt from a real nats-server."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from nats.js.kv import KeyValue

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeReservations
from hcs_bus.settings import SchedulerSettings
from scheduler.view import follow_loop as viewing
from scheduler.view.follow_loop import ClusterView
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


class _EarlyEnd:
    """nats-py's KV watcher as it runs on a busy machine (nats-io/nats.py#842):
    its end-of-replay ``None`` first, the entries it holds only once
    ``release`` is set."""

    def __init__(self, real: KeyValue.KeyWatcher, release: asyncio.Event) -> None:
        self.real, self.release, self.said_done = real, release, False

    def __aiter__(self) -> _EarlyEnd:
        return self

    async def __anext__(self) -> Any:
        if not self.said_done:
            self.said_done = True
            return None
        await self.release.wait()
        return await self.real.__anext__()

    async def stop(self) -> None:
        await self.real.stop()


async def _book(bus: Bus, nodes: list[str]) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    for node in nodes:
        fp = fingerprint(node, devices=2)
        await bus.publish(subjects.fp(node), fp, msg_id=f"{node}:b1:1")
        doc = NodeReservations(
            node=node, reservations=(reservation("ml", node, [(0, 8192, False)]),)
        )
        await kv.put(subjects.alloc_key(node), messages.encode(doc))


def _watch_with(monkeypatch: pytest.MonkeyPatch, wrap: Any) -> None:
    real = KeyValue.watchall

    async def watchall(self: KeyValue, **kw: Any) -> Any:
        return wrap(await real(self, **kw))

    monkeypatch.setattr(KeyValue, "watchall", watchall)


async def test_a_watch_that_says_done_early_does_not_make_the_view_ready_without_the_reservations(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = [f"gpu-{i}" for i in range(3)]
    await _book(bus, nodes)
    release = asyncio.Event()
    _watch_with(monkeypatch, lambda real: _EarlyEnd(real, release))
    view = ClusterView(bus, settings=SchedulerSettings())
    booked_when_ready: list[int] = []

    async def note() -> None:
        booked_when_ready.append(
            sum(d.reserved_mib for n in view.state.nodes.values() for d in n.devices.values())
        )

    view.before_ready.append(note)
    await view.start()
    try:
        with pytest.raises(TimeoutError):  # the fingerprints are in; the reservations are not
            await view.wait_ready(timeout_s=1.0)
        release.set()
        await view.wait_ready(timeout_s=5)
        assert booked_when_ready == [3 * 8192]
    finally:
        await view.stop()


async def test_a_reservation_purged_between_the_listing_and_the_watch_is_not_waited_for(
    bus: Bus, monkeypatch: pytest.MonkeyPatch
) -> None:
    await _book(bus, ["gpu-0", "gone"])
    monkeypatch.setattr(viewing, "SYNC_WAIT_S", 0.2)
    purged = asyncio.Event()
    real = KeyValue.watchall

    async def watchall(self: KeyValue, **kw: Any) -> Any:
        if not purged.is_set():  # listed by the view a moment ago, compacted now
            await bus.js.purge_stream(
                streams.kv_stream(streams.KV_ALLOC),
                subject=streams.kv_subject(streams.KV_ALLOC, subjects.alloc_key("gone")),
            )
            purged.set()
        return await real(self, **kw)

    monkeypatch.setattr(KeyValue, "watchall", watchall)
    view = ClusterView(bus, settings=SchedulerSettings())
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        assert purged.is_set()
        assert view.state.nodes["gpu-0"].devices[0].reserved_mib == 8192
        assert view.state.nodes["gone"].devices[0].reserved_mib == 0
    finally:
        await view.stop()
