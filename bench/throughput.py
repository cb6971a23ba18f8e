"""Scheduling throughput as kube-scheduler measures itself (scheduler_perf):
``python -m bench.throughput --nodes N --pods P --rounds R``.

A real etcd, kube-apiserver and kube-scheduler (``HCS_KUBE_BIN``, see
tests/e2e) with ``--nodes`` Node objects and no kubelets: each Node is
created Ready, untainted, advertising ``example.com/dev``, with the
``hcs.io/*`` labels and ``ai.compute/*`` capacity its agent writes; the HCS
parts run as ``hcs up`` starts them, the simulated fleet's agents publishing
each node's fingerprint (8 devices, the five classes of ``bench.burst`` in
turn) and writing its labels and capacity again, as on a real node. kube-controller-manager runs without its node lifecycle
controller, which would mark kubelet-less Nodes unreachable. A pod counts
as scheduled once its ``spec.nodeName`` is set (seen on a watch): nothing
runs it.

Each round creates ``--pods`` pods at once from ``--workers`` clients, twice:

* plain: ``example.com/dev: 1``; kube-scheduler never calls the extender
  (its ``managedResources`` are ``ai.compute/*`` only), the webhook passes
  the pod through;
* hcs: ``ai.compute/vram``; the webhook plans it and pledges, the extender
  filters, ranks and binds it.

Same kube-scheduler binary and configuration (its client QPS/burst raised
to ``--qps``/2 × ``--qps`` for both), plain first in odd rounds and HCS
first in even ones. Printed per burst and as medians: pods bound per second
(first create → last bound), create → bound p50/p99, admissions refused
(with ``hcs_injector_refusals_total`` by reason), CPU ms per pod of each
process less its load at rest (``settled_rest``: taken once the fresh
cluster has settled and the mirror has written every ComputeNode once), the
HCS scheduler's RSS; then each round's
ratio and, last, ``ratio bound/s hcs/plain: X at N nodes``.

``--profile`` runs the HCS scheduler (``--profile injector``: the injector)
under ``bench.cpu_sampler``, samples its CPU time through the first HCS
burst and prints its busiest functions (on the stack, and innermost).

A fleet of thousands (``--nodes 5000``) reports less often
(``--report-interval-s 30``): the scheduler's ``stale_after_s`` follows
(``--stale-after-s``, by default 3.5 report intervals and at least the
product's 35 s, handed to the parts as ``HCS_SCHEDULER__STALE_AFTER_S``), so
a node goes stale only when three reports in a row are missing.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import math
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec
import yaml

from agents import fleet as fleets
from agents.fleet import NodeSpec, profiles_of
from agents.labels import capacity, node_labels
from bench import cpu_sampler
from bench.burst import (
    PLAIN,
    PLAIN_KIND,
    Watcher,
    _samples,
    burst_pod,
    clear,
    cost_per_pod,
    cpu_now,
    fleet_file,
    round_order,
    settled_rest,
    wait_labelled,
)
from bench.cpucap import CapError, CpuCap
from bench.fleets import of_profile
from bench.mixes import Kind
from hcs_bus import profiles
from hcs_bus.profiles import ProfileDB
from hcs_bus.settings import SchedulerSettings, TelemetrySettings
from hcs_bus.telemetry import configure
from tests.e2e.api import ApiError, wait_for
from tests.e2e.cluster import CONTROLLERS, NOT_READY_TAINT, Cluster, find_binaries
from tests.e2e.stack import Stack

# the processes each burst's CPU is shown for, in this order; the others summed
SHOWN = ("scheduler", "injector", "nats-server", "kube-scheduler", "kube-apiserver", "etcd")
STALE_ENV = "HCS_SCHEDULER__STALE_AFTER_S"  # how the parts get the bench's staleness
REFUSALS = "hcs_injector_refusals_total"


def node_object(spec: NodeSpec, *, plain_per_node: int, db: ProfileDB) -> dict[str, Any]:
    """A Node as a kubelet would register it, Ready, with ``example.com/dev``,
    and the ``hcs.io/*`` labels and ``ai.compute/*`` capacity its agent writes
    (the simulated agents write them again; a fleet of thousands takes them
    minutes to go round)."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    found = profiles_of(spec, db=db)
    devices = [d for p in found for d in of_profile(spec.name, p).devices[:1]]
    devices = [msgspec.structs.replace(d, index=i) for i, d in enumerate(devices)]
    resources = {"cpu": "128", "memory": "1Ti", "pods": "1000", PLAIN: str(plain_per_node)}
    resources.update({k: str(v) for k, v in capacity(devices).items()})
    labels = node_labels(
        {"kubernetes.io/hostname": spec.name, "kubernetes.io/os": "linux", **spec.labels},
        profiles=found,
        network_group=spec.network_group,
        rdma_fabric=spec.rdma_fabric,
    )
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": spec.name, "labels": labels},
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
        },
    }


def create_nodes(cluster: Cluster, fleet: Path, *, plain_per_node: int, workers: int) -> None:
    """The fleet's Nodes, created Ready; the not-ready taint the API server
    puts on a new Node (which the node lifecycle controller would lift) taken off."""
    db = profiles.load()

    def one(spec: NodeSpec) -> None:
        cluster.api.create(node_object(spec, plain_per_node=plain_per_node, db=db))
        cluster.api.patch(f"/api/v1/nodes/{spec.name}", {"spec": {"taints": None}})

    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(one, fleets.load(fleet, db=db).nodes))
    tainted = [
        n["metadata"]["name"]
        for n in cluster.api.items("/api/v1/nodes")
        if any(t.get("key") == NOT_READY_TAINT for t in n.get("spec", {}).get("taints") or [])
    ]
    if tainted:
        raise AssertionError(f"nodes still tainted {NOT_READY_TAINT}: {tainted[:5]}")


def wait_mirrored(cluster: Cluster, names: list[str], *, poll_s: float = 2.0) -> float:
    """Until the mirror has written every node's ComputeNode status once (its
    first writes are one PATCH per node, start-up work like the Nodes'
    labels); the seconds it took. Polled every ``poll_s``: each poll lists
    every ComputeNode."""
    wanted, started = set(names), time.monotonic()
    deadline = started + max(120.0, len(names) / 20)
    while True:
        items = cluster.api.items("/apis/hcs.io/v1alpha1/computenodes")
        written = {i["metadata"]["name"] for i in items if i.get("status", {}).get("observedSeq")}
        if wanted <= written:
            return time.monotonic() - started
        if time.monotonic() > deadline:
            missing = len(wanted - written)
            raise AssertionError(f"timed out waiting for {missing} ComputeNode statuses")
        time.sleep(poll_s)


def raise_client_limits(cluster: Cluster, *, qps: int) -> None:
    """kube-scheduler's client QPS/burst raised (the same for both kinds of
    burst), and kube-scheduler started again on that configuration."""
    path = cluster.root / "kube-scheduler-config.yaml"
    config = yaml.safe_load(path.read_text())
    config["clientConnection"] = {
        **config.get("clientConnection", {}),
        "qps": qps,
        "burst": 2 * qps,
    }
    path.write_text(yaml.safe_dump(config))
    cluster.restart_scheduler()


def is_bound(pod: dict[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def refusals(stack: Stack) -> collections.Counter[str]:
    """The injector's ``hcs_injector_refusals_total`` so far, by reason."""
    out: collections.Counter[str] = collections.Counter()
    port = stack.metrics_ports.get("injector")
    if not port:
        return out
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    except OSError:
        return out
    for sample in _samples(text):
        if sample.name == REFUSALS:
            out[sample.labels.get("reason", "")] += int(sample.value)
    return out


def memory_kib(pid: int) -> tuple[int, int]:
    """(VmRSS, VmHWM) of a process in KiB; (0, 0) once it is gone."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return 0, 0
    fields = {k: v.split()[0] for k, _, v in (line.partition(":") for line in lines) if v.strip()}
    return int(fields.get("VmRSS", 0)), int(fields.get("VmHWM", 0))


class Profiler:
    """A part's CPU time sampled into collapsed stacks until ``stop``
    (it runs under ``bench.cpu_sampler``: SIGUSR1 starts, SIGUSR2 writes)."""

    def __init__(self, pid: int, *, out: Path) -> None:
        self.pid, self.out = pid, out
        out.unlink(missing_ok=True)
        os.kill(pid, signal.SIGUSR1)

    def stop(self, *, timeout_s: float = 30.0) -> str:
        """Stop sampling; "" once the file is written, else why not."""
        try:
            os.kill(self.pid, signal.SIGUSR2)
        except ProcessLookupError:
            return "the part exited before its profile was written"
        deadline = time.monotonic() + timeout_s
        while not self.out.exists():
            if time.monotonic() > deadline:
                return f"no profile written within {timeout_s:.0f} s"
            time.sleep(0.1)
        return ""


def sampled(argv: list[str], *, out: Path) -> list[str]:
    """``argv`` (``python -m scheduler ...``, or another part) run under ``bench.cpu_sampler``."""
    return [argv[0], "-m", "bench.cpu_sampler", str(out), *argv[1:]]


def top_functions(collapsed: Path, *, top: int = 15) -> list[tuple[str, float, float]]:
    """(function, share of samples on the stack, share as the innermost
    frame) of a collapsed-stacks file, busiest first."""
    total, inclusive, own = 0, collections.Counter[str](), collections.Counter[str]()
    for line in collapsed.read_text().splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = [f for f in stack.split(";") if f and not f.startswith("process ")]
        if not frames:
            continue
        total += count
        own[frames[-1]] += count
        for frame in set(frames):
            inclusive[frame] += count
    names = {n for n, _ in own.most_common(top)} | {n for n, _ in inclusive.most_common(top)}
    rows = [(n, inclusive[n] / max(total, 1), own[n] / max(total, 1)) for n in names]
    return sorted(rows, key=lambda r: -r[2])[:top]


def burst(
    cluster: Cluster,
    stack: Stack,
    *,
    label: str,
    kind: Kind,
    pods: int,
    workers: int,
    settle_s: float,
    profiler: Profiler | None = None,
) -> dict[str, Any]:
    """``pods`` pods of ``kind`` created at once; until every one is bound,
    or none was bound for ``settle_s``."""
    namespace = cluster.namespace(f"tp-{label}")
    watcher = Watcher(cluster, namespace, done=is_bound)
    watcher.start()
    refused_before = refusals(stack)
    cpu_before, cpu_start = cpu_now(cluster, stack), time.monotonic()
    asked_at: dict[str, float] = {}
    errors: list[str] = []

    def create(i: int) -> None:
        name = f"{label}-{i:05d}"
        asked_at[name] = time.monotonic()
        try:
            cluster.api.create(burst_pod(name, kind), namespace=namespace)
        except ApiError as exc:
            del asked_at[name]
            errors.append(f"{name}: {exc}")

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, range(pods)))
    created_s = time.monotonic() - start
    seen, last_progress = -1, time.monotonic()
    cpu_after, cpu_end = cpu_now(cluster, stack), time.monotonic()
    rss = memory_kib(stack.parts["scheduler"].popen.pid)
    while len(watcher.running_at) < len(asked_at):
        if len(watcher.running_at) != seen:
            seen, last_progress = len(watcher.running_at), time.monotonic()
            cpu_after, cpu_end = cpu_now(cluster, stack), time.monotonic()
            rss = max(rss, memory_kib(stack.parts["scheduler"].popen.pid))
        if time.monotonic() - last_progress > settle_s:
            break
        time.sleep(0.1)
    else:
        cpu_after, cpu_end = cpu_now(cluster, stack), time.monotonic()
        rss = max(rss, memory_kib(stack.parts["scheduler"].popen.pid))
    watcher.stopping = True
    profile = profiler.stop() if profiler is not None else ""
    bound_at = {n: t for n, t in watcher.running_at.items() if n in asked_at}
    latencies = sorted(bound_at[n] - asked_at[n] for n in bound_at)
    done = max(bound_at.values(), default=start)
    by_reason = refusals(stack) - refused_before
    return {
        "label": label,
        "namespace": namespace,
        "pods": pods,
        "created_s": created_s,
        "running": len(bound_at),  # bound: named so for bench.burst's helpers
        "bound_per_s": len(bound_at) / max(done - start, 1e-9),
        "p50_s": latencies[len(latencies) // 2] if latencies else math.nan,
        "p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else math.nan,
        "refused": len(errors),
        "refused_examples": errors[:3],
        "refusals_by_reason": dict(by_reason),
        "cpu_s": {n: (g, s - cpu_before.get(n, (g, 0.0))[1]) for n, (g, s) in cpu_after.items()},
        "cpu_wall_s": cpu_end - cpu_start,
        "rss_kib": rss[0],
        "hwm_kib": rss[1],
        "profile_stderr": profile,
    }


def cpu_cells(r: dict[str, Any], rest: dict[str, float]) -> dict[str, float]:
    """CPU ms per bound pod of each process in ``SHOWN``, and "others" summed."""
    cost = cost_per_pod(r, rest)
    cells = {n: cost.get(n, 0.0) for n in SHOWN}
    cells["others"] = sum(ms for n, ms in cost.items() if n not in SHOWN)
    return cells


def kind_of(r: dict[str, Any]) -> str:
    return "plain" if r["label"].startswith("plain") else "hcs"


def report(results: list[dict[str, Any]], rest: dict[str, float], *, nodes: int) -> float:
    """The table, per burst then medians per kind, and the rounds' ratios;
    returns the median ratio."""
    names = [*SHOWN, "others"]
    head = (
        f"{'burst':<13}{'pods':>6}{'bound':>6}{'bound/s':>9}{'p50 s':>8}{'p99 s':>8}"
        f"{'refused':>8}{'rss MiB':>8}  "
    )
    print("\nCPU ms per pod less each process's load at rest; rss: the HCS scheduler's")
    print(head + "".join(f"{n:>15}" for n in names))

    def row(label: str, rs: list[dict[str, Any]]) -> None:
        med = statistics.median
        cells = [cpu_cells(r, rest) for r in rs]
        print(
            f"{label:<13}{med(r['pods'] for r in rs):>6.0f}{med(r['running'] for r in rs):>6.0f}"
            f"{med(r['bound_per_s'] for r in rs):>9.1f}{med(r['p50_s'] for r in rs):>8.2f}"
            f"{med(r['p99_s'] for r in rs):>8.2f}{med(r['refused'] for r in rs):>8.0f}"
            f"{med(r['rss_kib'] for r in rs) / 1024:>8.0f}  "
            + "".join(f"{med(c[n] for c in cells):>15.2f}" for n in names)
        )

    for r in results:
        row(r["label"], [r])
    for kind in ("plain", "hcs"):
        row(f"median-{kind}", [r for r in results if kind_of(r) == kind])
    for r in results:
        if r["refused"] or r["refusals_by_reason"]:
            print(
                f"  {r['label']} refused {r['refused']}; {REFUSALS} by reason "
                f"{r['refusals_by_reason']}; e.g. {r['refused_examples'][:1]}"
            )
        if r["running"] < r["pods"] - r["refused"]:
            print(f"  {r['label']}: {r['pods'] - r['refused'] - r['running']} pods never bound")
    ratios = []
    for i in range(0, len(results) - 1, 2):
        pair = {kind_of(r): r for r in results[i : i + 2]}
        plain, hcs = pair["plain"], pair["hcs"]
        ratio = hcs["bound_per_s"] / plain["bound_per_s"] if plain["bound_per_s"] else math.nan
        ratios.append(ratio)
        print(f"round {i // 2 + 1}: ratio bound/s hcs/plain {ratio:.2f}")
    median = statistics.median(ratios) if ratios else math.nan
    print(f"ratio bound/s hcs/plain: {median:.2f} at {nodes} nodes")
    return median


def print_profile(path: Path, stderr: str, *, part: str) -> None:
    if not path.exists() or not path.stat().st_size:
        print(f"\nprofile: none written ({stderr.strip()[-200:] or 'no sample taken'})")
        return
    samples = sum(int(line.rpartition(" ")[2]) for line in path.read_text().splitlines())
    cpu_s = samples * cpu_sampler.INTERVAL_S
    print(f"\nHCS {part}'s CPU time through the first HCS burst: {cpu_s:.1f} s ({path})")
    print(f"  {'on stack':>9}{'own':>7}  function")
    for name, inclusive, own in top_functions(path):
        print(f"  {inclusive:>9.1%}{own:>7.1%}  {name}")


def stale_after_s(asked: float | None, report_interval_s: float) -> float:
    """The scheduler's ``stale_after_s`` for a fleet reporting every
    ``report_interval_s``: ``asked``, else what the environment already sets,
    else 3.5 reports (at least the product's default), so a node is stale
    only after three reports in a row are missing."""
    if asked is not None:
        return asked
    if os.environ.get(STALE_ENV):
        return float(os.environ[STALE_ENV])
    return max(SchedulerSettings().stale_after_s, 3.5 * report_interval_s)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.throughput", description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--workers", type=int, default=32, help="concurrent create clients")
    parser.add_argument("--vram", default="16Gi", help="ai.compute/vram per HCS pod")
    parser.add_argument("--qps", type=int, default=5000, help="kube-scheduler client QPS")
    parser.add_argument(
        "--rest-s",
        type=float,
        default=8.0,
        help="CPU at rest measured in windows this long (a report period at least)",
    )
    parser.add_argument(
        "--settle-s", type=float, default=30.0, help="stop when no pod is bound for this long"
    )
    parser.add_argument(
        "--report-interval-s", type=float, default=10.0, help="the simulated agents' period"
    )
    parser.add_argument(
        "--stale-after-s",
        type=float,
        default=None,
        help="the scheduler's stale_after_s (default: 3.5 report intervals, at least the "
        "product's 35 s): a fleet of thousands reports less often",
    )
    parser.add_argument(
        "--profile",
        nargs="?",
        const="scheduler",
        default=None,
        choices=("scheduler", "injector"),
        help="sample this HCS part's CPU time (the scheduler when none is named) through the "
        "first HCS burst",
    )
    parser.add_argument(
        "--cap-scheduler",
        type=float,
        default=None,
        metavar="CORES",
        help="hold the HCS scheduler to this share of a core once at rest (a CPU cgroup): "
        "an overloaded replica",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args(argv)
    configure(TelemetrySettings(log_format="console", log_level="warning"), service="bench-tp")
    bins = find_binaries()
    if isinstance(bins, str):
        print(f"bench.throughput: {bins}", file=sys.stderr)
        return 2
    os.environ[STALE_ENV] = str(stale_after_s(args.stale_after_s, args.report_interval_s))
    root = Path(tempfile.mkdtemp(prefix="hcs-throughput-"))
    cluster = Cluster(bins, root=root)
    stack: Stack | None = None
    cap: CpuCap | None = None
    try:
        cluster.start(controllers=f"{CONTROLLERS},-nodelifecycle")
        fleet = fleet_file(args.nodes, root, report_interval_s=args.report_interval_s)
        names = [n["name"] for n in yaml.safe_load(fleet.read_text())["nodes"]]
        t0 = time.monotonic()
        create_nodes(
            cluster, fleet, plain_per_node=-(-args.pods // len(names)) + 2, workers=args.workers
        )
        print(f"{len(names)} Nodes created Ready in {time.monotonic() - t0:.1f} s", flush=True)
        profile_path, profile_err = root / f"{args.profile}.cpu-stacks.txt", ""
        wrap = {args.profile: lambda argv: sampled(argv, out=profile_path)} if args.profile else {}
        stack = Stack(cluster, fleet=fleet, root=root, wrap=wrap)
        stack.start()
        raise_client_limits(cluster, qps=args.qps)
        wait_labelled(cluster, names)
        wait_for(
            lambda: not stack.views_missing(names),  # type: ignore[union-attr]
            what="every node's devices in the scheduler's view",
            timeout_s=max(120.0, len(names) / 20),
        )
        print(f"labelled and in HCS's view after {time.monotonic() - t0:.1f} s", flush=True)
        wait_mirrored(cluster, names)
        print(f"every ComputeNode written after {time.monotonic() - t0:.1f} s", flush=True)
        # each window spans a report period at least: the agents' reports come
        # in waves, and a shorter window holds one wave or none
        window_s = max(args.rest_s, args.report_interval_s)
        rest = settled_rest(cluster, stack, seconds=window_s)
        if args.cap_scheduler is not None:
            try:
                cap = CpuCap(stack.parts["scheduler"].popen.pid, args.cap_scheduler)
            except CapError as exc:
                print(f"bench.throughput: --cap-scheduler: {exc}", file=sys.stderr)
                return 2
            print(f"HCS scheduler held to {cap}", flush=True)
        hcs_kind = Kind("vram", 100, {"ai.compute/vram": args.vram})
        order = round_order(args.rounds, ("plain", PLAIN_KIND), ("hcs", hcs_kind))
        results: list[dict[str, Any]] = []
        for i, (kind_name, kind) in enumerate(order):
            if results:
                clear(cluster, stack, results[-1]["namespace"], rest)
            label = f"{kind_name}-{i // 2 + 1}"
            profiler = None
            if args.profile and kind_name == "hcs" and not profile_err:
                pid = stack.parts[args.profile].popen.pid
                profiler = Profiler(pid, out=profile_path)
            print(f"{label}: {args.pods} pods, {args.workers} clients", flush=True)
            results.append(
                burst(
                    cluster,
                    stack,
                    label=label,
                    kind=kind,
                    pods=args.pods,
                    workers=args.workers,
                    settle_s=args.settle_s,
                    profiler=profiler,
                )
            )
            if profiler is not None:
                profile_err = results[-1]["profile_stderr"] or "done"
            r = results[-1]
            print(
                f"  {r['running']} bound, {r['bound_per_s']:.1f}/s, p50 {r['p50_s']:.2f} s, "
                f"p99 {r['p99_s']:.2f} s, {r['refused']} refused",
                flush=True,
            )
        if cap is not None:
            print(f"HCS scheduler stopped for its cap in {cap.throttled()} periods of 100 ms")
        if args.profile:
            print_profile(profile_path, profile_err, part=args.profile)
        report(results, rest, nodes=args.nodes)  # its last line: the ratio
    finally:
        if cap is not None:
            cap.close()
        if stack is not None:
            stack.stop()
        cluster.stop()
        if args.keep:
            print(f"logs: {root / 'logs'}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
