"""The web console's routes on a real scheduler replica and a real nats-server:
the page and its files, the JSON API, the live feed, and every refusal as JSON.
The console has its own port, behind its token (tests/scheduler/test_console_auth.py)."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import aiohttp
import pytest

from hcs_bus import checkpoint, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import (
    DeviceSlice,
    HealthEvent,
    NodeReservations,
    PodRef,
    Reservation,
    encode,
)
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import node_fp, publish_fleet, until

TOKEN = "console-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


async def _get(port: int, path: str, **kw: Any) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.get(f"http://127.0.0.1:{port}{path}", **kw) as resp:
            text = await resp.text()
            body: Any = json.loads(text) if resp.content_type == "application/json" else text
            return resp.status, body, resp.headers


async def _fleet(bus: Bus, start_scheduler: Start) -> int:
    sched = await start_scheduler(bus, console_token=TOKEN)
    await publish_fleet(
        bus, node_fp("gpu-a", count=4), node_fp("npu-b", "huawei/Ascend910B2", count=2)
    )
    await until(lambda: len(sched.view.state.nodes) == 2, timeout_s=10)
    assert sched.console_port is not None
    return sched.console_port


async def _health(bus: Bus, event: HealthEvent) -> None:
    where = subjects.healer_health if event.source == "healer" else subjects.health
    await bus.publish(where(event.node), event, msg_id=uuid.uuid4().hex)


async def test_the_page_and_its_files_are_served_with_a_strict_policy(
    bus: Bus, start_scheduler: Start
) -> None:
    port = await _fleet(bus, start_scheduler)
    status, page, headers = await _get(port, "/console/")
    assert status == 200 and "<title>HCS compute pool</title>" in page
    assert "default-src 'self'" in headers["Content-Security-Policy"]
    for name in ("console.js", "console.css", "uPlot.iife.min.js", "uPlot.min.css"):
        assert f"static/{name}" in page
        status, _, _ = await _get(port, f"/console/static/{name}")
        assert status == 200, name
    status, licence, _ = await _get(port, "/console/static/uPlot.LICENSE")
    assert status == 200 and "MIT" in licence
    status, _, headers = await _get(port, "/console", allow_redirects=False)
    assert status == 308 and headers["Location"] == "/console/"
    status, _, _ = await _get(port, "/console/static/../../running.py")
    assert status in (403, 404)


async def test_overview_shows_the_fleet_by_class_and_node(bus: Bus, start_scheduler: Start) -> None:
    port = await _fleet(bus, start_scheduler)
    status, doc, _ = await _get(port, "/api/overview")
    assert status == 200 and doc["ready"] is True
    assert [c["class"] for c in doc["classes"]] == ["huawei/Ascend910B2", "nvidia/A100-80G"]
    assert {n["name"] for n in doc["nodes"]} == {"gpu-a", "npu-b"}
    assert doc["totals"]["devices"] == 6 and doc["totals"]["healthy"] == 6
    status, page, _ = await _get(port, "/api/nodes?limit=1")
    assert status == 200 and page["total"] == 2 and len(page["nodes"]) == 1
    status, node, _ = await _get(port, "/api/nodes/npu-b")
    assert status == 200 and [d["class"] for d in node["device_list"]] == ["huawei/Ascend910B2"] * 2


@pytest.mark.parametrize(
    ("path", "status", "reason"),
    [
        ("/api/nodes/gpu-z", 404, "unknown node 'gpu-z'"),
        ("/api/alerts?node=gpu-z", 404, "unknown node 'gpu-z'"),
        ("/api/alerts?limit=lots", 400, "limit='lots' is not a whole number"),
        ("/api/alerts?severity=loud", 400, "severity='loud'"),
        ("/api/history?window_s=-1", 400, "window_s=-1 is out of range"),
        ("/api/nodes?offset=-1", 400, "offset=-1 is out of range"),
        ("/api/nodes?sort=name", 400, "unknown parameter 'sort'"),
        ("/api/nodes/gpu-a?x=1", 400, "takes no parameters"),
        ("/api/events?since=1", 400, "takes no parameters"),
        ("/api/nope", 404, "no console API at /api/nope"),
    ],
)
async def test_a_bad_console_query_is_a_4xx_naming_the_reason(
    bus: Bus, start_scheduler: Start, path: str, status: int, reason: str
) -> None:
    port = await _fleet(bus, start_scheduler)
    got, body, headers = await _get(port, path)
    assert got == status, body
    assert headers["Content-Type"].startswith("application/json")
    assert reason in body["error"] and body["status"] == status


async def test_the_api_is_read_only(bus: Bus, start_scheduler: Start) -> None:
    port = await _fleet(bus, start_scheduler)
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.post(f"http://127.0.0.1:{port}/api/overview", data=b"{}") as resp:
            assert resp.status == 405
            assert "read-only" in (await resp.json())["error"]
        async with session.get(f"http://127.0.0.1:{port}/nope") as resp:
            assert resp.status == 404  # outside /api/ the answers are aiohttp's own
            assert resp.content_type != "application/json"


async def _next_overview(lines: aiohttp.StreamReader) -> dict[str, Any]:
    event = ""
    while True:
        line = (await lines.readline()).decode().rstrip("\n")
        if line.startswith("event: "):
            event = line.removeprefix("event: ")
        elif line.startswith("data: ") and event == "overview":
            doc: dict[str, Any] = json.loads(line.removeprefix("data: "))
            return doc


async def test_a_failed_device_reaches_the_live_feed_and_the_alerts(
    bus: Bus, start_scheduler: Start
) -> None:
    port = await _fleet(bus, start_scheduler)
    xid = HealthEvent(node="gpu-a", kind="xid", severity="fatal", source="agent", time_s=1.0,
                      device=2, code=79, message="GPU has fallen off the bus")  # fmt: skip
    failed = HealthEvent(node="gpu-a", kind="verdict", severity="fatal", source="healer",
                         time_s=2.0, device=2, verdict="failed")  # fmt: skip
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.get(f"http://127.0.0.1:{port}/api/events") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/event-stream"
            first = await asyncio.wait_for(_next_overview(resp.content), 5)
            assert first["totals"]["failed"] == 0
            await _health(bus, xid)
            await _health(bus, failed)
            async with asyncio.timeout(10):
                doc = first
                while doc["totals"]["failed"] != 1:
                    doc = await _next_overview(resp.content)
    gpu_a = next(n for n in doc["nodes"] if n["name"] == "gpu-a")
    assert [c["health"] for c in gpu_a["cells"]] == ["healthy", "healthy", "failed", "healthy"]
    status, body, _ = await _get(port, "/api/alerts?node=gpu-a&severity=fatal")
    assert status == 200
    assert [(a["kind"], a["code"]) for a in body["alerts"]] == [("verdict", None), ("xid", 79)]


async def test_a_job_shows_its_devices_and_last_checkpoint(
    bus: Bus, start_scheduler: Start
) -> None:
    port = await _fleet(bus, start_scheduler)
    doc = NodeReservations(
        node="gpu-a",
        reservations=(
            Reservation(
                pod=PodRef(namespace="ml", name="train-0"),
                devices=(DeviceSlice(index=0, uuid="u0", vram_mib=81920, whole=True),),
                state="bound",
                time_s=1.0,
                vendor="nvidia",
                model="A100-80G",
                acu=100.0,
                job="llama",
            ),
        ),
    )
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(subjects.node_token("gpu-a"), encode(doc))
    await checkpoint.report(bus, namespace="ml", job="llama", uri="s3://b/step-40", step=40)
    async with asyncio.timeout(15):
        while True:
            _, overview, _ = await _get(port, "/api/overview")
            jobs = overview["jobs"]
            if jobs and jobs[0]["checkpoint"]:
                break
            await asyncio.sleep(0.2)
    assert jobs[0]["job"] == "ml/llama"
    assert jobs[0]["pods"][0]["node"] == "gpu-a"
    assert jobs[0]["checkpoint"]["uri"] == "s3://b/step-40" and jobs[0]["checkpoint"]["step"] == 40
    assert overview["namespaces"][0]["namespace"] == "ml"
    assert overview["namespaces"][0]["vram_mib"] == 81920


async def test_history_records_samples_for_the_plots(bus: Bus, start_scheduler: Start) -> None:
    port = await _fleet(bus, start_scheduler)
    status, history, _ = await _get(port, "/api/history?window_s=60")
    assert status == 200 and len(history["time_s"]) >= 1
    assert set(history["health"]) == {"healthy", "degraded", "failed", "stale"}


async def test_a_large_fleet_slows_the_pushes_so_the_extender_keeps_its_loop(bus: Bus) -> None:
    from hcs_bus.settings import SchedulerSettings
    from scheduler.console.http import LOOP_SHARE, Console
    from scheduler.view.follow_loop import ClusterView
    from tests.scheduler.helpers import DB, state_of

    view = ClusterView(bus, settings=SchedulerSettings())
    console = Console(view, bus=bus, profiles=DB, quotas=None, push_every_s=0.01)
    assert console.push_pause_s() == 0.01  # nothing built yet
    view.state = state_of(*(node_fp(f"n{i:04d}", count=8) for i in range(300)))
    body = console.overview_bytes()
    assert console.build_s > 0
    assert console.push_pause_s() == pytest.approx(console.build_s / LOOP_SHARE)
    assert console.push_pause_s() > 0.01
    assert json.loads(body)["nodes_total"] == 300 and len(json.loads(body)["nodes"]) == 300
    assert console.overview_bytes() is body  # unchanged view: built once
    console.changed("n0001")
    assert console.overview_bytes() is not body


async def test_a_connected_live_feed_does_not_hold_up_the_replicas_stop(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await start_scheduler(bus, console_token=TOKEN)
    assert sched.console_port is not None
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.get(f"http://127.0.0.1:{sched.console_port}/api/events") as resp:
            await asyncio.wait_for(_next_overview(resp.content), 5)
            began = loop.time()
            await asyncio.wait_for(sched.stop(), 10)
            assert loop.time() - began < 3.0
            rest = await resp.content.read()  # the feed ended after a whole event
            assert rest.strip() == b"", rest
