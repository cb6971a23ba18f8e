"""Extender, plan and bind benchmark: ``python -m bench.extender [--small] [--bus KIND | --compare-bus]``.

5,000 nodes × 8 devices replayed from a real nats-server; filter then
prioritize (nodeCacheCapable, every name) through the real aiohttp server
over loopback, next to a bare aiohttp handler that decodes and re-encodes the
same payload in the same run (the floor). Then plans over ``hcs.place`` on one
replica, binds with two replicas contending, and the process's peak RSS.
Targets: extender p99 ≤ 2× floor and ≤ 15 ms; plans ≥ 500/s, p99 ≤ 10 ms;
plans that write their pledge (admissions) ≥ 1,000/s, beside dry runs; the
plans' cluster summary rebuilt from kept per-node parts with 1 % of the
nodes changed ≤ 0.2× one made afresh (the same summary, checked).

``--bus single|cluster|cluster-sync`` runs it on one server (R1), on a
three-server cluster (R3) or on that cluster fsyncing every write
(``bench.buses``); ``--compare-bus`` runs plans, admissions and binds on all
three in one process and prints one table: the price of replication and of
``sync_interval: always``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import resource
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import msgspec
from aiohttp import web

from bench import buses
from bench.fleets import node_fingerprint
from hcs_bus import streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import (
    NodeFingerprint,
    PlanRequest,
    PodRef,
    Policy,
    Requests,
)
from hcs_bus.natsserver import free_port
from hcs_bus.settings import BusSettings, Settings, replace
from hcs_bus.telemetry import TelemetrySettings, configure
from scheduler.plan import fleet_summary
from scheduler.plan import rules as planning
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.replica import Scheduler, run

SLICE = {
    "vendor": "nvidia",
    "model": "A100-80G",
    "devices": 1,
    "vram_mib_per_device": 8192,
    "whole_device": False,
    "acu_per_device": 10.0,
}


def fleet(nodes: int) -> list[NodeFingerprint]:
    return [
        node_fingerprint(f"node-{n}", labels={"hcs.io/rdma-fabric": f"f{n % 16}"})
        for n in range(nodes)
    ]


def filter_body(names: list[str]) -> bytes:
    pod = {
        "metadata": {
            "name": "bench",
            "namespace": "ml",
            "uid": "uid-bench",
            "annotations": {"hcs.io/plan": json.dumps(SLICE)},
        },
        "spec": {"containers": [{"name": "c", "resources": {}}], "priority": 0},
    }
    return json.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}).encode()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def timed(calls: int, call: Callable[[], Awaitable[Any]]) -> list[float]:
    out = []
    for _ in range(calls):
        t0 = time.perf_counter()
        await call()
        out.append(time.perf_counter() - t0)
    return out


async def floor_server() -> tuple[web.AppRunner, int]:
    async def echo(request: web.Request) -> web.Response:
        body = msgspec.json.decode(await request.read())
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/filter", echo)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, port


async def bench_extender(sched: Scheduler, names: list[str], calls: int) -> dict[str, Any]:
    body = filter_body(names)
    runner, floor_port = await floor_server()
    base = f"http://127.0.0.1:{sched.port}"
    try:
        async with aiohttp.ClientSession() as session:

            async def post(url: str) -> None:
                async with session.post(url, data=body) as resp:
                    assert resp.status == 200, await resp.text()
                    await resp.read()

            await post(f"{base}/filter")  # warm the cache, as kube-scheduler's stream would
            await post(f"{base}/prioritize")
            floor = await timed(calls, lambda: post(f"http://127.0.0.1:{floor_port}/filter"))
            filt = await timed(calls, lambda: post(f"{base}/filter"))
            prio = await timed(calls, lambda: post(f"{base}/prioritize"))
    finally:
        await runner.cleanup()
    return {"floor": floor, "filter": filt, "prioritize": prio}


async def bench_plans(
    bus: Bus, count: int, *, concurrency: int = 4, pledged: bool = False
) -> tuple[float, list[float]]:
    """Plans per second; ``pledged``: admissions (each writes its pledge into
    the ledger with compare-and-set, all in one namespace: the worst case),
    else dry runs (nothing recorded)."""
    request = PlanRequest(
        namespace="ml-pledged" if pledged else "ml",
        requests=Requests(vram_mib=16384, acu=20),
        policy=Policy(),
        dry_run=not pledged,
    )
    from hcs_bus.messages import Plan

    latencies: list[float] = []

    async def worker(w: int, n: int) -> None:
        for i in range(n):
            t0 = time.perf_counter()
            subject = subjects.place(dry_run=request.dry_run)
            # an admission names its pod and its admission (hcs.place refuses one without)
            asked = (
                msgspec.structs.replace(request, pod_name=f"p{w}-{i}", admission_uid=f"a{w}-{i}")
                if pledged
                else request
            )
            plan = await bus.request(subject, asked, Plan, timeout_s=5)
            latencies.append(time.perf_counter() - t0)
            assert plan.ok, plan.reason

    t0 = time.perf_counter()
    await asyncio.gather(*(worker(w, count // concurrency) for w in range(concurrency)))
    return len(latencies) / (time.perf_counter() - t0), latencies


def bench_summary(nodes: dict[str, Any], rounds: int = 20) -> dict[str, list[float]]:  # seconds
    """The planner's cluster summary, rebuilt at most every 0.5 s while the
    view changes (at 5,000 nodes reporting every 10 s: always): made afresh
    (every device and reservation again, as before ``planning.Parts``) and
    from kept parts with 1 % of the nodes changed since the last one."""
    names = list(nodes)
    changed = max(len(names) // 100, 1)
    parts = fleet_summary.Parts()
    parts.summary(nodes)
    out: dict[str, list[float]] = {"afresh": [], "parts": []}
    for r in range(rounds):
        t = time.perf_counter()
        whole = planning.summarise(nodes.values())
        out["afresh"].append(time.perf_counter() - t)
        for name in names[r * changed : (r + 1) * changed]:
            parts.changed(name)
        t = time.perf_counter()
        kept = parts.summary(nodes)
        out["parts"].append(time.perf_counter() - t)
        assert kept == whole, "a summary from kept parts differs from one made afresh"
    return out


async def bench_binds(replicas: list[Scheduler], names: list[str], count: int) -> tuple[float, int]:
    demand = PlanAnnotation(**SLICE)
    rng = random.Random(1)
    hot = names[: max(4, len(names) // 50)]  # contention: few nodes, two replicas

    def pod(i: int) -> PodInfo:
        return PodInfo(
            ref=PodRef(namespace="ml", name=f"b{i}", uid=f"u{i}"),
            requests=None,
            policy=Policy(),
            annotation=None,
            priority=0,
            job=None,
        )

    sem = asyncio.Semaphore(64)

    async def one(i: int) -> str:
        async with sem:
            return await replicas[i % 2].booker.bind(pod(i), demand, node=rng.choice(hot))

    t0 = time.perf_counter()
    errors = await asyncio.gather(*(one(i) for i in range(count)))
    return count / (time.perf_counter() - t0), sum(1 for e in errors if not e)


async def main(small: bool, bus_kind: str = "single") -> None:
    configure(TelemetrySettings(log_level="error"), service="bench")
    nodes, calls = (200, 200) if small else (5000, 1000)
    with buses.started(bus_kind) as started:
        r = await _run_all(started, nodes=nodes, calls=calls, small=small)
    report(**r)


async def _run_all(
    started: buses.Started, *, nodes: int, calls: int, small: bool
) -> dict[str, Any]:
    bus_settings = BusSettings(url=started.url, name="bench", replicas=started.replicas)
    bus = await connect(bus_settings)
    await streams.init(bus, bus_settings)
    fps = fleet(nodes)
    await bus.publish_window((subjects.fp(f.node), f, f"{f.node}:1") for f in fps)
    settings = replace(
        Settings(bus=bus_settings),
        scheduler={"extender_port": free_port(), "reserve_ttl_s": 3600},
    )
    t0 = time.perf_counter()
    sched = await run(bus, None, settings)
    await sched.view.wait_ready(timeout_s=60)
    ready_s = time.perf_counter() - t0
    names = [f.node for f in fps]
    ext = await bench_extender(sched, names, calls)
    summary_s = bench_summary(sched.view.state.nodes)
    plans_s, plan_lat = await bench_plans(bus, 400 if small else 4000)
    # admissions come in bursts: the same number of plans, 16 at a time,
    # as dry runs and as admissions that write their pledges
    burst = 400 if small else 2000
    dry_s, _ = await bench_plans(bus, burst, concurrency=16)
    pledged_s, pledged_lat = await bench_plans(bus, burst, concurrency=16, pledged=True)
    bus2 = await connect(bus_settings, name="bench-2")
    settings2 = replace(settings, scheduler={"extender_port": free_port()})
    other = await run(bus2, None, settings2, http=False)
    await other.view.wait_ready(timeout_s=60)
    binds_s, bound = await bench_binds([sched, other], names, 200 if small else 2000)
    await other.stop()
    await sched.stop()
    await bus2.nc.close()
    await bus.nc.close()
    return dict(
        bus=started.kind,
        nodes=nodes,
        calls=calls,
        ready_s=ready_s,
        ext=ext,
        plans_s=plans_s,
        plan_lat=plan_lat,
        dry_s=dry_s,
        pledged_s=pledged_s,
        pledged_lat=pledged_lat,
        binds_s=binds_s,
        bound=bound,
        summary_s=summary_s,
    )


async def price(started: buses.Started, *, nodes: int, count: int) -> dict[str, float]:
    """Plans (dry and pledged, 16 at a time) and binds (two replicas
    contending) per second on one bus, with their p99 in ms."""
    bus_settings = BusSettings(url=started.url, name="bench", replicas=started.replicas)
    bus = await connect(bus_settings)
    await streams.init(bus, bus_settings)
    fps = fleet(nodes)
    await bus.publish_window((subjects.fp(f.node), f, f"{f.node}:1") for f in fps)
    settings = replace(
        Settings(bus=bus_settings), scheduler={"extender_port": 0, "reserve_ttl_s": 3600}
    )
    bus2 = await connect(bus_settings, name="bench-2")
    replicas = [
        await run(bus, None, settings, http=False),
        await run(bus2, None, settings, http=False),
    ]
    try:
        for replica in replicas:
            await replica.view.wait_ready(timeout_s=60)
        dry_s, dry_lat = await bench_plans(bus, count, concurrency=16)
        pledged_s, pledged_lat = await bench_plans(bus, count, concurrency=16, pledged=True)
        binds_s, bound = await bench_binds(replicas, [f.node for f in fps], count)
    finally:
        for replica in replicas:
            await replica.stop()
        await bus2.nc.close()
        await bus.nc.close()
    return {
        "dry_s": dry_s,
        "dry_p99": pct(dry_lat, 0.99),
        "pledged_s": pledged_s,
        "pledged_p99": pct(pledged_lat, 0.99),
        "binds_s": binds_s,
        "bound": bound,
    }


async def compare(small: bool) -> None:
    """``--compare-bus``: ``price`` on each kind of bus, one table."""
    configure(TelemetrySettings(log_level="error"), service="bench")
    nodes, count = (200, 400) if small else (1000, 2000)
    rows: dict[str, dict[str, float]] = {}
    for kind in buses.KINDS:
        with buses.started(kind) as started:
            rows[kind] = await price(started, nodes=nodes, count=count)
    print(f"\nHCS extender bench, the price of safety: {nodes} nodes × 8 devices, {count} each")
    print(
        f"{'bus':<14}{'dry plans/s':>12}{'p99 ms':>8}{'pledged plans/s':>16}{'p99 ms':>8}"
        f"{'binds/s':>9}{'bound':>7}{'binds vs single':>17}"
    )
    base = rows["single"]["binds_s"] or 1.0
    for kind, r in rows.items():
        print(
            f"{kind:<14}{r['dry_s']:>12.0f}{r['dry_p99']:>8.1f}{r['pledged_s']:>16.0f}"
            f"{r['pledged_p99']:>8.1f}{r['binds_s']:>9.0f}{r['bound']:>7.0f}"
            f"{r['binds_s'] / base:>16.2f}×"
        )


def report(**r: Any) -> None:
    ext = r["ext"]
    floor99 = pct(ext["floor"], 0.99)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"\nHCS extender bench: {r['nodes']} nodes × 8 devices, {r['calls']} calls each, "
        f"bus {r['bus']}, view ready in {r['ready_s']:.2f}s"
    )
    print(f"{'what':<34}{'p50 ms':>9}{'p99 ms':>9}{'vs floor p99':>14}{'target':>16}")
    for key, label in (
        ("floor", "bare aiohttp decode+encode"),
        ("filter", "filter (names)"),
        ("prioritize", "prioritize (names)"),
    ):
        p50, p99 = pct(ext[key], 0.5), pct(ext[key], 0.99)
        ratio = p99 / floor99 if floor99 else 0.0
        target = "" if key == "floor" else ("ok" if p99 <= 15 and ratio <= 2 else "MISSED")
        print(f"{label:<34}{p50:>9.2f}{p99:>9.2f}{ratio:>13.2f}×{target + ' ≤2×,≤15ms':>16}")
    p99 = pct(r["plan_lat"], 0.99)
    ok = "ok" if r["plans_s"] >= 500 and p99 <= 10 else "MISSED"
    print(
        f"{'plans over hcs.place (1 replica)':<34}{statistics.median(r['plan_lat']) * 1000:>9.2f}"
        f"{p99:>9.2f}{r['plans_s']:>10.0f}/s   {ok} ≥500/s,≤10ms"
    )
    p99 = pct(r["pledged_lat"], 0.99)
    ok = "ok" if r["pledged_s"] >= 1000 else "MISSED"
    print(f"{'dry-run plans, 16 at a time':<34}{'':>18}{r['dry_s']:>10.0f}/s")
    print(
        f"{'plans with pledges, 16 at a time':<34}"
        f"{statistics.median(r['pledged_lat']) * 1000:>9.2f}{p99:>9.2f}"
        f"{r['pledged_s']:>10.0f}/s   {ok} ≥1000/s ({r['pledged_s'] / r['dry_s']:.2f}× dry runs)"
    )
    print(
        f"{'binds, 2 replicas contending':<34}{'':>18}{r['binds_s']:>10.0f}/s   "
        f"({r['bound']} bound)"
    )
    afresh, kept = r["summary_s"]["afresh"], r["summary_s"]["parts"]
    ratio = statistics.median(kept) / statistics.median(afresh)
    ok = "ok" if ratio <= 0.2 else "MISSED"
    print(
        f"{'plan summary, made afresh':<34}{statistics.median(afresh) * 1000:>9.2f}"
        f"{pct(afresh, 0.99):>9.2f}"
    )
    print(
        f"{'plan summary, 1 % of nodes changed':<34}{statistics.median(kept) * 1000:>9.2f}"
        f"{pct(kept, 0.99):>9.2f}{ratio:>13.2f}×   {ok} ≤0.2× afresh"
    )
    print(f"{'peak RSS (whole bench process)':<34}{rss_mb:>18.0f} MB")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at tiny size")
    parser.add_argument("--bus", choices=buses.KINDS, default="single", help=buses.__doc__)
    parser.add_argument(
        "--compare-bus", action="store_true", help="plans and binds on each --bus, one table"
    )
    args = parser.parse_args()
    if args.compare_bus:
        asyncio.run(compare(args.small))
    else:
        asyncio.run(main(args.small, args.bus))
