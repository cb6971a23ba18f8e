"""Bus time and fingerprint order on a real nats-server: staleness on the
server's receive time, future boots dead-lettered, and no out-of-order
fingerprint left as a node's last message in HCS_FP."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from msgspec import structs

from agents.outbox import Item
from agents.reporting import Publisher, Reporter
from hcs_bus import messages, streams, subjects, tasks
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeFingerprint
from hcs_bus.settings import BusSettings, SchedulerSettings
from scheduler.report.computenode_loop import Mirror
from scheduler.view.follow_loop import ClusterView
from tests.view.factories import device, fingerprint

HOUR_S = 3600.0
AGENT_EPOCH_S = 1_700_000_000.0  # the agent's wall clock at loop time 0, before its error


async def _until(predicate: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.02)


class Statuses:
    """A ComputeNode status writer that keeps what it was given."""

    def __init__(self) -> None:
        self.by_node: dict[str, dict[str, Any]] = {}

    async def patch_compute_node_status(self, name: str, status: dict[str, Any]) -> None:
        self.by_node[name] = status


async def _last_stored(bus: Bus, node: str) -> NodeFingerprint:
    stored = await bus.js.get_last_msg(streams.FP, subjects.fp(node))
    return messages.decode(stored.data, NodeFingerprint)


async def _replayed(bus: Bus, node: str) -> tuple[int, int]:
    """The seq a fresh view and a fresh mirror hold for ``node`` after replaying HCS_FP."""
    view = ClusterView(bus, settings=SchedulerSettings())
    mirror = Mirror(bus, Statuses())
    await view.start()
    await mirror.start()
    try:
        await view.wait_ready(timeout_s=5)
        await _until(lambda: node in mirror.fingerprints)
        return view.state.nodes[node].fingerprint.seq, mirror.fingerprints[node].seq
    finally:
        await mirror.stop()
        await view.stop()


def _queued(reporter: Reporter, count: int) -> list[Item]:
    """``count`` fingerprints of ``reporter``, taken out of its publisher's queue."""
    for n in range(count):
        reporter.offer([device(0)], now=AGENT_EPOCH_S + n, loop_s=float(n), force=True)
    items = list(reporter.publisher.outbox.items)
    reporter.publisher.outbox.items.clear()
    return items


async def _publish(publisher: Publisher, *items: Item) -> None:
    for item in items:
        publisher.put(item)
    assert await publisher.flush(timeout_s=5)


@pytest.mark.parametrize("clock_off_s", [HOUR_S, -HOUR_S])
async def test_an_agent_whose_clock_is_an_hour_off_stays_fresh_while_it_reports(
    bus: Bus, clock_off_s: float
) -> None:
    stale_after_s = 1.0
    view = ClusterView(bus, settings=SchedulerSettings(stale_after_s=stale_after_s))
    went_stale: list[str] = []
    view.listeners.append(
        lambda node: went_stale.append(node) if view.state.nodes[node].stale else None
    )
    publisher = Publisher(bus, capacity=100, retry_s=0.05)
    reporter = Reporter(publisher, node="skewed", report_interval_s=0.1)
    loop = asyncio.get_running_loop()

    async def report(*, for_s: float, clock_off_s: float) -> None:
        until_s = loop.time() + for_s
        while loop.time() < until_s:
            wall_s = AGENT_EPOCH_S + loop.time() + clock_off_s
            reporter.offer([device(0)], now=wall_s, loop_s=loop.time(), force=True)
            await asyncio.sleep(0.1)

    draining = tasks.start(publisher.run(), name="test:publisher")
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        # it boots with its clock an hour off, then the clock is set right
        await report(for_s=2.5 * stale_after_s, clock_off_s=clock_off_s)
        await report(for_s=2.5 * stale_after_s, clock_off_s=0.0)
        assert await publisher.flush(timeout_s=5)
        await _until(lambda: view.state.nodes["skewed"].fingerprint.seq == reporter.seq)
        assert went_stale == [] and not view.state.nodes["skewed"].stale
        await _until(lambda: view.state.nodes["skewed"].stale, timeout_s=4 * stale_after_s)
        assert went_stale == ["skewed"]  # silent now: stale, as it must be
    finally:
        await view.stop()
        await tasks.stop(draining)
    assert (await bus.js.stream_info(streams.DLQ)).state.messages == 0
    assert await _replayed(bus, "skewed") == (reporter.seq, reporter.seq)


async def test_a_node_whose_last_fingerprint_is_old_is_stale_as_soon_as_the_view_is_ready(
    bus: Bus,
) -> None:
    old = fingerprint("gone", devices=1)
    await bus.publish(subjects.fp("gone"), old, msg_id="gone:b1:1")
    await asyncio.sleep(1.2)  # the server's clock moves on: the fingerprint grows old
    live = fingerprint("live", devices=1)
    await bus.publish(subjects.fp("live"), live, msg_id="live:b1:1")
    view = ClusterView(bus, settings=SchedulerSettings(stale_after_s=1.0))
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        assert view.state.nodes["gone"].stale and not view.state.nodes["live"].stale
    finally:
        await view.stop()


async def test_a_fingerprint_claiming_a_boot_in_the_future_is_dead_lettered_once_with_the_reason(
    bus: Bus,
) -> None:
    agent_now_s = AGENT_EPOCH_S - HOUR_S  # whatever the agent's clock says
    honest = structs.replace(
        fingerprint("honest", devices=1, time_s=agent_now_s), boot_s=agent_now_s - 60
    )
    claims = structs.replace(
        fingerprint("claims", devices=1, time_s=agent_now_s), boot_s=agent_now_s + HOUR_S
    )
    await bus.publish(subjects.fp("honest"), honest, msg_id="honest:b1:1")
    await bus.publish(subjects.fp("claims"), claims, msg_id="claims:b1:1")
    settings = SchedulerSettings(clock_skew_tolerance_s=30.0)
    views = [ClusterView(bus, settings=settings) for _ in range(2)]  # two replicas replay it
    statuses = Statuses()
    mirror = Mirror(bus, statuses, clock_skew_tolerance_s=30.0)
    await mirror.start()
    try:
        for view in views:
            await view.start()
            await view.wait_ready(timeout_s=5)
            assert set(view.state.nodes) == {"honest"}
        await _until(lambda: "honest" in statuses.by_node)
        assert set(mirror.fingerprints) == {"honest"}
    finally:
        await mirror.stop()
        for view in views:
            await view.stop()  # waits for the letters it queued
    info = await bus.js.stream_info(streams.DLQ)
    assert info.state.messages == 1
    letter = await bus.js.get_msg(streams.DLQ, info.state.last_seq)
    assert letter.subject == subjects.dlq(subjects.fp("claims"))
    reason = (letter.headers or {})["Hcs-Reason"]
    assert reason.startswith("fingerprint boot_s claims a boot 3600 s after the server received")
    assert "tolerance 30 s" in reason


async def test_an_out_of_order_fingerprint_does_not_become_the_node_state_after_replay(
    bus: Bus,
) -> None:
    """One boot's fingerprints through two writers: one stored seq 1 and held
    seq 3 back while the other stored 2, 4 and 5."""
    current = Publisher(bus, capacity=100, retry_s=0.05)
    held = Publisher(bus, capacity=100, retry_s=0.05)
    reporter = Reporter(current, node="n", report_interval_s=60.0, boot_id="b")
    one, two, three, four, five = _queued(reporter, 5)
    running = [tasks.start(p.run(), name=f"test:{i}") for i, p in enumerate((current, held))]
    try:
        await _publish(held, one)
        await _publish(current, two, four, five)
        await _publish(held, three)
    finally:
        await tasks.stop(*running)
    assert held.superseded == 1 and (await _last_stored(bus, "n")).seq == 5
    assert await _replayed(bus, "n") == (5, 5)


async def test_a_late_fingerprint_of_a_replaced_agent_process_is_not_stored(bus: Bus) -> None:
    old = Reporter(Publisher(bus, capacity=100), node="n", report_interval_s=60.0, boot_id="a")
    new = Reporter(Publisher(bus, capacity=100), node="n", report_interval_s=60.0, boot_id="b")
    old_items, new_items = _queued(old, 8), _queued(new, 2)
    running = [tasks.start(r.publisher.run(), name=f"test:{r.boot_id}") for r in (old, new)]
    try:
        await _publish(old.publisher, *old_items[:6])
        await _publish(new.publisher, *new_items)  # the new process takes the subject over
        await _publish(old.publisher, *old_items[6:])  # what the old one still had queued
    finally:
        await tasks.stop(*running)
    assert old.publisher.superseded == 2
    last = await _last_stored(bus, "n")
    assert (last.boot_id, last.seq) == ("b", 2)


async def test_live_followers_ignore_an_out_of_order_fingerprint_stored_without_expectation(
    bus: Bus,
) -> None:
    view = ClusterView(bus, settings=SchedulerSettings())
    mirror = Mirror(bus, Statuses())
    await view.start()
    await mirror.start()
    try:
        await view.wait_ready(timeout_s=5)
        await bus.publish(subjects.fp("n"), fingerprint("n", seq=5, devices=2), msg_id="n:b1:5")
        await _until(lambda: "n" in view.state.nodes and "n" in mirror.fingerprints)
        late = fingerprint("n", seq=3, devices=8)
        await bus.publish(subjects.fp("n"), late, msg_id="n:b1:3")
        await _until(lambda: view.state.stale_ignored == 1 and mirror.order.ignored == 1)
        assert (
            view.state.nodes["n"].fingerprint.seq == 5 and len(view.state.nodes["n"].devices) == 2
        )
        assert mirror.fingerprints["n"].seq == 5
    finally:
        await mirror.stop()
        await view.stop()


async def test_a_publisher_whose_stream_was_made_again_stores_its_next_fingerprint(
    bus: Bus, bus_settings: BusSettings
) -> None:
    publisher = Publisher(bus, capacity=100, retry_s=0.05)
    reporter = Reporter(publisher, node="n", report_interval_s=60.0)
    first, second = _queued(reporter, 2)
    draining = tasks.start(publisher.run(), name="test:publisher")
    try:
        await _publish(publisher, first)
        await bus.js.delete_stream(streams.FP)
        await streams.init(bus, bus_settings)
        await _publish(publisher, second)
    finally:
        await tasks.stop(draining)
    assert publisher.superseded == 0 and (await _last_stored(bus, "n")).seq == 2
