"""Healer benchmark: ``python -m bench.heal [--nodes 5000] [--faults 200] [--rate 5000]``.

A real nats-server, the API double of tests/apiserver.py (in this process),
the healer in its own process (as deployed), background fingerprints from a
third process. Measures the time from a fatal HealthEvent published to the
``hcs.io/unhealthy`` taint accepted by the API double (p50/p99), on an idle
fleet (the baseline), under telemetry load, and counts false isolations on a
healthy fleet under noise (application Xids, corrected-ECC blips).
Targets: p99 ≤ 250 ms under load; 0 false isolations; breaker closed at 4 %.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from typing import Any

from hcs_bus import streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import (
    Compute,
    DeviceFingerprint,
    HealthEvent,
    NodeFingerprint,
    Telemetry,
)
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings, HealerSettings, TelemetrySettings
from hcs_bus.telemetry import configure

TAINT = "hcs.io/unhealthy"
DEVICES = 4


def _fingerprint(node: str, seq: int, *, blip: bool = False) -> NodeFingerprint:
    devices = tuple(
        DeviceFingerprint(
            index=i,
            uuid=f"{node}-{i}",
            vendor="nvidia",
            model="H200",
            vram_total_mib=141_000,
            vram_free_mib=100_000,
            compute=Compute(acu_profile=317.0, tflops_fp16_profile=989.0),
            telemetry=Telemetry(
                utilisation_pct=90.0,
                sm_clock_mhz=1980.0,
                power_w=500.0,
                power_limit_w=700.0,
                temperature_c=60.0,
                ecc_corrected=1 if blip and i == 0 else 0,
                achieved_tflops_fp16=700.0 + (i % 3),
            ),
        )
        for i in range(DEVICES)
    )
    return NodeFingerprint(
        node=node, agent_version="bench", boot_id="b", seq=seq, time_s=float(seq), devices=devices
    )


def _nodes(count: int) -> list[str]:
    return [f"gpu-{i:05d}" for i in range(count)]


# -- role: healer (its own process, as deployed) ------------------------------------------


async def _healer(args: argparse.Namespace) -> None:
    from hcs_bus.kube import connect_url
    from healer.healing import Healer

    configure(TelemetrySettings(log_level="error"), service="bench-healer")
    bus = await connect(BusSettings(url=args.nats, name="bench-healer"))
    kube = await connect_url(args.api)
    # one failed device of four taints its node: the bench times fatal → taint
    settings = HealerSettings(taint_failed_share=1 / DEVICES)
    healer = Healer(bus, kube, settings, durable=args.durable)
    await healer.start()
    await healer.ready.wait()
    # a new leader first reads every Node it learns about (adopting an earlier
    # leader's taints); the bench times fatal → taint in steady state, after that
    loop = asyncio.get_running_loop()
    started = loop.time()
    while set(healer.last_seen) - healer.read_nodes and loop.time() - started < 120:
        await asyncio.sleep(0.05)
    print(
        f"adopted {len(healer.read_nodes)} nodes in {loop.time() - started:.1f}s", file=sys.stderr
    )
    print("READY", flush=True)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await healer.stop()
    await kube.close()
    await bus.nc.close()


# -- role: load (background fingerprints and noise) -----------------------------------------


async def _load(args: argparse.Namespace) -> None:
    configure(TelemetrySettings(log_level="error"), service="bench-load")
    bus = await connect(BusSettings(url=args.nats, name="bench-load"))
    nodes = _nodes(args.nodes)
    rng = random.Random(7)
    run = uuid.uuid4().hex[:8]
    sent, noise, seq, started = 0, 0, 1, time.monotonic()
    deadline = started + args.seconds
    while time.monotonic() < deadline:
        tick = time.monotonic()
        seq += 1
        start = (seq * args.rate) % len(nodes)  # rotate when the rate is below the fleet
        chosen = [nodes[(start + k) % len(nodes)] for k in range(min(args.rate, len(nodes)))]
        batch = [
            (
                subjects.fp(n),
                _fingerprint(n, seq, blip=args.noise and rng.random() < 0.01),
                f"{n}:{run}:{seq}",
            )
            for n in chosen
        ]
        await bus.publish_window(batch, window=500)
        sent += len(batch)
        if args.noise:
            noise += await _noise(bus, nodes, rng, seq=seq)
        await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - tick)))
    elapsed = time.monotonic() - started
    print(json.dumps({"fp_per_s": sent / elapsed, "noise": noise}), flush=True)
    await bus.nc.close()


async def _noise(bus: Bus, nodes: list[str], rng: random.Random, *, seq: int) -> int:
    items = []
    for k in range(50):
        node = rng.choice(nodes)
        if k % 2:
            event = HealthEvent(
                node=node,
                kind="xid",
                severity="info",
                source="probe",
                time_s=float(seq),
                device=rng.randrange(DEVICES),
                code=rng.choice([13, 31, 43, 45, 68]),
            )
        else:
            event = HealthEvent(
                node=node,
                kind="aer_correctable",
                severity="warning",
                source="probe",
                time_s=float(seq),
                device=rng.randrange(DEVICES),
            )
        items.append((subjects.health(node), event, uuid.uuid4().hex))
    await bus.publish_window(items)
    return len(items)


# -- the driver -----------------------------------------------------------------------------


@dataclass
class Result:
    name: str
    faults: int
    p50_ms: float | None
    p99_ms: float | None
    tainted: int
    false_isolations: int
    fp_per_s: float
    breaker_open: int


def _api_double() -> Any:
    from tests.apiserver import ApiServer

    class TimedApi(ApiServer):  # type: ignore[misc]
        """Remembers when each node's taint was first accepted."""

        def __init__(self) -> None:
            super().__init__()
            self.tainted_at: dict[str, float] = {}

        def store(self, resource: str, key: Any, obj: Any) -> Any:
            stored = super().store(resource, key, obj)
            if resource == "nodes" and key not in self.tainted_at:
                taints = (obj.get("spec") or {}).get("taints") or []
                if any(t.get("key") == TAINT for t in taints):
                    self.tainted_at[key] = time.monotonic()
            return stored

    return TimedApi()


def _spawn(role: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.heal", "--role", role, *extra],
        stdout=subprocess.PIPE,
        text=True,
    )


async def _readline(proc: subprocess.Popen[str], *, timeout_s: float, prefix: str = "") -> str:
    """The next stdout line starting with ``prefix`` (other lines are skipped)."""
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout_s
    while True:
        left = deadline - time.monotonic()
        line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), timeout=left)
        if not line:
            raise RuntimeError(f"a bench process ended without a {prefix!r} line")
        if line.startswith(prefix):
            return line


async def _scenario(
    name: str,
    *,
    bus: Bus,
    nats_url: str,
    args: argparse.Namespace,
    load: bool,
    faults: int,
    noise: bool,
) -> Result:
    for config in streams.stream_configs(BusSettings(url=nats_url)):
        assert config.name
        await bus.js.purge_stream(config.name)
    api = await _api_double().start()
    nodes = _nodes(args.nodes)
    for node in nodes:
        api.add_node(node)
    run = uuid.uuid4().hex[:8]  # msg ids unique per run: the dedup window outlives a purge
    await bus.publish_window([(subjects.fp(n), _fingerprint(n, 1), f"{n}:{run}:1") for n in nodes])
    healer = _spawn(
        "healer", "--nats", nats_url, "--api", api.url, "--durable", f"bench-{uuid.uuid4().hex[:6]}"
    )
    loader: subprocess.Popen[str] | None = None
    try:
        await _readline(healer, timeout_s=120, prefix="READY")
        seconds = args.seconds + 5
        if load:
            extra = ["--noise"] if noise else []
            loader = _spawn(
                "load",
                "--nats",
                nats_url,
                "--nodes",
                str(args.nodes),
                "--rate",
                str(args.rate),
                "--seconds",
                str(seconds),
                *extra,
            )
        await asyncio.sleep(2.0)
        sent = await _faults(bus, nodes, count=faults, seconds=args.seconds)
        await _settle(api, sent, seconds=10.0 if faults else args.seconds)
        fp_rate = 0.0
        if loader is not None:
            fp_rate = json.loads(await _readline(loader, timeout_s=seconds + 30, prefix="{"))[
                "fp_per_s"
            ]
        return _result(
            name, api=api, sent=sent, fp_rate=fp_rate, breaker=await _breaker_alerts(bus)
        )
    finally:
        for proc in (healer, loader):
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                await asyncio.to_thread(proc.wait, 20)
        await api.stop()


async def _faults(bus: Bus, nodes: list[str], *, count: int, seconds: float) -> dict[str, float]:
    """``count`` fatal events on distinct nodes, spread over ``seconds``."""
    victims = random.Random(11).sample(nodes, count) if count else []
    sent: dict[str, float] = {}
    for i, node in enumerate(victims):
        event = HealthEvent(
            node=node,
            kind="xid",
            severity="fatal",
            source="probe",
            time_s=time.time(),
            device=i % DEVICES,
            code=79,
        )
        sent[node] = time.monotonic()
        await bus.publish(subjects.health(node), event, msg_id=f"fault:{node}:{uuid.uuid4()}")
        await asyncio.sleep(seconds / max(count, 1))
    return sent


async def _settle(api: Any, sent: dict[str, float], *, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not set(sent) <= set(api.tainted_at):
        await asyncio.sleep(0.1)
    if not sent:
        await asyncio.sleep(1.0)


async def _breaker_alerts(bus: Bus) -> int:
    info = await bus.js.stream_info(streams.HEALTH)
    count = 0
    if info.state.messages:
        sub = await bus.js.subscribe(subjects.HEALTH_ALL, ordered_consumer=True)
        for _ in range(info.state.messages):
            try:
                msg = await sub.next_msg(timeout=2.0)
            except Exception:
                break
            count += b'"breaker_open"' in msg.data
        await sub.unsubscribe()
    return count


def _result(name: str, *, api: Any, sent: dict[str, float], fp_rate: float, breaker: int) -> Result:
    latencies = sorted(
        (api.tainted_at[n] - t) * 1000 for n, t in sent.items() if n in api.tainted_at
    )
    if sent:  # where the tail is: the slowest faults, by time into the fault window
        first = min(sent.values())
        slow = sorted(
            ((api.tainted_at[n] - t, t - first) for n, t in sent.items() if n in api.tainted_at),
            reverse=True,
        )[:5]
        print(
            f"{name}: slowest " + ", ".join(f"{ms * 1000:.0f} ms at +{at:.1f}s" for ms, at in slow),
            file=sys.stderr,
        )
    false = len(set(api.tainted_at) - set(sent))
    p50 = statistics.median(latencies) if latencies else None
    p99 = latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] if latencies else None
    return Result(name, len(sent), p50, p99, len(latencies), false, fp_rate, breaker)


def _print(results: list[Result], args: argparse.Namespace) -> None:
    print(f"\nhealer bench: {args.nodes} nodes × {DEVICES} devices, {os.cpu_count()} CPUs")
    print(
        f"{'scenario':<30}{'faults':>7}{'tainted':>8}{'p50 ms':>9}{'p99 ms':>9}"
        f"{'false':>7}{'breaker':>8}{'fp/s':>9}"
    )
    for r in results:
        p50 = f"{r.p50_ms:.1f}" if r.p50_ms is not None else "-"
        p99 = f"{r.p99_ms:.1f}" if r.p99_ms is not None else "-"
        print(
            f"{r.name:<30}{r.faults:>7}{r.tainted:>8}{p50:>9}{p99:>9}"
            f"{r.false_isolations:>7}{r.breaker_open:>8}{r.fp_per_s:>9.0f}"
        )
    print("targets: p99 ≤ 250 ms under load; 0 false isolations; breaker closed (4 % < 10 %)")


async def _drive(args: argparse.Namespace) -> None:
    configure(TelemetrySettings(log_level="error"), service="bench-heal")
    server = NatsServer().start()
    try:
        bus = await connect(BusSettings(url=server.url, name="bench-driver"))
        await streams.init(bus, BusSettings(url=server.url))
        common: dict[str, Any] = {"bus": bus, "nats_url": server.url, "args": args}
        results = [
            await _scenario(
                "baseline: idle fleet, fatal", load=False, faults=args.faults, noise=False, **common
            ),
            await _scenario(
                "telemetry load, fatal", load=True, faults=args.faults, noise=False, **common
            ),
            await _scenario("healthy fleet + noise", load=True, faults=0, noise=True, **common),
        ]
        await bus.nc.close()
    finally:
        server.cleanup()
    _print(results, args)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.heal", description=__doc__)
    parser.add_argument("--role", choices=["driver", "healer", "load"], default="driver")
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--rate", type=int, default=5000, help="fingerprints per second")
    parser.add_argument("--seconds", type=float, default=20.0, help="fault injection span")
    parser.add_argument("--nats", default="")
    parser.add_argument("--api", default="")
    parser.add_argument("--durable", default="bench")
    parser.add_argument("--noise", action="store_true")
    args = parser.parse_args(argv)
    role = {"driver": _drive, "healer": _healer, "load": _load}[args.role]
    asyncio.run(role(args))


if __name__ == "__main__":
    main()
