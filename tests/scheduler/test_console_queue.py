"""The console's ``GET /api/queue`` on a real scheduler replica and a real
nats-server: the shared pool's queue from the replica's memory (its view's
reservations, its pledger's pledges and gang records, the quota file), the
same document ``hcs queue --json`` prints from the bus."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from hcs_bus import streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import (
    DeviceSlice,
    NodeReservations,
    PodRef,
    Requests,
    Reservation,
    encode,
)
from scheduler.ledger import pledge_rules
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge
from scheduler.plan import gang_records as records
from tests.cli.running import hcs
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import DB, node_fp, publish_fleet, until

TOKEN = "console-queue-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
QUOTAS = (
    "namespaces:\n"
    "  ml: {acu: 200, guaranteed: {acu: 100}, weight: 2}\n"
    "  cv: {acu: 800, guaranteed: {acu: 200}}\n"
    "  quiet: {acu: 100}\n"
)


def _bound(pod: str, index: int, *, time_s: float) -> Reservation:
    return Reservation(
        pod=PodRef(namespace="ml", name=pod, uid=f"uid-{pod}"),
        devices=(DeviceSlice(index=index, uuid=f"u{index}", vram_mib=81920, whole=True),),
        state="bound",
        time_s=time_s,
        vendor="nvidia",
        model="A100-80G",
        acu=100.0,
        job="train",
    )


def _gang(namespace: str, job: str, *, size: int, time_s: float) -> records.GangRecord:
    return records.GangRecord(
        namespace=namespace,
        job=job,
        run="r1",
        size=size,
        vendor="nvidia",
        model="A100-80G",
        time_s=time_s,
        requests=Requests(devices=1),
    )


async def _write_ledger(bus: Bus, *, now: float) -> None:
    """ml runs the gang ``train`` (2 of gpu-a's 4 A100s: its whole 200 ACU
    ceiling) and waits with ``more``; cv waits with ``big`` (4 A100s whole)
    and has one pod admitted, not bound yet."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    running = NodeReservations(
        node="gpu-a",
        reservations=(_bound("train-0", 0, time_s=now - 60), _bound("train-1", 1, time_s=now - 50)),
    )
    await kv.put(subjects.node_token("gpu-a"), encode(running))
    for gang in (
        _gang("ml", "more", size=1, time_s=now - 40),
        _gang("cv", "big", size=4, time_s=now - 20),
    ):
        await kv.put(gang.key, records.ENCODER.encode(gang))
    admitted = Pledge(
        id="p1",
        vendor="nvidia",
        model="A100-80G",
        devices=1,
        vram_mib_per_device=81920,
        whole_device=True,
        acu_per_device=100.0,
        time_s=now - 30,
        name="infer-0",
    )
    pledged = NamespacePledges(namespace="cv", pledges=(admitted,))
    await kv.put(pledge_rules.key_for("cv"), msgspec.json.encode(pledged))


async def _queue(port: int, *, headers: dict[str, str] = AUTH) -> tuple[int, Any]:
    async with aiohttp.ClientSession(headers=headers) as session:
        async with session.get(f"http://127.0.0.1:{port}/api/queue") as resp:
            return resp.status, await resp.json()


def _timeless(doc: dict[str, Any]) -> dict[str, Any]:
    """The document less its ages (read at two moments)."""
    return {
        **doc,
        "queue": [{k: v for k, v in q.items() if k != "waited_s"} for q in doc["queue"]],
        "running": [{k: v for k, v in r.items() if k != "running_s"} for r in doc["running"]],
    }


async def test_the_console_queue_shows_shares_waiting_gangs_and_running_gangs_as_hcs_queue(
    bus: Bus, start_scheduler: Start, nats_url: str, tmp_path: Path
) -> None:
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(QUOTAS)
    sched = await start_scheduler(bus, console_token=TOKEN, quota_file=str(quotas))
    await publish_fleet(
        bus, node_fp("gpu-a", count=4), node_fp("npu-b", "huawei/Ascend910B2", count=2)
    )
    await until(lambda: len(sched.view.state.nodes) == 2, timeout_s=10)
    port = sched.console_port
    assert port is not None
    await _write_ledger(bus, now=time.time())

    async with asyncio.timeout(15):  # until the replica's KV watch has every key
        while True:
            status, found = await _queue(port)
            assert status == 200, found
            if len(found["queue"]) == 3 and found["running"]:
                break
            await asyncio.sleep(0.1)

    a100, ascend = DB.get("nvidia/A100-80G"), DB.get("huawei/Ascend910B2")
    assert found["pool"] == {
        "acu": round(4 * a100.acu + 2 * ascend.acu, 3),
        "vram_mib": 4 * a100.vram_mib + 2 * ascend.vram_mib,
    }
    shares = {n["namespace"]: n for n in found["namespaces"]}
    assert sorted(shares) == ["cv", "ml", "quiet"]  # quiet: named by the quota file only
    ml = shares["ml"]
    assert ml["used"] == {"acu": 200.0, "vram_mib": 2 * 81920}
    assert ml["guaranteed"]["acu"] == 100.0 and ml["ceiling"]["acu"] == 200.0
    assert ml["borrowed"]["acu"] == 100.0 and ml["weight"] == 2.0 and ml["dominant_share"] > 0
    assert shares["cv"]["used"]["acu"] == 0.0 and shares["cv"]["dominant_share"] == 0.0

    # by the weighted dominant share once each runs: cv's one device (it holds
    # none), ml's third device over its weight of 2 (1.5 devices' worth), cv's
    # four devices (the large ask waits behind the small ones)
    assert [(q["position"], q["job"], q["namespace"]) for q in found["queue"]] == [
        (1, "cv/infer-0#p1", "cv"),
        (2, "ml/more/r1", "ml"),
        (3, "cv/big/r1", "cv"),
    ]
    reasons = [q["reason"] for q in found["queue"]]
    assert reasons[0].startswith("admitted")
    assert reasons[2].startswith("gang waits whole, holding nothing")
    assert "need 4 nvidia/A100-80G devices free at once" in reasons[2]
    assert "namespace ml at its ceiling" in reasons[1]
    assert 35 <= found["queue"][1]["waited_s"] < 60
    assert found["running"] == [
        {"job": "ml/train", "ranks": 2, "class": "nvidia/A100-80G", "acu": 200.0,
         "vram_mib": 2 * 81920, "running_s": found["running"][0]["running_s"]}
    ]  # fmt: skip
    assert 55 <= found["running"][0]["running_s"] < 90

    env = {"HCS_SCHEDULER__QUOTA_FILE": str(quotas), "KUBECONFIG": str(tmp_path / "none")}
    done = await asyncio.to_thread(hcs, "queue", "--json", "--nats-url", nats_url, env=env)
    assert done.code == 0, done.err
    assert _timeless(found) == _timeless(json.loads(done.out))


async def test_the_console_queue_needs_the_token_and_takes_no_parameters(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await start_scheduler(bus, console_token=TOKEN)
    port = sched.console_port
    assert port is not None
    status, body = await _queue(port, headers={})
    assert status == 401 and "needs its token" in body["error"]
    async with aiohttp.ClientSession(headers=AUTH) as session:
        async with session.get(f"http://127.0.0.1:{port}/api/queue?ns=ml") as resp:
            assert resp.status == 400
            assert "takes no parameters" in (await resp.json())["error"]
    status, empty = await _queue(port)
    assert status == 200 and empty["queue"] == [] and empty["running"] == []
