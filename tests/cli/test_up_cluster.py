"""`hcs up --nats-cluster 3` runs the demo on three NATS servers, every stream on all three."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

from hcs_bus.bus import connect
from hcs_bus.natsserver import free_port
from hcs_bus.settings import BusSettings
from tests.cli.fleets import demo_fleet

FLEET = demo_fleet(gpu_a_2_fails_at_s=9)


async def _replicas(urls: str) -> dict[str, int]:
    bus = await connect(BusSettings(url=urls, name="test"))
    try:
        found = {}
        for name in ("HCS_FP", "HCS_HEALTH", "HCS_ALLOC", "HCS_DLQ", "KV_hcs_alloc", "KV_hcs_ckpt"):
            info = await bus.js.stream_info(name)
            assert info.cluster is not None and info.cluster.leader, name
            found[name] = info.config.num_replicas
        return found
    finally:
        await bus.nc.close()


def test_hcs_up_on_a_three_server_cluster_runs_the_demo_on_replicated_streams(
    tmp_path: Path,
) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(FLEET)
    state = tmp_path / "state"
    env = {**os.environ, "HCS_TELEMETRY__LOG_LEVEL": "info"}
    args = ["--fleet", str(fleet), "--state-dir", str(state), "--nats-cluster", "3"]
    for flag in ("--webhook", "--extender", "--console"):
        args += [flag, f"127.0.0.1:{free_port()}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "hcs.cli", "up", "--for", "30", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 30
        urls = ""
        while not urls and time.monotonic() < deadline:
            line = proc.stdout.readline()
            found = re.search(r"hcs up: NATS (\S+)", line)
            urls = found.group(1) if found else ""
        assert urls.count(",") == 2, urls
        replicas = asyncio.run(_replicas(urls))
        _out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=30)
    assert proc.returncode == 0, err[-3000:]
    assert set(replicas.values()) == {3}, replicas
    assert sorted(p.name for p in (state / "nats").iterdir() if p.is_dir()) == [
        "hcs-0",
        "hcs-1",
        "hcs-2",
    ]
    running = [json.loads(line) for line in err.splitlines() if "demo_pod_running" in line]
    assert [r["node"] for r in running] == ["gpu-a", "gpu-h"], running
    assert running[1]["resume_from"].startswith("s3://hcs-demo/llama/step-")
    # every part found the streams as hcs up made them (none set them back to one replica)
    inits = [
        json.loads(line)
        for log in (state / "logs").glob("*.log")
        for line in log.read_text().splitlines()
        if '"bus_initialised"' in line
    ]
    assert inits and not any("updated" in i for i in inits), inits
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert str(state / "nats") not in ps, "a nats-server was left behind"
