"""Ingest benchmark: ``python -m bench.ingest [--small] [--bus KIND | --compare-bus]``.

Fills a real nats-server with a synthetic fleet (10,000 nodes × 8 devices:
fingerprints, plus health events at 1 per node per second for 10 s = 100k,
plus a reservations document per node in KV ``hcs_alloc``),
then measures, each in its own subprocess (so peak RSS does not mix):

* the ClusterView (scheduler/view/follow_loop.py on hcs_bus.bus.Follower: ordered
  push consumers, no acks) replaying both streams until every message is
  applied, and its time to ready (the ledger listed and replayed too: a
  view ready with fewer reservations than stored fails the run);
* the same-policy baseline: a bare nats-py ordered push consumer that only
  decodes the same messages (no acks, like the view);
* a bare nats-py pull consumer that decodes and acks (AckAll, batch 1,000),
  the pattern the durable service consumers use, for reference.

The ratio is taken against the same-policy baseline, which reads the two
streams only: the view also replays the ledger (one key per node), which
costs it about 0.1 of the ratio on this machine.

Targets: ratio ≥ 0.7, ≥ 20,000 events/s, RSS ≤ 300 MB, ready ≤ 5 s.

``--bus single|cluster|cluster-sync`` runs it on one server (R1), on a
three-server cluster (R3) or on that cluster fsyncing every write
(``bench.buses``); ``--compare-bus`` fills and replays on all three in one run
(the fill and the view only) and prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from typing import Any

import msgspec
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from bench import buses
from bench.fleets import node_fingerprint
from hcs_bus import streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import (
    DeviceSlice,
    HealthEvent,
    NodeFingerprint,
    NodeReservations,
    PodRef,
    Reservation,
)
from hcs_bus.settings import BusSettings, SchedulerSettings, TelemetrySettings
from hcs_bus.telemetry import configure

BATCH = 1000
APPLY_WAIT_S = 300.0


def fingerprint(n: int) -> NodeFingerprint:
    return node_fingerprint(f"node-{n}")


def health(n: int, second: int) -> HealthEvent:
    if second == 0 and n % 100 == 0:
        return HealthEvent(
            node=f"node-{n}",
            kind="verdict",
            severity="warning",
            source="healer",
            time_s=float(second),
            device=0,
            verdict="degraded",
            health_score=70,
        )
    return HealthEvent(
        node=f"node-{n}",
        kind="ecc_corrected",
        severity="info",
        source="agent",
        time_s=float(second),
        device=second % 8,
        code=second,
        evidence={"count": second},
    )


async def fill(bus: Bus, *, nodes: int, seconds: int) -> int:
    await bus.publish_window(
        (subjects.fp(f"node-{n}"), fingerprint(n), f"fp:{n}") for n in range(nodes)
    )
    await bus.publish_window(
        (_health_subject(event), event, f"h:{n}:{s}")
        for s in range(seconds)
        for n in range(nodes)
        for event in (health(n, s),)
    )
    # the ledger: every node's reservations document, which the view lists
    # (hcs_bus.kvkeys) and replays before it is ready
    await bus.publish_window(
        (streams.kv_subject(streams.KV_ALLOC, subjects.alloc_key(doc.node)), doc, f"kv:{n}")
        for n in range(nodes)
        for doc in (reservations(n),)
    )
    return nodes + nodes * seconds


def reservations(n: int) -> NodeReservations:
    node = f"node-{n}"
    return NodeReservations(
        node=node,
        reservations=tuple(
            Reservation(
                pod=PodRef(namespace="ml", name=f"{node}-p{d}", uid=f"{n}-{d}"),
                devices=(DeviceSlice(index=d, uuid=f"GPU-{n}-{d}", vram_mib=16_384),),
                state="bound",
                time_s=1.0,
            )
            for d in range(2)
        ),
    )


def _health_subject(event: HealthEvent) -> str:
    """Verdicts go where the healer publishes them (elsewhere they are dead letters)."""
    if event.source == "healer":
        return subjects.healer_health(event.node)
    return subjects.health(event.node)


def peak_rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------------------- the roles --


async def role_view(url: str, total: int) -> dict[str, Any]:
    from scheduler.view.follow_loop import ClusterView

    configure(TelemetrySettings(log_level="error"), service="bench")
    bus = await connect(BusSettings(url=url, name="bench-view"))
    view = ClusterView(bus, settings=SchedulerSettings(stale_after_s=3600), batch=BATCH)
    t0 = time.perf_counter()
    await view.start()
    await view.wait_ready(timeout_s=120)
    ready_s = time.perf_counter() - t0
    booked = sum(len(n.reservations) for n in view.state.nodes.values())
    if booked != 2 * len(view.state.nodes):
        sys.exit(f"the view was ready holding {booked} reservations of {2 * len(view.state.nodes)}")
    while view.applied < total:
        if time.perf_counter() - t0 > APPLY_WAIT_S:  # some never applied: say so, do not hang
            sys.exit(f"the view applied {view.applied} of {total} in {APPLY_WAIT_S:g} s")
        await asyncio.sleep(0.005)
    took = time.perf_counter() - t0
    nodes = len(view.state.nodes)
    await view.stop()
    await bus.nc.close()
    return {"rate": total / took, "ready_s": ready_s, "rss_mb": peak_rss_mb(), "nodes": nodes}


async def _drain(
    bus: Bus, *, stream: str, subject: str, kind: type, deliver: DeliverPolicy, counts: list[int]
) -> None:
    config = ConsumerConfig(
        ack_policy=AckPolicy.ALL,
        deliver_policy=deliver,
        max_ack_pending=2 * BATCH,
        filter_subject=subject,
        inactive_threshold=60.0,
    )
    sub = await bus.js.pull_subscribe(subject, stream=stream, config=config)
    pending = (await sub.consumer_info()).num_pending
    decode = msgspec.json.Decoder(kind).decode
    seen = 0
    while seen < pending:
        try:
            batch = await sub.fetch(BATCH, timeout=1.0)
        except TimeoutError:
            continue
        for msg in batch:
            decode(msg.data)
        await batch[-1].ack()
        seen += len(batch)
    counts.append(seen)


async def _baseline(url: str, total: int, *, consume: Any, name: str) -> dict[str, Any]:
    """Run one bare consumer over both streams, as the view reads them."""
    bus = await connect(BusSettings(url=url, name=name))
    counts: list[int] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        consume(
            bus,
            stream=streams.FP,
            subject=subjects.FP_ALL,
            kind=NodeFingerprint,
            deliver=DeliverPolicy.LAST_PER_SUBJECT,
            counts=counts,
        ),
        consume(
            bus,
            stream=streams.HEALTH,
            subject=subjects.HEALTH_ALL,
            kind=HealthEvent,
            deliver=DeliverPolicy.ALL,
            counts=counts,
        ),
    )
    took = time.perf_counter() - t0
    await bus.nc.close()
    assert sum(counts) == total, (counts, total)
    return {"rate": total / took, "rss_mb": peak_rss_mb()}


async def role_bare(url: str, total: int) -> dict[str, Any]:
    return await _baseline(url, total, consume=_drain, name="bench-bare")


async def _follow_bare(
    bus: Bus, *, stream: str, subject: str, kind: type, deliver: DeliverPolicy, counts: list[int]
) -> None:
    decode = msgspec.json.Decoder(kind).decode
    seen = [0]
    done = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        decode(msg.data)
        seen[0] += 1
        if msg.reply.rsplit(".", 1)[-1] == "0":
            done.set()

    sub = await bus.js.subscribe(
        subject,
        stream=stream,
        cb=on_msg,
        ordered_consumer=True,
        deliver_policy=deliver,
        pending_msgs_limit=1_000_000,
        pending_bytes_limit=1 << 30,
    )
    await done.wait()
    await sub.unsubscribe()
    counts.append(seen[0])


async def role_bare_ordered(url: str, total: int) -> dict[str, Any]:
    return await _baseline(url, total, consume=_follow_bare, name="bench-bare-ordered")


ROLES = {"view": role_view, "bare": role_bare, "bare-ordered": role_bare_ordered}


def run_role(role: str, url: str, total: int) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.ingest", "--role", role, "--url", url, "--total", str(total)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if out.returncode:
        sys.exit(f"bench.ingest role {role} failed: {out.stderr.strip()[-500:]}")
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


async def main(small: bool, bus_kind: str = "single") -> None:
    configure(TelemetrySettings(log_level="error"), service="bench")
    nodes, seconds = (500, 4) if small else (10_000, 10)
    with buses.started(bus_kind) as started:
        total, fill_s = await _filled(started, nodes=nodes, seconds=seconds)
        bare = run_role("bare", started.url, total)
        ordered = run_role("bare-ordered", started.url, total)
        view = run_role("view", started.url, total)
    report(nodes=nodes, total=total, fill_s=fill_s, bare=bare, ordered=ordered, view=view)


async def _filled(started: buses.Started, *, nodes: int, seconds: int) -> tuple[int, float]:
    """Messages written and the seconds it took (every one acknowledged)."""
    settings = BusSettings(url=started.url, name="bench-fill", replicas=started.replicas)
    bus = await connect(settings)
    await streams.init(bus, settings)
    t0 = time.perf_counter()
    total = await fill(bus, nodes=nodes, seconds=seconds)
    fill_s = time.perf_counter() - t0
    await bus.nc.close()
    return total, fill_s


async def compare(small: bool) -> None:
    """``--compare-bus``: the fill (acknowledged writes) and the view's replay
    on each kind of bus, one table."""
    configure(TelemetrySettings(log_level="error"), service="bench")
    nodes, seconds = (500, 4) if small else (2_000, 10)
    rows: dict[str, dict[str, float]] = {}
    for kind in buses.KINDS:
        with buses.started(kind) as started:
            total, fill_s = await _filled(started, nodes=nodes, seconds=seconds)
            view = run_role("view", started.url, total)
        rows[kind] = {"written_s": (total + nodes) / fill_s, **view}
    print(
        f"\nHCS ingest bench, the price of safety: {nodes} nodes × 8 devices, "
        f"{total} messages + {nodes} ledger keys"
    )
    print(f"{'bus':<14}{'writes/s':>10}{'vs single':>11}{'view events/s':>15}{'ready s':>9}")
    base = rows["single"]["written_s"] or 1.0
    for kind, r in rows.items():
        print(
            f"{kind:<14}{r['written_s']:>10.0f}{r['written_s'] / base:>10.2f}×"
            f"{r['rate']:>15.0f}{r['ready_s']:>9.2f}"
        )


def report(**r: Any) -> None:
    bare, ordered, view = r["bare"], r["ordered"], r["view"]
    ratio = view["rate"] / ordered["rate"]
    print(
        f"\nHCS ingest bench: {r['nodes']} nodes × 8 devices, {r['total']} messages "
        f"(filled in {r['fill_s']:.1f}s)"
    )
    print(f"{'consumer':<36}{'events/s':>10}{'peak RSS MB':>13}{'ready s':>9}")
    print(
        f"{'bare ordered push, decode (no ack)':<36}{ordered['rate']:>10.0f}"
        f"{ordered['rss_mb']:>13.0f}{'':>9}"
    )
    print(
        f"{'bare pull, decode+AckAll (reference)':<36}{bare['rate']:>10.0f}"
        f"{bare['rss_mb']:>13.0f}{'':>9}"
    )
    print(
        f"{'ClusterView (+ the ledger)':<36}{view['rate']:>10.0f}{view['rss_mb']:>13.0f}"
        f"{view['ready_s']:>9.2f}"
    )
    checks = [
        ("ratio ≥ 0.7 (same policy)", ratio >= 0.7, f"{ratio:.2f}"),
        ("≥ 20,000 events/s", view["rate"] >= 20_000, f"{view['rate']:.0f}"),
        ("RSS ≤ 300 MB", view["rss_mb"] <= 300, f"{view['rss_mb']:.0f}"),
        ("ready ≤ 5 s", view["ready_s"] <= 5, f"{view['ready_s']:.2f}"),
    ]
    for name, ok, value in checks:
        print(f"  {name:<22}{value:>10}  {'ok' if ok else 'MISSED'}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="a quick run at tiny size")
    parser.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--total", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--bus", choices=buses.KINDS, default="single", help=buses.__doc__)
    parser.add_argument(
        "--compare-bus", action="store_true", help="the fill and the view on each --bus, one table"
    )
    args = parser.parse_args()
    if args.role:
        print(json.dumps(asyncio.run(ROLES[args.role](args.url, args.total))))
    elif args.compare_bus:
        asyncio.run(compare(args.small))
    else:
        asyncio.run(main(args.small, args.bus))
