"""The bus wrapper against a real nats-server."""

from __future__ import annotations

import asyncio

import msgspec
from nats.js.api import DeliverPolicy

from hcs_bus import messages, subjects
from hcs_bus.bus import Bus, Consumer, Delivery, Follower
from hcs_bus.messages import HealthEvent
from hcs_bus.streams import HEALTH


def _event(node: str, code: int) -> HealthEvent:
    return HealthEvent(
        node=node, kind="xid", severity="fatal", source="probe", time_s=float(code), code=code
    )


async def test_a_retried_publish_with_the_same_id_is_stored_once(bus: Bus) -> None:
    seq1 = await bus.publish(subjects.health("n1"), _event("n1", 79), msg_id="n1:b:1")
    seq2 = await bus.publish(subjects.health("n1"), _event("n1", 79), msg_id="n1:b:1")
    assert seq1 == seq2
    info = await bus.js.stream_info(HEALTH)
    assert info.state.messages == 1


async def test_publish_carries_a_w3c_traceparent(bus: Bus) -> None:
    from hcs_bus.telemetry import tracer

    with tracer("test").start_as_current_span("admission"):
        await bus.publish(subjects.health("n1"), _event("n1", 1), msg_id="tp:1")
    msg = await bus.js.get_last_msg(HEALTH, subjects.health("n1"))
    assert msg.headers is not None
    traceparent = msg.headers.get("traceparent", "")
    assert traceparent.startswith("00-") and len(traceparent.split("-")) == 4


async def test_an_undecodable_message_goes_to_the_dlq_and_the_consumer_goes_on(
    bus: Bus,
) -> None:
    await bus.js.publish(subjects.health("n1"), b"{not json", headers={"Nats-Msg-Id": "bad"})
    await bus.publish(subjects.health("n1"), _event("n1", 48), msg_id="good")
    got: list[Delivery[HealthEvent]] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        got.extend(items)

    consumer = Consumer(bus, stream=HEALTH, kind=HealthEvent, handle=handle, durable="t-dlq")
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(5):
            while not got:
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert [d.value.code for d in got] == [48]
    assert consumer.dead == 1
    dead = await bus.js.get_last_msg("HCS_DLQ", subjects.dlq(subjects.health("n1")))
    assert dead.data == b"{not json"
    assert dead.headers and dead.headers["Hcs-Origin-Subject"] == subjects.health("n1")


async def test_a_follower_replays_the_latest_of_every_node(bus: Bus) -> None:
    for node in ("a", "b"):
        for code in (1, 2, 3):
            await bus.publish(subjects.health(node), _event(node, code), msg_id=f"{node}{code}")
    items: list[Delivery[HealthEvent]] = []
    follower = Follower(
        bus,
        stream=HEALTH,
        subject=subjects.HEALTH_ALL,
        kind=HealthEvent,
        handle=items.append,
        deliver=DeliverPolicy.LAST_PER_SUBJECT,
    )
    await follower.start()
    try:
        async with asyncio.timeout(5):
            await follower.caught_up.wait()
    finally:
        await follower.stop()
    assert follower.dead == 0
    assert sorted((d.value.node, d.value.code) for d in items) == [("a", 3), ("b", 3)]


async def test_request_reply_answers_from_a_queue_group(bus: Bus) -> None:
    async def answer(req: messages.PlanRequest) -> messages.Plan:
        return messages.Plan(ok=True, vendor="nvidia", reason=req.namespace)

    sub = await bus.serve(
        "t.place",
        messages.PlanRequest,
        answer,
        queue="q",
        on_bad=lambda why: messages.Plan(ok=False, reason=why),
    )
    try:
        plan = await bus.request(
            "t.place",
            messages.PlanRequest(namespace="ml", requests=messages.Requests(vram_mib=1)),
            messages.Plan,
            timeout_s=1.0,
        )
        assert plan.ok and plan.reason == "ml"
        bad = await bus.nc.request("t.place", b"garbage", timeout=1.0)
        reply = msgspec.json.decode(bad.data)
        assert reply["ok"] is False and "bad request" in reply["reason"]
    finally:
        await sub.unsubscribe()


async def test_a_request_waits_within_its_budget_for_a_responder_to_appear(bus: Bus) -> None:
    async def answer(req: messages.PlanRequest) -> messages.Plan:
        return messages.Plan(ok=True, reason="late")

    async def serve_later() -> object:
        await asyncio.sleep(0.3)
        return await bus.serve(
            "t.late",
            messages.PlanRequest,
            answer,
            queue="q",
            on_bad=lambda why: messages.Plan(ok=False, reason=why),
        )

    server = asyncio.create_task(serve_later())
    plan = await bus.request(
        "t.late",
        messages.PlanRequest(namespace="ml", requests=messages.Requests(vram_mib=1)),
        messages.Plan,
        timeout_s=2.0,
    )
    sub = await server
    await sub.unsubscribe()  # type: ignore[attr-defined]
    assert plan.ok and plan.reason == "late"


async def test_a_request_nobody_answers_times_out_within_its_budget(bus: Bus) -> None:
    from hcs_bus.errors import BusTimeout

    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        await bus.request(
            "t.nobody",
            messages.PlanRequest(namespace="ml", requests=messages.Requests()),
            messages.Plan,
            timeout_s=0.3,
        )
    except BusTimeout as exc:
        assert "t.nobody" in str(exc)
    else:
        raise AssertionError("a request nobody answers must time out")
    assert 0.25 <= loop.time() - started < 1.0


async def test_a_handler_that_fails_answers_with_the_reason_instead_of_a_timeout(
    bus: Bus,
) -> None:
    async def broken(req: messages.PlanRequest) -> messages.Plan:
        raise RuntimeError(f"quota store down for {req.namespace}")

    sub = await bus.serve(
        "t.broken",
        messages.PlanRequest,
        broken,
        queue="q",
        on_bad=lambda why: messages.Plan(ok=False, reason=why),
    )
    try:
        plan = await bus.request(
            "t.broken",
            messages.PlanRequest(namespace="ml", requests=messages.Requests(vram_mib=1)),
            messages.Plan,
            timeout_s=2.0,
        )
    finally:
        await sub.unsubscribe()
    assert not plan.ok and "quota store down for ml" in plan.reason


async def test_a_follower_whose_handler_fails_on_a_message_still_catches_up(bus: Bus) -> None:
    for code in (1, 2, 3):
        await bus.publish(subjects.health("n1"), _event("n1", code), msg_id=f"f{code}")
    seen: list[int] = []

    def handle(item: Delivery[HealthEvent]) -> None:
        if item.value.code == 3:  # the last replayed message
            raise RuntimeError("a bug in a handler")
        seen.append(item.value.code or 0)

    follower = Follower(
        bus, stream=HEALTH, subject=subjects.HEALTH_ALL, kind=HealthEvent, handle=handle
    )
    await follower.start()
    try:
        async with asyncio.timeout(5):
            await follower.caught_up.wait()
        await bus.publish(subjects.health("n1"), _event("n1", 4), msg_id="f4")
        async with asyncio.timeout(5):
            while 4 not in seen:
                await asyncio.sleep(0.02)
    finally:
        await follower.stop()
    assert seen == [1, 2, 4] and follower.failed == 1


async def test_a_consumer_survives_an_unexpected_fetch_error_and_goes_on(bus: Bus) -> None:
    got: list[int] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        got.extend(d.value.code or 0 for d in items)

    consumer = Consumer(
        bus,
        stream=HEALTH,
        kind=HealthEvent,
        handle=handle,
        durable="t-watchdog",
        fetch_timeout_s=0.1,
    )
    await consumer.start()
    assert consumer._sub is not None
    real_fetch = consumer._sub.fetch
    failures = [RuntimeError("a fetch that broke in a new way")]

    async def flaky(*args: object, **kwargs: object) -> object:
        if failures:
            raise failures.pop()
        return await real_fetch(*args, **kwargs)  # type: ignore[arg-type]

    consumer._sub.fetch = flaky  # type: ignore[method-assign]
    task = asyncio.create_task(consumer.run())
    try:
        await bus.publish(subjects.health("n1"), _event("n1", 7), msg_id="w7")
        async with asyncio.timeout(5):
            while 7 not in got:
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    assert failures == [] and got == [7]


def test_a_free_port_lies_below_the_kernels_ephemeral_range_and_is_free_on_every_address() -> None:
    """A port the kernel hands out to outgoing connections could be taken
    before the server it was picked for listens on it."""
    import socket
    from pathlib import Path

    from hcs_bus.natsserver import free_port

    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    picked = [free_port() for _ in range(500)]  # never the same one twice
    ports = set(picked)
    assert all(p < low for p in ports) and len(ports) == len(picked)
    with socket.socket() as sock:
        sock.bind(("", ports.pop()))  # 0.0.0.0, as a kubelet or nats-server binds
