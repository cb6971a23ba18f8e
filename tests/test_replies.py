"""``Bus.serve`` answers only into an inbox, on a real nats-server: a request
naming any other reply subject is dropped before it is decoded or handled,
logged once (subject, reply subject, sender) and counted by reason; the
service goes on answering."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from typing import Any

import pytest
import structlog
from nats.aio.msg import Msg
from structlog.testing import capture_logs

from hcs_bus import bus as bus_module
from hcs_bus import messages, subjects
from hcs_bus.bus import SENDER, Bus, connect
from hcs_bus.errors import BusTimeout
from hcs_bus.messages import Plan, PlanRequest, Requests
from hcs_bus.settings import BusSettings
from tests.metering import counted

SUBJECT = "hcs.test.serve"  # a subject of this test's own


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[MutableMapping[str, Any]]]:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as entries:
            monkeypatch.setattr(bus_module, "_log", structlog.get_logger("hcs.bus"))
            yield entries
    finally:
        structlog.configure(**saved)


class Handler:
    def __init__(self) -> None:
        self.seen: list[PlanRequest] = []

    async def __call__(self, request: PlanRequest) -> Plan:
        self.seen.append(request)
        return Plan(ok=True, model=request.namespace)


def request(namespace: str = "ml") -> PlanRequest:
    return PlanRequest(namespace=namespace, requests=Requests(vram_mib=1), dry_run=True)


def refused(reason: str) -> float:
    return counted("hcs_bus_replies_refused", subject=SUBJECT, reason=reason)


async def serving(
    bus: Bus,
    handler: Callable[[PlanRequest], Awaitable[Plan]],
    *,
    concurrency: int = 1,
    expires: bool = False,
    subject: str = SUBJECT,
) -> Any:
    sub = await bus.serve(
        subject,
        PlanRequest,
        handler,
        queue="q",
        on_bad=lambda reason: Plan(ok=False, reason=reason),
        concurrency=concurrency,
        expires=expires,
    )
    await bus.nc.flush()
    return sub


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_a_request_whose_reply_is_not_an_inbox_is_dropped_logged_and_counted(
    bus: Bus, logs: list[MutableMapping[str, Any]], concurrency: int
) -> None:
    handler = Handler()
    sub = await serving(bus, handler, concurrency=concurrency)
    landed: list[Msg] = []

    async def land(msg: Msg) -> None:
        landed.append(msg)

    watch = await bus.nc.subscribe("$JS.API.STREAM.PURGE.>", cb=land)
    before = refused("not_inbox")
    data = messages.encode(request("sneaky"))
    await bus.nc.publish(
        SUBJECT, data, reply="$JS.API.STREAM.PURGE.HCS_FP", headers={SENDER: "gpu-node-a"}
    )
    answer = await bus.request(SUBJECT, request("honest"), Plan, timeout_s=5.0)  # after it
    await bus.nc.flush()
    await watch.unsubscribe()
    await sub.unsubscribe()
    assert answer.ok and answer.model == "honest"
    assert [r.namespace for r in handler.seen] == ["honest"]  # never handled
    assert landed == []
    assert refused("not_inbox") - before == 1
    [line] = [e for e in logs if e["event"] == "reply_refused"]
    assert line["subject"] == SUBJECT and line["reply"] == "$JS.API.STREAM.PURGE.HCS_FP"
    assert line["sender"] == "gpu-node-a" and line["reason"] == "not_inbox"
    assert line["log_level"] == "warning"


async def test_a_request_without_a_reply_subject_is_dropped_and_the_service_goes_on(
    bus: Bus, logs: list[MutableMapping[str, Any]]
) -> None:
    handler = Handler()
    sub = await serving(bus, handler)
    before = refused("no_reply")
    await bus.nc.publish(SUBJECT, messages.encode(request("no-reply")))
    answer = await bus.request(SUBJECT, request("after"), Plan, timeout_s=5.0)
    await sub.unsubscribe()
    assert answer.ok and [r.namespace for r in handler.seen] == ["after"]
    assert refused("no_reply") - before == 1
    assert [e["reason"] for e in logs if e["event"] == "reply_refused"] == ["no_reply"]


async def test_an_answer_never_repeats_the_requests_headers(bus: Bus) -> None:
    sub = await serving(bus, Handler())
    reply = bus.nc.new_inbox()
    got: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

    async def on_answer(msg: Msg) -> None:
        got.set_result(msg)

    inbox = await bus.nc.subscribe(reply, cb=on_answer, max_msgs=1)
    headers = {"Nats-Rollup": "all", "KV-Operation": "PURGE", "Nats-Msg-Id": "x"}
    await bus.nc.publish(SUBJECT, messages.encode(request()), reply=reply, headers=headers)
    async with asyncio.timeout(5):
        answer = await got
    await inbox.unsubscribe()
    await sub.unsubscribe()
    assert messages.decode(answer.data, Plan).ok
    assert not set(answer.headers or {}) & set(headers)


async def test_a_request_names_its_sender_so_a_refusal_can_say_who_it_was(
    bus_settings: BusSettings, bus: Bus
) -> None:
    seen: asyncio.Future[Msg] = asyncio.get_running_loop().create_future()

    async def on_request(msg: Msg) -> None:
        if not seen.done():
            seen.set_result(msg)

    sub = await bus.nc.subscribe(SUBJECT, cb=on_request)
    await bus.nc.flush()
    asker = await connect(bus_settings, name="hcs-injector-test")
    try:
        with pytest.raises(BusTimeout):  # nobody answers: only the headers matter
            await asker.request(SUBJECT, request(), Plan, timeout_s=0.5)
    finally:
        await asker.nc.close()
    await sub.unsubscribe()
    assert (seen.result().headers or {}).get(SENDER) == "hcs-injector-test"


@pytest.mark.parametrize(
    "reply",
    [
        "_INBOX.abc.1",
        "_INBOX_INJECTOR.Zx81.7",
        "_INBOX_gpu-node-a.abc.1",
        "_INBOX_SIDECAR_ML.a",
    ],
)
def test_inboxes_are_answerable(reply: str) -> None:
    assert subjects.is_inbox(reply)


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "_INBOX",
        "_INBOX.",
        "_INBOX..x",
        "_INBOXX.a",
        "_INBOX.>",
        "_INBOX.*",
        "_INBOX.a b",
        "_INBOX.a\r\nPUB x 0",
        "_INBOX.a\x00",
        "$JS.API.STREAM.PURGE.KV_hcs_alloc",
        "$KV.hcs_alloc.gpu-node-a",
        "$JS.API._INBOX.x",
        "hcs.place",
        "x._INBOX.y",
    ],
)
def test_everything_else_is_not_an_inbox(reply: str) -> None:
    assert not subjects.is_inbox(reply)


def test_plans_that_pledge_and_dry_runs_go_to_different_subjects() -> None:
    assert subjects.place(dry_run=False) == subjects.PLACE == "hcs.place"
    assert subjects.place(dry_run=True) == subjects.PLACE_DRY == "hcs.place.dry"
