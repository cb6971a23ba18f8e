"""A burst of admissions against a replica that is slow to plan: every plan
is answered within 2 s, half of what the injector waits
(``injector.plan_timeout_s``), on a real nats-server. A summary that takes longer to build than ``max_age_s``
is rebuilt at most so often that building takes a fifth of the replica's
time; a plan that still runs past ``PLAN_BUDGET_S`` is answered on the
summary held, unpledged, and the pledge it makes later is released."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator

import pytest
from nats.aio.msg import Msg

from hcs_bus import kvkeys, messages, streams, subjects
from hcs_bus.bus import WAIT, Bus
from hcs_bus.messages import NodeFingerprint, Plan, PlanRequest, Requests
from hcs_bus.settings import InjectorSettings
from scheduler.ledger import pledge_rules as pledges
from scheduler.plan import service
from scheduler.plan.service import ask_plan
from scheduler.replica import Scheduler
from tests.metering import counted
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import node_fp, publish_fleet, until

NODES = tuple(f"gpu-{i}" for i in range(4))  # 32 A100-80G: room for 320 slices of 8 GiB
BUDGET_S = 2.0  # what a plan may take end to end here: half of what the injector waits


def _admission(i: int) -> PlanRequest:
    return PlanRequest(
        namespace="ml",
        requests=Requests(vram_mib=8 * 1024),
        pod_name=f"p{i}",
        admission_uid=f"admission-{i}",
    )


async def _replica(
    bus: Bus, start_scheduler: Start, fleet: tuple[NodeFingerprint, ...] = ()
) -> Scheduler:
    sched = await start_scheduler(bus, http=False)
    fleet = fleet or tuple(node_fp(n) for n in NODES)
    await publish_fleet(bus, *fleet)
    await until(lambda: len(sched.view.state.nodes) == len(fleet))
    sched.planner.max_age_s = 0.5  # as shipped (the fixture's replica rebuilds at every change)
    return sched


@contextlib.asynccontextmanager
async def _churning(sched: Scheduler) -> AsyncIterator[None]:
    """The view changing all the time, as binds change it during a burst."""

    async def churn() -> None:
        while True:
            sched.planner.changed(NODES[0])
            await asyncio.sleep(0.01)

    task = asyncio.create_task(churn())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _burst(bus: Bus, count: int) -> list[Plan | BaseException]:
    return await asyncio.gather(
        *(ask_plan(bus, _admission(i), timeout_s=BUDGET_S) for i in range(count)),
        return_exceptions=True,
    )


async def _pledge_keys(bus: Bus) -> list[str]:
    found = await kvkeys.stored_values(bus, streams.KV_ALLOC, wanted=pledges.is_pledge_key)
    return [key for key, _value in found]


async def test_a_burst_of_plans_against_a_slow_summary_gets_no_refusal(
    bus: Bus, start_scheduler: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = await _replica(bus, start_scheduler)
    parts = sched.planner._parts
    build = parts.summary

    def slow(nodes: object) -> object:
        time.sleep(0.6)  # a fleet whose fold takes longer than max_age_s; it blocks, as a fold does
        return build(nodes)  # type: ignore[arg-type]

    monkeypatch.setattr(parts, "summary", slow)
    async with _churning(sched):
        answers = await _burst(bus, 200)
    failed = [a if isinstance(a, BaseException) else a.reason for a in answers if not _ok(a)]
    assert not failed, f"{len(failed)} of 200 plans failed, e.g. {failed[:2]}"
    assert all(isinstance(a, Plan) and a.pledge for a in answers)  # none needed the shortcut


async def test_a_plan_past_its_budget_is_answered_unpledged_and_its_late_pledge_released(
    bus: Bus, start_scheduler: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    sched = await _replica(bus, start_scheduler)
    pledger = sched.planner.pledger
    assert pledger is not None
    place = pledger.place

    async def stalled(*args: object, **kwargs: object) -> Plan:
        await asyncio.sleep(BUDGET_S)  # the pledge's write stuck behind a busy bus
        return await place(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pledger, "place", stalled)
    loop = asyncio.get_running_loop()
    started = loop.time()
    answers = await _burst(bus, 20)
    took = loop.time() - started
    assert all(_ok(a) for a in answers), answers[:2]
    assert all(isinstance(a, Plan) and not a.pledge for a in answers)
    assert took < BUDGET_S
    # the pledges the stalled plans made once answered too late are released
    await until(lambda: not pledger.keyed.get("ml"), timeout_s=10)
    assert not await _pledge_keys(bus)
    assert service.PLAN_BUDGET_S < BUDGET_S / 2 < InjectorSettings().plan_timeout_s


async def test_a_plan_request_its_asker_no_longer_waits_for_is_neither_planned_nor_pledged(
    bus: Bus, start_scheduler: Start
) -> None:
    """The injector's request says how long it still waits; one that queued
    past that (here: it says 0) would pledge for an admission already refused."""
    await _replica(bus, start_scheduler)
    before = counted("hcs_bus_requests_expired", subject=subjects.PLACE)
    answers: list[Msg] = []

    async def on_answer(msg: Msg) -> None:
        answers.append(msg)

    inbox = bus.nc.new_inbox()
    watch = await bus.nc.subscribe(inbox, cb=on_answer)
    gone = messages.encode(_admission(0))
    await bus.nc.publish(subjects.PLACE, gone, reply=inbox, headers={WAIT: "0"})
    waiting = await ask_plan(bus, _admission(1), timeout_s=BUDGET_S)
    await bus.nc.flush()
    await watch.unsubscribe()
    assert waiting.ok and waiting.pledge and answers == []
    assert len(await _pledge_keys(bus)) == 1  # the waiting admission's only
    assert counted("hcs_bus_requests_expired", subject=subjects.PLACE) - before == 1


def _ok(answer: Plan | BaseException) -> bool:
    return isinstance(answer, Plan) and answer.ok


async def test_shortcut_plans_count_each_other_as_pledges_would(
    bus: Bus, start_scheduler: Start, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = (node_fp("gpu-a", "nvidia/A100-80G"), node_fp("gpu-h", "nvidia/H100-SXM"))
    sched = await _replica(bus, start_scheduler, fleet)
    pledger = sched.planner.pledger
    assert pledger is not None
    place = pledger.place

    async def stalled(*args: object, **kwargs: object) -> Plan:
        await asyncio.sleep(BUDGET_S)
        return await place(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pledger, "place", stalled)
    whole = [
        PlanRequest(
            namespace="ml",
            requests=Requests(devices=1),
            pod_name=f"w{i}",
            admission_uid=f"admission-w{i}",
        )
        for i in range(16)
    ]
    answers = await asyncio.gather(*(ask_plan(bus, r, timeout_s=BUDGET_S) for r in whole))
    assert all(a.ok and not a.pledge for a in answers), answers[0]
    # each class's eight devices promised once: the first shortcut plans fill
    # one class, the next ones see it full and take the other
    models = collections.Counter(a.model for a in answers)
    assert models == {"A100-80G": 8, "H100-SXM": 8}, models
    # the holds are read from their sums: while neither the view nor the
    # holds change, every plan gets the same charged summary, built once
    held = sched.planner._held_too(sched.planner._summary)  # type: ignore[arg-type]
    assert sched.planner._held_too(sched.planner._summary) is held  # type: ignore[arg-type]
    assert {k: s.pledged.whole_devices for k, s in held.classes.items()} == {
        "nvidia/A100-80G": 8,
        "nvidia/H100-SXM": 8,
    }
