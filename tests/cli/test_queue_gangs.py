"""``hcs queue`` shows the gangs waiting whole (their gang records in KV
``hcs_alloc``, holding nothing) in the shared pool's order, each with its
position and the reason it waits, on a real nats-server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from hcs_bus import streams
from hcs_bus.bus import Bus
from hcs_bus.messages import Requests
from scheduler.plan import gang_records as records
from tests.cli.running import hcs
from tests.cli.test_queue import _write_ledger
from tests.scheduler.helpers import node_fp, publish_fleet


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


async def test_hcs_queue_lists_waiting_gangs_in_pool_order_with_their_reasons(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    await publish_fleet(bus, node_fp("gpu-1", count=8), node_fp("gpu-2", count=8))
    await _write_ledger(bus)  # ml holds 6 devices (600 ACU) of its 800 ACU ceiling
    kv = await bus.js.key_value(streams.KV_ALLOC)
    for gang in (
        _gang("ml", "older", size=4, time_s=10.0),  # older, but ml holds the larger share
        _gang("idle", "younger", size=12, time_s=90.0),
    ):
        await kv.put(gang.key, records.ENCODER.encode(gang))
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text("namespaces:\n  ml: {acu: 800, vram: 640Gi}\n")
    env = {"HCS_SCHEDULER__QUOTA_FILE": str(quotas), "KUBECONFIG": str(tmp_path / "none")}
    done = await asyncio.to_thread(hcs, "queue", "--json", "--nats-url", nats_url, env=env)
    assert done.code == 0, done.err
    gangs = [q for q in json.loads(done.out)["queue"] if q["reason"].startswith("gang")]
    assert [(q["job"], q["namespace"]) for q in gangs] == [
        ("idle/younger/r1", "idle"),
        ("ml/older/r1", "ml"),
    ]
    assert gangs[0]["position"] < gangs[1]["position"]
    assert "need 12 nvidia/A100-80G devices free at once" in gangs[0]["reason"]
    assert "namespace ml at its ceiling" in gangs[1]["reason"]

    plain = await asyncio.to_thread(hcs, "queue", "--nats-url", nats_url, env=env)
    assert plain.code == 0, plain.err
    assert "idle/younger/r1" in plain.out and "at its ceiling" in plain.out
