"""The rendered NATS authorization on a real nats-server: each part can do
exactly what its code does, and an agent cannot speak for another node."""

from __future__ import annotations

import asyncio
import contextlib
import datetime

import msgspec
import pytest
from nats.js.api import DeliverPolicy

from hcs_bus import checkpoint, kvkeys, permissions, streams, subjects
from hcs_bus.bus import Bus, Consumer, Delivery, Follower
from hcs_bus.errors import BusTimeout
from hcs_bus.messages import (
    AllocationEvent,
    CheckpointRequest,
    HealthEvent,
    NodeFingerprint,
    Plan,
    PlanRequest,
    PodRef,
    Requests,
)
from tests.deploy.conftest import NODES, Connector

NODE, OTHER = NODES


def fingerprint(node: str, seq: int = 1) -> NodeFingerprint:
    return NodeFingerprint(node=node, agent_version="t", boot_id="b", seq=seq, time_s=1.0)


def verdict(node: str) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind="verdict",
        severity="warning",
        source="healer",
        time_s=2.0,
        verdict="degraded",
    )


def alert(node: str) -> HealthEvent:
    """What an agent publishes on its own health subject."""
    return HealthEvent(node=node, kind="xid", severity="fatal", source="agent", time_s=2.0, code=79)


def violations(errors: list[Exception]) -> list[str]:
    return [str(e) for e in errors if "permissions violation" in str(e).lower()]


async def wait_for(errors: list[Exception], *, timeout_s: float = 3.0) -> list[str]:
    async with asyncio.timeout(timeout_s):
        while not violations(errors):
            await asyncio.sleep(0.02)
    return violations(errors)


async def replay_following(bus: Bus, *, stream: str, subject: str) -> list[NodeFingerprint]:
    """Replay as the scheduler's view does (hcs_bus.bus.Follower)."""
    got: list[Delivery[NodeFingerprint]] = []
    follower = Follower(
        bus,
        stream=stream,
        subject=subject,
        kind=NodeFingerprint,
        handle=got.append,
        deliver=DeliverPolicy.LAST_PER_SUBJECT,
    )
    await follower.start()
    try:
        async with asyncio.timeout(5):
            await follower.caught_up.wait()
    finally:
        await follower.stop()
    return [d.value for d in got]


async def replay_pulling(bus: Bus, *, stream: str, subject: str) -> None:
    """Replay as the healer and the mirror do (an ephemeral pull Consumer)."""

    async def ignore(_items: list[Delivery[NodeFingerprint]]) -> None:
        return None

    consumer = Consumer(
        bus,
        stream=stream,
        kind=NodeFingerprint,
        handle=ignore,
        filter_subject=subject,
        ack_all=True,
    )
    await consumer.start()
    task = asyncio.create_task(consumer.run())
    try:
        async with asyncio.timeout(5):
            await consumer.caught_up.wait()
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_an_agent_publishes_its_own_fingerprint_and_gets_a_stream_ack(
    connect_as: Connector,
) -> None:
    agent, errors = await connect_as(NODE)
    seq = await agent.publish(subjects.fp(NODE), fingerprint(NODE), msg_id="a:b:1")
    health_seq = await agent.publish(subjects.health(NODE), alert(NODE), msg_id="a:b:h1")
    assert seq > 0 and health_seq > 0
    assert violations(errors) == []


async def test_an_agent_publishing_for_another_node_is_refused(connect_as: Connector) -> None:
    agent, errors = await connect_as(NODE)
    with pytest.raises(BusTimeout):
        await agent.publish(
            subjects.fp(OTHER), fingerprint(OTHER), msg_id="x:1", timeout_s=0.5, attempts=1
        )
    refused = await wait_for(errors)
    assert any(subjects.fp(OTHER) in line for line in refused)


async def test_an_agent_cannot_listen_to_the_bus_or_other_inboxes(connect_as: Connector) -> None:
    agent, errors = await connect_as(NODE)
    await agent.nc.subscribe(permissions.inbox_prefix(OTHER) + ".>")
    await agent.nc.subscribe("hcs.>")
    refused = await wait_for(errors)
    await agent.nc.flush()
    assert any("hcs.>" in line for line in refused) or len(violations(errors)) >= 1


async def test_the_scheduler_serves_plans_to_the_injector_in_its_queue_group(
    connect_as: Connector,
) -> None:
    scheduler, s_errors = await connect_as("scheduler")
    injector, i_errors = await connect_as("injector")

    async def answer(request: PlanRequest) -> Plan:
        return Plan(ok=True, vendor="nvidia", model=request.namespace)

    sub = await scheduler.serve(
        subjects.PLACE,
        PlanRequest,
        answer,
        queue=subjects.PLACE_QUEUE,
        on_bad=lambda reason: Plan(ok=False, reason=reason),
    )
    await scheduler.nc.flush()
    plan = await injector.request(
        subjects.PLACE,
        PlanRequest(namespace="ml", requests=Requests(vram_mib=1)),
        Plan,
        timeout_s=2.0,
    )
    await sub.unsubscribe()
    assert plan.ok and plan.model == "ml"
    assert violations(s_errors) == [] and violations(i_errors) == []


async def test_the_schedulers_cluster_view_replays_a_large_stream_with_its_own_user(
    connect_as: Connector,
) -> None:
    """The view follows HCS_FP/HCS_HEALTH with ordered push consumers: a replay
    this large makes the server ask for flow-control replies ($JS.FC)."""
    from hcs_bus.settings import SchedulerSettings
    from scheduler.view.follow_loop import ClusterView

    agent, _ = await connect_as(NODE)
    total = 10_000  # HCS_HEALTH keeps 10,000 events per node
    big = msgspec.structs.replace(alert(NODE), message="x" * 2000)  # ~20 MB in all
    await agent.publish_window((subjects.health(NODE), big, f"replay:{n}") for n in range(total))
    scheduler, errors = await connect_as("scheduler")
    view = ClusterView(scheduler, settings=SchedulerSettings())
    await view.start()
    try:
        await view.wait_ready(timeout_s=20)
        assert view.applied >= total
    finally:
        await view.stop()
    await scheduler.nc.flush()
    assert violations(errors) == []


async def test_the_scheduler_books_in_kv_replays_streams_and_publishes_allocations(
    connect_as: Connector,
) -> None:
    agent, _ = await connect_as(NODE)
    await agent.publish(subjects.fp(NODE), fingerprint(NODE, 7), msg_id="a:b:7")
    scheduler, errors = await connect_as("scheduler")
    kv = await scheduler.js.key_value(streams.KV_ALLOC)
    key = subjects.alloc_key(NODE)
    with contextlib.suppress(Exception):
        await kv.delete(key)
    watcher = await kv.watchall()
    revision = await kv.put(key, b"{}")
    await kv.update(key, b'{"a":1}', last=revision)
    assert (await kv.get(key)).value == b'{"a":1}'
    await watcher.stop()
    assert key in await kvkeys.stored_keys(scheduler, streams.KV_ALLOC)  # the view's first look
    fps = await replay_following(scheduler, stream=streams.FP, subject=subjects.FP_ALL)
    event = AllocationEvent(
        node=NODE, pod=PodRef(namespace="ml", name="p"), state="bound", time_s=1.0
    )
    assert await scheduler.publish(subjects.alloc(NODE), event, msg_id="alloc:1") > 0
    await scheduler.js.key_value(streams.KV_CKPT)
    assert NODE in {fp.node for fp in fps}
    assert violations(errors) == []


async def test_the_healer_consumes_durably_publishes_verdicts_and_asks_for_checkpoints(
    connect_as: Connector,
) -> None:
    healer, errors = await connect_as("healer")
    got: list[Delivery[HealthEvent]] = []

    async def handle(items: list[Delivery[HealthEvent]]) -> None:
        got.extend(items)

    consumer = Consumer(
        healer,
        stream=streams.HEALTH,
        kind=HealthEvent,
        handle=handle,
        filter_subject=subjects.HEALTH_ALL,
        durable=permissions.HEALER_DURABLE,
        fetch_timeout_s=0.1,
    )
    await consumer.start()
    task = asyncio.get_running_loop().create_task(consumer.run())
    try:
        await healer.publish(subjects.healer_health(OTHER), verdict(OTHER), msg_id="v:1")
        async with asyncio.timeout(5):
            while not any(d.value.node == OTHER for d in got):
                await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    request = CheckpointRequest(namespace="ml", job="llama", reason="drain", request_id="r1")
    from hcs_bus import messages

    await healer.nc.publish(subjects.ckpt_request("ml", "llama"), messages.encode(request))
    await checkpoint.latest(healer, namespace="ml", job="llama")
    for stream in (streams.FP, streams.ALLOC):
        await replay_pulling(healer, stream=stream, subject=">")
    # the circuit breaker's window, followed at the start of a leadership term
    window = Follower(
        healer,
        stream=streams.HEALTH,
        subject=subjects.HEALTH_ALL,
        kind=HealthEvent,
        handle=lambda _item: None,
        deliver=DeliverPolicy.BY_START_TIME,
        opt_start_time=datetime.datetime.now(datetime.UTC) - datetime.timedelta(hours=1),
    )
    await window.start()
    try:
        await asyncio.wait_for(window.caught_up.wait(), timeout=5)
    finally:
        await window.stop()
    await healer.nc.flush()
    assert violations(errors) == []


async def test_a_sidecar_reports_checkpoints_and_hears_requests_but_cannot_send_them(
    connect_as: Connector,
) -> None:
    sidecar, errors = await connect_as(permissions.sidecar_user("ml"))
    heard: list[bytes] = []

    async def on_request(msg: object) -> None:
        heard.append(getattr(msg, "data", b""))

    await sidecar.nc.subscribe(subjects.ckpt_request("ml", "llama"), cb=on_request)
    event = await checkpoint.report(sidecar, namespace="ml", job="llama", uri="s3://c", step=3)
    assert event.step == 3
    await sidecar.nc.flush()
    assert violations(errors) == []
    await sidecar.nc.publish(subjects.ckpt_request("ml", "other"), b"{}")
    refused = await wait_for(errors)
    assert any(subjects.ckpt_request("ml", "other") in line for line in refused)


async def test_the_mirror_replays_fingerprints_and_health(connect_as: Connector) -> None:
    mirror, errors = await connect_as("mirror")
    for stream, subject in ((streams.FP, subjects.FP_ALL), (streams.HEALTH, subjects.HEALTH_ALL)):
        await replay_pulling(mirror, stream=stream, subject=subject)
    await mirror.nc.flush()
    assert violations(errors) == []


async def test_the_injector_cannot_publish_fingerprints(connect_as: Connector) -> None:
    injector, errors = await connect_as("injector")
    await injector.nc.publish(subjects.fp(NODE), b"{}")
    refused = await wait_for(errors)
    assert any(subjects.fp(NODE) in line for line in refused)


def test_every_agent_inbox_is_one_token_and_never_a_service_inbox() -> None:
    services = {permissions.inbox_prefix(s) for s in permissions.SERVICES}
    prefix = permissions.inbox_prefix("ip-10-0-0-1.ec2.internal")
    assert prefix == "_INBOX_ip-10-0-0-1_ec2_internal" and "." not in prefix
    assert prefix not in services and permissions.inbox_prefix("scheduler") == "_INBOX_SCHEDULER"


def test_an_agent_may_publish_only_its_own_subjects_and_never_asks_for_plans() -> None:
    perms = permissions.agent("gpu-node-a")
    assert perms.publish == ("hcs.fp.gpu-node-a", "hcs.health.gpu-node-a")
    assert perms.subscribe == ("_INBOX_gpu-node-a.>",) and not perms.allow_responses


def test_a_user_without_credentials_is_an_error() -> None:
    with pytest.raises(KeyError, match="gpu-node-z"):
        creds = {s: permissions.Credential(password="x") for s in permissions.SERVICES}
        permissions.nats_authorization(["gpu-node-z"], creds)


def test_a_generated_nkey_seed_yields_a_user_public_key(tmp_path: object) -> None:
    seed = permissions.new_user_seed()
    public = permissions.public_key(seed)
    assert seed.startswith("SU") and len(seed) == 58
    assert public.startswith("U") and len(public) == 56 and public.isalnum()
    flipped = seed[:10] + ("A" if seed[10] != "A" else "B") + seed[11:]
    with pytest.raises(ValueError, match="seed"):
        permissions.public_key(flipped)  # the checksum no longer matches
