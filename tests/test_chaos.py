"""Chaos: ``kill -9`` the nats-server under traffic, start it again on the
same port and store, and nothing is lost and nothing needs a restart.

Real parts on a real ``nats-server -js`` of this test's own: agents'
``Reporter``/``Publisher`` publishing health events (retried by
``Nats-Msg-Id`` across the outage), the healer (durable pull consumers,
leader on the API double) and a scheduler ``ClusterView`` (ordered push
consumers and a KV watch). Asserted: every health event is in the stream
exactly once and was seen by the healer and the view; afterwards the same
tasks, unrestarted, consume again (a new fingerprint, a new event and a new
reservation all arrive) and the view stays ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy

from agents.reporting import Publisher, Reporter
from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus, Delivery, connect
from hcs_bus.kube import Kube
from hcs_bus.messages import (
    DeviceSlice,
    HealthEvent,
    NodeReservations,
    PodRef,
    Reservation,
)
from hcs_bus.natsserver import NatsServer, free_port
from hcs_bus.settings import BusSettings, HealerSettings, SchedulerSettings
from healer.healing import Healer
from scheduler.view.follow_loop import ClusterView
from tests.healer.conftest import device

NODES = ["chaos-a", "chaos-b", "chaos-c"]
BEFORE, DURING, AFTER = 60, 60, 30  # events queued before the kill, while down, after restart


class Server:
    """A nats-server on a fixed port and store that can be killed and restarted."""

    def __init__(self, store: Path) -> None:
        self.port = free_port()
        self.store = store
        self.current: NatsServer | None = None

    async def start(self) -> None:
        self.current = await NatsServer(port=self.port, store_dir=self.store).astart()

    def kill(self) -> None:
        assert self.current is not None and self.current.process is not None
        process = self.current.process
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        if process.stderr is not None:
            process.stderr.close()
        self.current.process = None

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    found = Server(tmp_path / "jetstream")
    await found.start()
    yield found
    found.stop()


async def until(predicate: Callable[[], object], *, timeout_s: float, what: str) -> None:
    try:
        async with asyncio.timeout(timeout_s):
            while not predicate():
                await asyncio.sleep(0.02)
    except TimeoutError:
        raise AssertionError(f"not within {timeout_s} s: {what}") from None


class Seen:
    """Health event ids as a part's handler received them (a spy around it)."""

    def __init__(self) -> None:
        self.ids: set[str] = set()
        self.twice: set[str] = set()

    def note(self, event: HealthEvent) -> None:
        if event.source == "agent":
            if event.id in self.ids:
                self.twice.add(event.id)
            self.ids.add(event.id)


async def test_kill_9_of_nats_under_traffic_loses_no_health_event_and_every_part_recovers(
    server: Server, kube: Kube
) -> None:
    settings = BusSettings(
        url=f"nats://127.0.0.1:{server.port}", name="chaos", reconnect_wait_s=0.1
    )
    buses = [await connect(settings, name=f"chaos-{n}") for n in ("agent", "healer", "view")]
    agent_bus, healer_bus, view_bus = buses
    await streams.init(agent_bus, settings)
    parts = await _start_parts(agent_bus, healer_bus, view_bus, kube)
    publisher, reporters, healer, view, healer_seen, view_seen = parts
    running = _long_lived()
    try:
        queued = _queue(reporters, BEFORE)
        await until(lambda: publisher.published >= BEFORE // 2, timeout_s=20, what="traffic")
        server.kill()  # under traffic: the rest of BEFORE is still queued
        queued += _queue(reporters, DURING)
        await asyncio.sleep(0.5)  # an outage the parts must notice
        await server.start()
        queued += _queue(reporters, AFTER)

        assert await publisher.flush(timeout_s=60), f"{len(publisher.outbox)} never acked"
        stored = await _stored_ids(agent_bus)
        assert sorted(stored) == sorted(queued), "lost or stored twice"
        await until(lambda: view_seen.ids >= set(queued), timeout_s=60, what="view saw all")
        await until(lambda: healer_seen.ids >= set(queued), timeout_s=60, what="healer saw all")

        # still consuming, nothing restarted: a new fingerprint, event and reservation arrive
        healer_fp_at = healer.last_seen[NODES[1]]
        late = reporters[0].health(_event(NODES[0]))
        reporters[1].offer([device(0), device(1)], now=2.0, loop_s=2.0, force=True)
        await _reserve(agent_bus, NODES[2])
        await until(lambda: late.id in view_seen.ids, timeout_s=30, what="view: new event")
        await until(lambda: late.id in healer_seen.ids, timeout_s=30, what="healer: new event")
        await until(
            lambda: len(view.state.nodes[NODES[1]].devices) == 2,
            timeout_s=30,
            what="view: new fingerprint",
        )
        await until(
            lambda: healer.last_seen[NODES[1]] > healer_fp_at,
            timeout_s=30,
            what="healer: new fingerprint",
        )
        await until(
            lambda: _reserved(view, NODES[2]), timeout_s=30, what="view: new reservation (KV)"
        )
        assert view.ready.is_set() and healer.ready.is_set()
        assert not view_seen.twice, "the view applied a replayed event again"
        died = [t.get_name() for t in running if t.done()]
        assert not died, f"tasks ended (restarted by hand?): {died}"
        assert len(running) >= 7, [t.get_name() for t in running]  # the loops were found
    finally:
        await view.stop()
        await healer.stop()
        for bus in buses:
            await bus.drain()


async def _start_parts(
    agent_bus: Bus, healer_bus: Bus, view_bus: Bus, kube: Kube
) -> tuple[Publisher, list[Reporter], Healer, ClusterView, Seen, Seen]:
    publisher = Publisher(agent_bus, capacity=10_000, retry_s=0.05)
    reporters = [Reporter(publisher, node=n, report_interval_s=60.0) for n in NODES]
    for reporter in reporters:
        reporter.offer([device(0)], now=1.0, loop_s=1.0)
    publish_task = asyncio.create_task(publisher.run(), name="chaos:publisher")

    healer_seen, view_seen = Seen(), Seen()
    healer = Healer(
        healer_bus,
        kube,
        HealerSettings(
            dry_run=True, retry_period_s=0.1, renew_deadline_s=1.0, lease_duration_s=1.5
        ),
        identity="chaos-healer",
        durable="chaos",
    )
    handle = healer._on_health

    async def on_health(items: list[Delivery[HealthEvent]]) -> None:
        await handle(items)  # the real handler first: a failing batch is redelivered
        for item in items:
            healer_seen.note(item.value)

    healer._on_health = on_health  # type: ignore[method-assign]
    view = ClusterView(view_bus, settings=SchedulerSettings())
    apply = view._on_health

    def view_health(item: Delivery[HealthEvent]) -> None:
        apply(item)
        view_seen.note(item.value)

    view._on_health = view_health  # type: ignore[method-assign]
    await healer.start()
    await view.start()
    await view.wait_ready(timeout_s=30)
    await until(lambda: healer.ready.is_set(), timeout_s=30, what="healer consuming")
    _PUBLISH_TASKS.append(publish_task)
    return publisher, reporters, healer, view, healer_seen, view_seen


_PUBLISH_TASKS: list[asyncio.Task[Any]] = []


@pytest.fixture(autouse=True)
async def _stop_publishers() -> AsyncIterator[None]:
    yield
    while _PUBLISH_TASKS:
        task = _PUBLISH_TASKS.pop()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _long_lived() -> list[asyncio.Task[Any]]:
    """The parts' loops: consumers, KV watch, staleness, sweep, publisher."""
    prefixes = ("healer:fp", "healer:alloc", "healer:health", "healer:sweep", "view:", "chaos:")
    return [t for t in asyncio.all_tasks() if t.get_name().startswith(prefixes) and not t.done()]


def _event(node: str) -> HealthEvent:
    """A discrete event the healer reads but acts on with no taint."""
    return HealthEvent(
        node=node, kind="ecc_corrected", severity="info", source="agent", time_s=1.0, device=0
    )


def _queue(reporters: list[Reporter], count: int) -> list[str]:
    return [
        reporters[i % len(reporters)].health(_event(NODES[i % len(NODES)])).id for i in range(count)
    ]


async def _stored_ids(bus: Bus) -> list[str]:
    """Every agent event id in HCS_HEALTH, once per stored copy."""
    sub = await bus.js.pull_subscribe(
        subjects.HEALTH_ALL,
        stream=streams.HEALTH,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL),
    )
    info = await sub.consumer_info()
    ids: list[str] = []
    decode = messages.decoder_for(HealthEvent).decode
    left = info.num_pending
    while left > 0:
        batch = await sub.fetch(min(left, 500), timeout=5)
        for msg in batch:
            event = decode(msg.data)
            if event.source == "agent":
                ids.append(event.id)
            await msg.ack()
        left -= len(batch)
    await sub.unsubscribe()
    return ids


async def _reserve(bus: Bus, node: str) -> None:
    doc = NodeReservations(
        node=node,
        reservations=(
            Reservation(
                pod=PodRef(namespace="ml", name="p", uid="u"),
                devices=(DeviceSlice(index=0, uuid="GPU-0", vram_mib=1024),),
                state="reserved",
                time_s=1.0,
            ),
        ),
    )
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(subjects.node_token(node), messages.encode(doc))


def _reserved(view: ClusterView, node: str) -> bool:
    return view.state.reservations_of(node) is not None
