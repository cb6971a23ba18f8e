"""A request says how long its asker still waits (``Hcs-Wait-S``), on a real
nats-server: a service started with ``expires=True`` drops one that queued
past that, unhandled and unanswered, and counts it; its handler reads what is
left with ``time_left()``; a service without it, or a request that says
nothing, is handled as before."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hcs_bus import messages
from hcs_bus.bus import WAIT, Bus, time_left
from hcs_bus.errors import BusTimeout
from hcs_bus.messages import Plan, PlanRequest, Requests
from scheduler.plan.service import PLAN_BUDGET_S, plan_budget
from tests import test_replies as replies
from tests.metering import counted

SUBJECT = "hcs.test.expiry"  # a subject of this test's own


class Held:
    """A handler that holds the first request until let go, so the ones
    after it queue in the serving process."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.left: dict[str, float | None] = {}
        self.started = asyncio.Event()
        self.go = asyncio.Event()

    async def __call__(self, request: PlanRequest) -> Plan:
        self.seen.append(request.namespace)
        self.left[request.namespace] = time_left()
        if len(self.seen) == 1:
            self.started.set()
            await self.go.wait()
        return Plan(ok=True, model=request.namespace)


LATE_WAIT_S = 0.2


async def _past_its_wait(sub: Any) -> None:
    """Until the request queued behind the held one is past its wait as the
    serving process measures it: from when its client parsed the request,
    which on a loaded machine can be later than when its asker sent it (and
    gave up). Parsed by now at the latest, so its wait ends within
    ``LATE_WAIT_S`` from now."""
    async with asyncio.timeout(10):
        while sub.pending_msgs < 1:
            await asyncio.sleep(0.01)
    await asyncio.sleep(LATE_WAIT_S)  # the wait the request said: the event itself


def request(namespace: str) -> PlanRequest:
    return PlanRequest(namespace=namespace, requests=Requests(vram_mib=1), dry_run=True)


@pytest.mark.parametrize("expires", [True, False])
async def test_a_request_whose_asker_gave_up_while_it_queued_is_dropped_only_if_the_service_says_so(
    bus: Bus, expires: bool
) -> None:
    handler = Held()
    sub = await replies.serving(bus, handler, expires=expires, subject=SUBJECT)
    before = counted("hcs_bus_requests_expired", subject=SUBJECT)
    first = asyncio.create_task(bus.request(SUBJECT, request("first"), Plan, timeout_s=30.0))
    async with asyncio.timeout(10):
        await handler.started.wait()
    with pytest.raises(BusTimeout):  # its asker gives up while "first" holds the service
        await bus.request(SUBJECT, request("late"), Plan, timeout_s=LATE_WAIT_S)
    await _past_its_wait(sub)
    handler.go.set()
    assert (await first).model == "first"
    fresh = await bus.request(SUBJECT, request("fresh"), Plan, timeout_s=30.0)
    await sub.unsubscribe()
    assert fresh.ok and fresh.model == "fresh"
    expired = counted("hcs_bus_requests_expired", subject=SUBJECT) - before
    if expires:
        assert handler.seen == ["first", "fresh"] and expired == 1
    else:
        assert handler.seen == ["first", "late", "fresh"] and expired == 0
    left = handler.left["fresh"]
    assert left is not None and 0 < left <= 30.0


async def test_a_request_that_does_not_say_how_long_it_waits_is_handled_without_a_time_left(
    bus: Bus,
) -> None:
    handler = Held()
    handler.seen.append("")  # nothing is held
    sub = await replies.serving(bus, handler, expires=True, subject=SUBJECT)
    for said in (None, "soon", "-1", "nan"):
        headers = None if said is None else {WAIT: said}
        data = messages.encode(request(f"said-{said}"))
        answer = await bus.nc.request(SUBJECT, data, timeout=10.0, headers=headers)
        assert messages.decode(answer.data, Plan).model == f"said-{said}"
        assert handler.left[f"said-{said}"] is None
    await sub.unsubscribe()


async def test_a_request_with_no_wait_left_is_dropped_on_arrival(bus: Bus) -> None:
    handler = Held()
    handler.seen.append("")
    sub = await replies.serving(bus, handler, expires=True, subject=SUBJECT)
    before = counted("hcs_bus_requests_expired", subject=SUBJECT)
    answers: list[bytes] = []

    async def on_answer(msg: object) -> None:
        answers.append(msg.data)

    inbox = bus.nc.new_inbox()
    watch = await bus.nc.subscribe(inbox, cb=on_answer)
    await bus.nc.publish(
        SUBJECT, messages.encode(request("gone")), reply=inbox, headers={WAIT: "0"}
    )
    after = await bus.request(SUBJECT, request("after"), Plan, timeout_s=10.0)  # served in order
    await bus.nc.flush()
    await watch.unsubscribe()
    await sub.unsubscribe()
    assert after.model == "after" and "gone" not in handler.seen and answers == []
    assert counted("hcs_bus_requests_expired", subject=SUBJECT) - before == 1


def test_a_plan_that_queued_gets_half_of_what_its_asker_still_waits() -> None:
    assert plan_budget(None) == PLAN_BUDGET_S
    assert plan_budget(30.0) == PLAN_BUDGET_S
    assert plan_budget(PLAN_BUDGET_S) == PLAN_BUDGET_S / 2
    assert plan_budget(-1.0) == 0.0
