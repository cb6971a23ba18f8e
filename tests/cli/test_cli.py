"""The hcs command line, run as a user runs it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hcs_bus import subjects
from hcs_bus.bus import Bus
from tests.view.factories import fingerprint, reservation, verdict


def hcs(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hcs.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": "/usr/bin:/bin:/usr/sbin", "HCS_TELEMETRY__LOG_LEVEL": "error"},
    )


def test_a_bad_flag_prints_one_line_naming_it_and_exits_2() -> None:
    done = hcs("place", "--substitution", "maybe")
    assert done.returncode == 2
    assert "--substitution" in done.stderr and "maybe" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_bus_init_is_idempotent(nats_url: str) -> None:
    first = hcs("--nats-url", nats_url, "bus", "init")
    second = hcs("--nats-url", nats_url, "bus", "init")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    assert [line.split() for line in second.stdout.splitlines()] == [
        [name, "unchanged"]
        for name in ("HCS_FP", "HCS_HEALTH", "HCS_ALLOC", "HCS_DLQ", "KV_hcs_alloc", "KV_hcs_ckpt")
    ]


async def test_top_once_json_shows_every_node_and_the_fleet_totals(bus: Bus, nats_url: str) -> None:
    for i in range(3):
        fp = fingerprint(f"n{i}", devices=4)
        await bus.publish(subjects.fp(fp.node), fp, msg_id=f"n{i}:1")
    done = await asyncio.to_thread(hcs, "--nats-url", nats_url, "top", "--once", "--json")
    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    assert [n["node"] for n in view["nodes"]] == ["n0", "n1", "n2"]
    assert view["totals"]["devices"] == 12
    assert view["models"][0]["model"] == "nvidia/A100-80G"


async def test_top_once_json_shows_the_alerts_and_checkpoints_the_live_view_shows(
    bus: Bus, nats_url: str
) -> None:
    from msgspec import structs

    from hcs_bus import checkpoint, messages, streams
    from hcs_bus.messages import HealthEvent, NodeReservations

    fp = fingerprint("gpu-a", devices=2)
    await bus.publish(subjects.fp(fp.node), fp, msg_id="a:1")
    xid = HealthEvent(
        node="gpu-a",
        kind="xid",
        severity="fatal",
        source="agent",
        time_s=2.0,
        device=1,
        code=79,
        message="Xid 79: fell off the bus",
    )
    info = structs.replace(xid, kind="clock", severity="info", code=None, message="clocks fine")
    forged = structs.replace(verdict("gpu-a", 0, "failed"), message="forged by an agent")
    real = structs.replace(verdict("gpu-a", 1, "failed"), message="device 1 failed")
    await bus.publish(subjects.health("gpu-a"), xid, msg_id="h:1")
    await bus.publish(subjects.health("gpu-a"), info, msg_id="h:2")
    await bus.publish(subjects.health("gpu-a"), forged, msg_id="h:3")
    await bus.publish(subjects.healer_health("gpu-a"), real, msg_id="h:4")
    held = structs.replace(reservation("ml", "train-0", [(0, 81920, True)]), job="llama")
    kv = await bus.js.key_value(streams.KV_ALLOC)
    doc = NodeReservations(node="gpu-a", reservations=(held,))
    await kv.put(subjects.alloc_key("gpu-a"), messages.encode(doc))
    await checkpoint.report(bus, namespace="ml", job="llama", uri="s3://ck/step-40", step=40)

    done = await asyncio.to_thread(hcs, "--nats-url", nats_url, "top", "--once", "--json")

    assert done.returncode == 0, done.stderr
    view = json.loads(done.stdout)
    newest_first = ["device 1 failed", "Xid 79: fell off the bus"]
    assert [a["message"] for a in view["alerts"]] == newest_first
    [job] = view["jobs"]
    assert (job["job"], job["pod"], job["checkpoint"], job["step"]) == (
        "ml/llama",
        "train-0",
        "s3://ck/step-40",
        40,
    )


async def test_watch_prints_health_events_as_json_lines(bus: Bus, nats_url: str) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hcs.cli",
        "--nats-url",
        nats_url,
        "watch",
        "hcs.health.*",
        "--count",
        "1",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    from hcs_bus.messages import HealthEvent

    event = HealthEvent(node="n1", kind="xid", severity="fatal", source="probe", time_s=1, code=79)
    async with asyncio.timeout(20):
        while proc.returncode is None:
            await bus.publish(subjects.health("n1"), event, msg_id="w1")
            try:
                async with asyncio.timeout(0.5):
                    await proc.wait()
            except TimeoutError:
                continue
    out, err = await proc.communicate()
    line = json.loads(out.decode().splitlines()[0])
    assert line["subject"] == "hcs.health.n1" and line["code"] == 79, err


def test_up_refuses_a_bad_fleet_file_with_one_line_naming_field_and_value(tmp_path: Path) -> None:
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("nodes:\n  - name: a\n    devices: {model: nvidia/A100-80G, count: -1}\n")
    done = hcs("up", "--fleet", str(fleet), "--for", "1")
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"hcs: error: {fleet}: nodes[0].devices.count: must be 1..64 (value -1)"
    ]


def test_convert_prints_the_device_count_and_the_arithmetic() -> None:
    tflops = hcs("convert", "100", "tflops-fp16", "--to", "huawei/Ascend910B2")
    assert tflops.returncode == 0, tflops.stderr
    assert tflops.stdout.strip().endswith("= 1 × huawei/Ascend910B2")
    devices = hcs("convert", "1", "nvidia/A100-80G", "--to", "hygon/K100")
    assert devices.returncode == 0, devices.stderr
    assert "ACU" in devices.stdout and "VRAM" in devices.stdout
    assert "× hygon/K100" in devices.stdout.splitlines()[-1]


def test_convert_names_an_unknown_model() -> None:
    done = hcs("convert", "1", "nvidia/A100-80G", "--to", "nvidia/B9000")
    assert done.returncode == 2
    assert "nvidia/B9000" in done.stderr


@pytest.mark.parametrize("amount", ["1e400", "nan", "-inf"])
def test_convert_names_a_device_count_that_is_not_a_number(amount: str) -> None:
    done = hcs("convert", "--to", "hygon/K100", "--", amount, "nvidia/A100-80G")
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "AMOUNT" in done.stderr


def test_certs_writes_a_ca_and_a_serving_pair_and_prints_the_bundle(tmp_path: Path) -> None:
    done = hcs("certs", "--out", str(tmp_path / "c"), "--dns", "hcs-injector.hcs-system.svc")
    assert done.returncode == 0, done.stderr
    bundle = done.stdout.split("caBundle: ")[1].strip()
    import base64

    assert base64.b64decode(bundle).startswith(b"-----BEGIN CERTIFICATE-----")
    assert {p.name for p in (tmp_path / "c").iterdir()} >= {"ca.crt", "tls.crt", "tls.key"}
