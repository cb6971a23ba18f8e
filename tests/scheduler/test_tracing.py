"""One trace follows a pod: the injector's admission, the plan it asks for
over hcs.place, the extender's bind (continued from the pod's
hcs.io/traceparent) and every consumer of the AllocationEvent it publishes;
the trace context travels in NATS headers through the bus wrappers only."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import json
import ssl
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import jsonpatch
import pytest
from nats.js.api import DeliverPolicy
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents.reporting import Publisher, Reporter
from hcs_bus import streams, subjects, tasks
from hcs_bus.bus import Bus, Consumer, Delivery
from hcs_bus.messages import AllocationEvent, HealthEvent
from hcs_bus.settings import Settings, replace
from hcs_bus.telemetry import span, tracing_into
from injector.serving import Injector
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import FakeKube, node_fp, post, publish_fleet, until

REVIEW = Path(__file__).parents[1] / "injector/fixtures/admission-review-pod-create-request.json"
NODE = "gpu-trace-a"
T = TypeVar("T")


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    found = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(found))
    with tracing_into(provider):
        yield found


def _review() -> dict[str, Any]:
    doc = json.loads(REVIEW.read_text())
    pod = doc["request"]["object"]
    pod["metadata"]["annotations"] = {"hcs.io/vendors": "nvidia"}
    for part in ("limits", "requests"):
        section = pod["spec"]["containers"][0]["resources"][part]
        section.pop("hcs.io/gpu")
        section["ai.compute/vram"] = "16Gi"
    doc["request"]["dryRun"] = False
    return doc  # type: ignore[no-any-return]


async def _admit(bus: Bus, doc: dict[str, Any]) -> dict[str, Any]:
    """The injector's admission of ``doc``; the pod as the API server stores it."""
    settings = replace(Settings(), injector={"plan_timeout_s": 3.0})
    injector = Injector(bus, settings, ssl_context=ssl.create_default_context())
    answer = await injector.admitter.admit(json.dumps(doc).encode(), budget_s=3.0)
    response = json.loads(answer.body)["response"]
    assert response["allowed"] is True, response
    pod = copy.deepcopy(doc["request"]["object"])
    pod = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    pod["metadata"].update(name=f"traced-{uuid.uuid4().hex[:6]}", uid=str(uuid.uuid4()))
    return pod  # type: ignore[no-any-return]


def _one(spans: list[ReadableSpan], name: str) -> ReadableSpan:
    found = [s for s in spans if s.name == name]
    assert len(found) == 1, [s.name for s in spans]
    return found[0]


def _parent_of(child: ReadableSpan) -> int | None:
    return child.parent.span_id if child.parent is not None else None


def _assert_child(child: ReadableSpan, *, of: ReadableSpan) -> None:
    assert child.context.trace_id == of.context.trace_id
    assert _parent_of(child) == of.context.span_id


@contextlib.asynccontextmanager
async def _consuming(
    bus: Bus,
    *,
    stream: str,
    kind: type[T],
    subject: str,
    handle: Callable[[list[Delivery[T]]], Awaitable[None]],
) -> AsyncIterator[None]:
    """A consumer of the messages published on ``subject`` from now on, running
    (through the bus wrappers, so it traces) until the block ends."""
    consumer = Consumer(
        bus,
        stream=stream,
        kind=kind,
        handle=handle,
        filter_subject=subject,
        deliver=DeliverPolicy.NEW,
        fetch_timeout_s=0.2,
    )
    await consumer.start()
    running = tasks.start(consumer.run(), name=f"test:consume {subject}")
    try:
        yield
    finally:
        await tasks.stop(running)


def _setting(seen: asyncio.Event) -> Callable[[list[Delivery[HealthEvent]]], Awaitable[None]]:
    async def handle(_items: list[Delivery[HealthEvent]]) -> None:
        seen.set()

    return handle


async def test_one_trace_joins_admission_plan_bind_and_the_allocation_consumer(
    bus: Bus, start_scheduler: Start, exporter: InMemorySpanExporter
) -> None:
    await publish_fleet(bus, node_fp(NODE))
    sched = await start_scheduler(bus, FakeKube())
    await until(lambda: NODE in sched.view.state.nodes)
    got: list[AllocationEvent] = []

    async def audit(items: list[Delivery[AllocationEvent]]) -> None:
        got.extend(item.value for item in items)

    alloc = subjects.alloc(NODE)
    async with _consuming(
        bus, stream=streams.ALLOC, kind=AllocationEvent, subject=alloc, handle=audit
    ):
        pod = await _admit(bus, _review())
        assert pod["metadata"]["annotations"]["hcs.io/traceparent"]
        status, _ = await post(sched.port, "filter", {"Pod": pod, "NodeNames": [NODE]})
        assert status == 200
        meta = pod["metadata"]
        bind = {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"]}
        status, out = await post(sched.port, "bind", {**bind, "Node": NODE})
        assert status == 200 and not out.get("Error"), out
        await until(lambda: any(e.state == "bound" for e in got))
        await until(
            lambda: any(s.name == f"consume {alloc}" for s in exporter.get_finished_spans())
        )

    spans = list(exporter.get_finished_spans())
    admission = _one(spans, "hcs.admission")
    plan = _one(spans, f"serve {subjects.PLACE}")
    bound = _one(spans, "hcs.bind")
    consumed = [s for s in spans if s.name == f"consume {alloc}"]
    trace_id = admission.context.trace_id
    assert {s.context.trace_id for s in (plan, bound, *consumed)} == {trace_id}
    assert _parent_of(plan) == admission.context.span_id
    assert _parent_of(bound) == admission.context.span_id  # across the pod annotation
    assert consumed and {_parent_of(s) for s in consumed} == {bound.context.span_id}


async def test_a_health_event_published_in_a_span_is_consumed_as_its_child(
    bus: Bus, exporter: InMemorySpanExporter
) -> None:
    node = f"trace-{uuid.uuid4().hex[:6]}"
    seen = asyncio.Event()
    event = HealthEvent(node=node, kind="xid", severity="critical", source="agent", time_s=1.0)
    health = subjects.health(node)
    async with _consuming(
        bus, stream=streams.HEALTH, kind=HealthEvent, subject=health, handle=_setting(seen)
    ):
        await bus.publish(health, event, msg_id=f"{node}:untraced")
        await asyncio.wait_for(seen.wait(), 5)
        assert not [s for s in exporter.get_finished_spans() if s.name.startswith("consume")]
        seen.clear()
        with span("agent.detect"):
            await bus.publish(health, event, msg_id=f"{node}:traced")
        await asyncio.wait_for(seen.wait(), 5)
    detect = _one(list(exporter.get_finished_spans()), "agent.detect")
    consumed = _one(list(exporter.get_finished_spans()), f"consume {health}")
    _assert_child(consumed, of=detect)


async def test_an_agent_health_event_starts_a_trace_its_consumer_continues(
    bus: Bus, exporter: InMemorySpanExporter
) -> None:
    node = f"trace-agent-{uuid.uuid4().hex[:6]}"
    seen = asyncio.Event()
    publisher = Publisher(bus, capacity=10)
    reporter = Reporter(publisher, node=node, report_interval_s=1.0)
    health = subjects.health(node)
    async with _consuming(
        bus, stream=streams.HEALTH, kind=HealthEvent, subject=health, handle=_setting(seen)
    ):
        publishing = tasks.start(publisher.run(), name="test:publisher")
        try:
            event = HealthEvent(node=node, kind="xid", severity="fatal", source="agent", time_s=1.0)
            reporter.health(event)  # queued now, published by the publisher's loop later
            await asyncio.wait_for(seen.wait(), 5)
        finally:
            await tasks.stop(publishing)
    spans = list(exporter.get_finished_spans())
    seen_at = _one(spans, "hcs.agent.health_event")
    _assert_child(_one(spans, f"consume {health}"), of=seen_at)
