"""Consumers survive any bytes, against a real nats-server: poison goes to the
DLQ once per stream sequence (replays too), readiness never waits on it, and
a loop that still dies is restarted and counted."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import msgspec
import pytest
from nats.js.api import DeliverPolicy

from hcs_bus import messages, subjects, tasks
from hcs_bus.bus import Bus, Consumer, Delivery, Follower
from hcs_bus.errors import PermanentError, TemporaryError
from hcs_bus.messages import HealthEvent, NodeFingerprint
from hcs_bus.settings import SchedulerSettings
from hcs_bus.streams import DLQ, HEALTH
from hcs_bus.telemetry import metrics_text
from scheduler.view.follow_loop import ClusterView

GOOD = {
    "type": "health_event",
    "node": "n1",
    "kind": "xid",
    "severity": "fatal",
    "source": "probe",
    "time_s": 1.0,
}
POISON: dict[str, bytes] = {
    "invalid utf-8": b'{"type":"health_event","node":"n1\xff\xfe","kind":"xid"}',
    "2,000-deep nesting": b'{"type":"health_event","from_a_newer_agent":'
    + b'{"a":' * 2000
    + b"1"
    + b"}" * 2000
    + b"}",
    "a wrong type": msgspec.json.encode({**GOOD, "time_s": "yesterday"}),
    "a huge field": msgspec.json.encode({**GOOD, "message": "x" * (900 * 1024)}),
    "not json at all": b"\x00\x01garbage",
}
# what the dead letter's reason names (the deep nesting: msgspec gives up on
# the depth, or, under a raised recursion limit, skips it and finds no node)
REASONS: dict[str, tuple[str, ...]] = {
    "invalid utf-8": ("UnicodeDecodeError", "Invalid UTF-8"),  # msgspec < 0.23, >= 0.23
    "2,000-deep nesting": ("RecursionError", "missing required field `node`"),
    "a wrong type": ("ValidationError",),
    "a huge field": ("too large",),
    "not json at all": ("DecodeError",),
}


def _event(node: str, code: int) -> HealthEvent:
    return HealthEvent(
        node=node, kind="xid", severity="fatal", source="probe", time_s=float(code), code=code
    )


async def _publish_raw(bus: Bus, subject: str, *bodies: bytes) -> None:
    for start in range(0, len(bodies), 500):
        acks = [await bus.js.publish_async(subject, body) for body in bodies[start : start + 500]]
        await asyncio.gather(*acks)


async def _dead_letters(bus: Bus) -> int:
    return int((await bus.js.stream_info(DLQ)).state.messages)


async def _until(check: Callable[[], bool], *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.01)


async def _running(consumer: Consumer[HealthEvent], body: Callable[[], Awaitable[None]]) -> None:
    await consumer.start()
    task = tasks.start(consumer.run(), name="test:consumer")
    try:
        await body()
    finally:
        await tasks.stop(task)


def _restarts_metric(task: str) -> float:
    page = metrics_text().decode()
    pattern = rf'^hcs_task_restarts_total\{{[^}}]*task="{re.escape(task)}"[^}}]*\}} (\S+)$'
    found = re.search(pattern, page, re.M)
    return float(found.group(1)) if found else 0.0


async def test_every_kind_of_poison_goes_to_the_dlq_with_its_reason_and_the_consumer_goes_on(
    bus: Bus,
) -> None:
    subject = subjects.health("n1")
    await _publish_raw(bus, subject, *POISON.values())
    await bus.publish(subject, _event("n1", 48), msg_id="good-48")
    got: list[int] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        got.extend(d.value.code or 0 for d in items)

    consumer = Consumer(bus, stream=HEALTH, kind=HealthEvent, handle=handle, durable="t-poison")

    async def body() -> None:
        await _until(lambda: got == [48])
        await _until(lambda: consumer.caught_up.is_set())

    await _running(consumer, body)
    assert consumer.dead == len(POISON) and consumer.restarts == 0
    assert await _dead_letters(bus) == len(POISON)
    for seq, name in enumerate(POISON, start=1):
        letter = await bus.js.get_msg(DLQ, seq)
        assert letter.headers is not None
        assert letter.headers["Hcs-Origin-Subject"] == subject
        assert letter.headers["Hcs-Origin-Seq"] == str(seq)
        assert any(r in letter.headers["Hcs-Reason"] for r in REASONS[name]), name
        assert letter.data == POISON[name]


async def test_poison_as_the_newest_message_of_each_stream_does_not_keep_a_new_replica_unready(
    bus: Bus,
) -> None:
    fp = NodeFingerprint(node="n1", agent_version="t", boot_id="b", seq=1, time_s=1.0, devices=())
    await bus.publish(subjects.fp("n1"), fp, msg_id="fp-1")
    await bus.publish(subjects.health("n1"), _event("n1", 31), msg_id="h-31")
    await _publish_raw(bus, subjects.fp("n2"), POISON["invalid utf-8"])
    await _publish_raw(bus, subjects.health("n1"), POISON["2,000-deep nesting"])
    view = ClusterView(bus, settings=SchedulerSettings())
    await view.start()
    try:
        await view.wait_ready(timeout_s=5)
        assert set(view.state.nodes) == {"n1"}
    finally:
        await view.stop()
    assert await _dead_letters(bus) == 2


@pytest.mark.parametrize("how", ["follower", "ephemeral consumer"])
async def test_a_thousand_poison_messages_then_two_restarts_leave_exactly_a_thousand_dead_letters(
    bus: Bus, how: str
) -> None:
    bodies = [b'{"type":"health_event","node":"\xff%d"}' % i for i in range(1000)]
    await _publish_raw(bus, subjects.health("n1"), *bodies)
    seen = 0
    for _replica in range(3):  # the first, then two restarts
        seen += await (_replay_follower(bus) if how == "follower" else _replay_consumer(bus))
    assert seen == 3000  # every replica read all of it ...
    assert await _dead_letters(bus) == 1000  # ... and the DLQ holds each one once


async def _replay_follower(bus: Bus) -> int:
    follower = Follower(
        bus, stream=HEALTH, subject=subjects.HEALTH_ALL, kind=HealthEvent, handle=lambda _: None
    )
    await follower.start()
    try:
        await asyncio.wait_for(follower.caught_up.wait(), 10)
        await asyncio.wait_for(follower.dead_lettered(), 10)
    finally:
        await follower.stop()
    return follower.dead


async def _replay_consumer(bus: Bus) -> int:
    async def handle(_items: list[Delivery[HealthEvent]]) -> None:
        raise AssertionError("poison must never reach a handler")

    consumer = Consumer(
        bus,
        stream=HEALTH,
        kind=HealthEvent,
        handle=handle,
        deliver=DeliverPolicy.ALL,
        ack_all=True,
        fetch_timeout_s=0.2,
    )

    async def body() -> None:
        await _until(lambda: consumer.dead == 1000, timeout_s=10)

    await _running(consumer, body)
    return consumer.dead


async def test_a_consumer_whose_handler_raises_is_restarted_and_processes_the_next_message(
    bus: Bus,
) -> None:
    got: list[int] = []
    crashes = [RuntimeError("a bug met in production")]

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        if crashes:
            raise crashes.pop()
        got.extend(d.value.code or 0 for d in items)

    consumer = Consumer(
        bus,
        stream=HEALTH,
        kind=HealthEvent,
        handle=handle,
        durable="t-crash",
        fetch_timeout_s=0.1,
        retry_delay_s=0.05,
        restart_backoff_s=0.05,
    )
    before = _restarts_metric(consumer.name)

    async def body() -> None:
        await bus.publish(subjects.health("n1"), _event("n1", 1), msg_id="c1")
        await _until(lambda: consumer.restarts == 1)
        await bus.publish(subjects.health("n1"), _event("n1", 2), msg_id="c2")
        await _until(lambda: 2 in got)
        await _until(lambda: 1 in got)  # the batch that crashed is delivered again

    await _running(consumer, body)
    assert consumer.restarts == 1 and sorted(got) == [1, 2]
    assert _restarts_metric(consumer.name) == before + 1


async def test_a_message_that_fails_on_every_delivery_is_buried_alone(bus: Bus) -> None:
    for code in (1, 13, 2):
        await bus.publish(subjects.health("n1"), _event("n1", code), msg_id=f"m{code}")
    handled: list[int] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        if any(d.value.code == 13 for d in items):
            raise TemporaryError("kube unreachable\r\nInjected: header", delay_s=0.01)
        handled.extend(d.value.code or 0 for d in items)

    consumer = Consumer(
        bus,
        stream=HEALTH,
        kind=HealthEvent,
        handle=handle,
        durable="t-last",
        max_deliver=2,
        fetch_timeout_s=0.1,
    )

    async def body() -> None:
        await _until(lambda: sorted(handled) == [1, 2])

    await _running(consumer, body)
    assert await _dead_letters(bus) == 1
    letter = await bus.js.get_msg(DLQ, 1)
    assert messages.decode(letter.data, HealthEvent).code == 13
    assert letter.headers is not None and "\n" not in letter.headers["Hcs-Reason"]
    assert "kube unreachable" in letter.headers["Hcs-Reason"]
    info = await bus.js.consumer_info(HEALTH, "t-last")
    assert info.num_ack_pending == 0 and info.num_pending == 0  # all three settled


async def test_a_refused_batch_is_dead_lettered_and_terminated(bus: Bus) -> None:
    await bus.publish(subjects.health("n1"), _event("n1", 5), msg_id="p5")
    calls: list[int] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        calls.append(len(items))
        raise PermanentError("never valid")

    consumer = Consumer(
        bus, stream=HEALTH, kind=HealthEvent, handle=handle, durable="t-perm", fetch_timeout_s=0.1
    )

    async def body() -> None:
        await _until(lambda: bool(calls))
        async with asyncio.timeout(5):
            while (await bus.js.consumer_info(HEALTH, "t-perm")).num_ack_pending:
                await asyncio.sleep(0.02)

    await _running(consumer, body)
    assert calls == [1] and await _dead_letters(bus) == 1


async def test_a_letter_too_large_to_copy_whole_is_truncated_and_says_so(bus: Bus) -> None:
    body = b"x" * (bus.nc.max_payload - 100)
    await _publish_raw(bus, subjects.health("n1"), body)
    follower = Follower(
        bus, stream=HEALTH, subject=subjects.HEALTH_ALL, kind=HealthEvent, handle=lambda _: None
    )
    await follower.start()
    try:
        await asyncio.wait_for(follower.caught_up.wait(), 5)
        await asyncio.wait_for(follower.dead_lettered(), 5)
    finally:
        await follower.stop()
    letter = await bus.js.get_msg(DLQ, 1)
    assert letter.headers is not None and letter.headers["Hcs-Truncated-From"] == str(len(body))
    assert 0 < len(letter.data) < len(body)


async def test_a_request_of_invalid_utf8_is_answered_not_left_to_time_out(bus: Bus) -> None:
    async def answer(req: messages.PlanRequest) -> messages.Plan:
        return messages.Plan(ok=True)

    sub = await bus.serve(
        "t.utf8",
        messages.PlanRequest,
        answer,
        queue="q",
        on_bad=lambda why: messages.Plan(ok=False, reason=why),
    )
    try:
        reply = await bus.nc.request("t.utf8", b'{"namespace":"\xff"}', timeout=2.0)
    finally:
        await sub.unsubscribe()
    decoded = msgspec.json.decode(reply.data)
    assert decoded["ok"] is False and "bad request" in decoded["reason"]


async def test_with_unlimited_deliveries_a_temporary_failure_is_retried_never_buried(
    bus: Bus,
) -> None:
    await bus.publish(subjects.health("n1"), _event("n1", 9), msg_id="u9")
    failures = [TemporaryError("kube unreachable", delay_s=0.01) for _ in range(3)]
    handled: list[int] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        if failures:
            raise failures.pop()
        handled.extend(d.value.code or 0 for d in items)

    consumer = Consumer(
        bus,
        stream=HEALTH,
        kind=HealthEvent,
        handle=handle,
        durable="t-unlimited",
        max_deliver=-1,
        fetch_timeout_s=0.1,
    )

    async def body() -> None:
        await _until(lambda: handled == [9])

    await _running(consumer, body)
    assert failures == [] and await _dead_letters(bus) == 0
