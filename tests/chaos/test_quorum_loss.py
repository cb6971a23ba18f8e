"""A cluster that loses its quorum (two of three servers stopped) makes the
scheduler say so instead of guessing: ``/readyz`` answers 503 naming the
ledger's stream, one log line, the gauge ``hcs_bus_quorum_lost`` at 1, binds
and plans refused at once with that reason; once the servers are back it
serves again by itself, and nothing is written twice on the way."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from structlog.testing import capture_logs

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import (
    AllocationEvent,
    NodeReservations,
    Plan,
    PlanRequest,
    Policy,
    Requests,
)
from hcs_bus.natsserver import NatsCluster
from hcs_bus.settings import BusSettings, Settings, replace
from hcs_bus.telemetry import metrics_text
from scheduler.replica import Scheduler, run
from tests.chaos.burst import NODES, SLICE, _double_booked, _get
from tests.scheduler.helpers import DB, node_fp, pod_info, publish_fleet, until

pytestmark = pytest.mark.timeout(120)
LEDGER = streams.kv_stream(streams.KV_ALLOC)
GAUGE = f'hcs_bus_quorum_lost{{stream="{LEDGER}"}}'


@pytest.fixture
async def replica(cluster_bus: Bus, cluster_settings: BusSettings) -> AsyncIterator[Scheduler]:
    await publish_fleet(cluster_bus, *(node_fp(n) for n in NODES))
    settings = replace(
        Settings(bus=cluster_settings), scheduler={"extender_port": 0, "console_port": 0}
    )
    bus = await connect(cluster_settings, name="replica")
    started = await run(bus, None, settings, profiles=DB)
    await started.view.wait_ready(timeout_s=15)
    await until(lambda: len(started.view.state.nodes) == len(NODES), timeout_s=15)
    try:
        yield started
    finally:
        with contextlib.suppress(Exception):
            await started.stop()
        await bus.nc.close()


def _readyz(port: int) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


def _gauge() -> float | None:
    for line in metrics_text().decode().splitlines():
        if line.startswith(GAUGE):
            return float(line.split()[-1])
    return None


async def _bind(replica: Scheduler, name: str, node: str) -> str:
    return await replica.booker.bind(pod_info(name, annotation=SLICE), SLICE, node=node)


def _dry_plan(name: str) -> PlanRequest:
    return PlanRequest(
        namespace="ml",
        requests=Requests(vram_mib=8192),
        policy=Policy(),
        pod_name=name,
        dry_run=True,
    )


async def test_losing_the_quorum_refuses_binds_and_plans_and_serving_resumes_by_itself(
    replica: Scheduler, cluster_bus: Bus, cluster_settings: BusSettings, nats_cluster: NatsCluster
) -> None:
    port = replica.port
    assert port is not None
    assert await _bind(replica, "before-0", NODES[0]) == ""
    assert await _bind(replica, "before-1", NODES[1]) == ""
    assert (await asyncio.to_thread(_readyz, port))[0] == 200
    assert _gauge() == 0.0
    quorum = replica.booker.quorum
    assert quorum is not None

    lost = nats_cluster.servers[1:]
    with capture_logs() as logs:
        for server in lost:
            server.signal(signal.SIGKILL)
        await until(lambda: quorum.lost, timeout_s=45)  # a loaded machine elects slowly

        status, text = await asyncio.to_thread(_readyz, port)
        assert status == 503 and LEDGER in text and "quorum" in text
        assert _gauge() == 1.0
        loop = asyncio.get_running_loop()
        asked = loop.time()
        refusal = await _bind(replica, "during", NODES[2])
        assert "lost its quorum" in refusal and LEDGER in refusal
        assert loop.time() - asked < 1.0  # refused at once, not after a write timed out
        plan = await cluster_bus.request(
            subjects.PLACE_DRY, _dry_plan("during"), Plan, timeout_s=10
        )
        assert not plan.ok and "lost its quorum" in plan.reason

        for server in lost:
            server.start()
        await asyncio.to_thread(nats_cluster.wait_ready)
        await until(lambda: not quorum.lost, timeout_s=30)
    events = [e["event"] for e in logs]
    assert events.count("bus_quorum_lost") == 1 and events.count("bus_quorum_regained") == 1

    assert (await asyncio.to_thread(_readyz, port))[0] == 200
    assert _gauge() == 0.0
    async with asyncio.timeout(20):  # the first bind may still meet a stream electing
        while await _bind(replica, "after", NODES[2]) != "":
            await asyncio.sleep(0.2)
    plan = await cluster_bus.request(subjects.PLACE_DRY, _dry_plan("after"), Plan, timeout_s=10)
    assert plan.ok, plan.reason

    await replica.booker.settle()
    problems = await _check_ledger(cluster_bus, {"before-0", "before-1", "after"})
    assert not problems, problems


async def _check_ledger(bus: Bus, acked: set[str]) -> list[str]:
    """Every acknowledged pod held once, the refused one nowhere, no device
    double-booked, and no pod announced bound twice on ``HCS_ALLOC``."""
    problems: list[str] = []
    held: Counter[str] = Counter()
    kv = await bus.js.key_value(streams.KV_ALLOC)
    decode = messages.decoder_for(NodeReservations).decode
    for node in NODES:
        entry = await _get(kv, subjects.alloc_key(node))
        doc = decode(entry) if entry else NodeReservations(node=node)
        problems += _double_booked(doc)
        held.update(r.pod.name for r in doc.reservations)
    problems += [f"{pod} held {n} times" for pod, n in held.items() if n > 1]
    problems += [f"acknowledged {pod} not held" for pod in acked if held[pod] != 1]
    if held["during"]:
        problems.append("the pod refused while the quorum was lost is held")
    bound = Counter(e.pod.name for e in await _allocations(bus) if e.state == "bound")
    problems += [f"{pod} announced bound {n} times" for pod, n in bound.items() if n > 1]
    return problems


async def _allocations(bus: Bus) -> list[AllocationEvent]:
    found: list[AllocationEvent] = []
    info = await bus.js.stream_info(streams.ALLOC)
    last = info.state.last_seq
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        with contextlib.suppress(msgspec.MsgspecError):
            found.append(msgspec.json.decode(msg.data, type=AllocationEvent))
        if msg.metadata.sequence.stream >= last:
            done.set()

    sub = await bus.js.subscribe(
        subjects.ALLOC_ALL, stream=streams.ALLOC, cb=on_msg, ordered_consumer=True
    )
    try:
        if last:
            async with asyncio.timeout(20):
                await done.wait()
    finally:
        await sub.unsubscribe()
    return found
