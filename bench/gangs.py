"""Gangs against independent pods on a real cluster: ``python -m bench.gangs
[--jobs N] [--nodes N]``.

A real control plane with ``--nodes`` hollow kubelets (``HCS_KUBE_BIN``, see
tests/e2e), the HCS parts as ``hcs up`` starts them and the project's
kube-scheduler configuration. The fleet: 8 devices per node, the five
classes of ``bench.burst`` two nodes at a time, ten nodes at a time in
network groups ``ng-0`` and ``ng-1`` in turn: every class has 16 devices in
one group from 10 nodes up (a second group from 20); at 50 nodes each class
has 48 devices in ng-0 and 32 in ng-1.

``--jobs`` jobs (seeded, ``--seed``): 40% of 1–2 ranks, 40% of 4–8, 20% of
12–16, each rank a bare pod asking ``ai.compute/devices: 1``, each job
running ``--min-s``..``--max-s`` seconds. Submitted twice, all at once, in
two namespaces, through the same kube-scheduler:

* independent: the ranks carry no job label or annotation (today's path):
  each pod is planned, pledged and bound alone;
* gangs: the ranks carry ``hcs.io/job`` (the label) and ``hcs.io/job-size``
  (the annotation), so a job of 2 ranks or more is a gang: admitted behind
  the ``hcs.io/gang`` gate holding nothing, pledged whole on one class in one
  network group, then bound.

A hollow kubelet runs a pod until it is deleted, so the benchmark ends a
job itself: ``duration`` seconds after its last rank was seen Running (a
distributed job makes no progress before every rank is up) it deletes the
job's pods. A pod refused at admission (no class has room for it now: HCS
plans at admission) is created again every ``--retry-s``, as a Job
controller would. A run ends when every job has ended, or when no job has
started or ended for ``--stuck-s`` (ranks holding devices while others wait
can leave no room for any job to complete: a deadlock).

Printed per run: jobs ended; makespan (first create to the last job's end);
device-seconds idle while some job waits (devices of the fleet no bound pod
holds, summed over time while a job has not yet started); jobs split across
classes (``hcs.io/model``) or network groups (``hcs.io/network-group``) of
the nodes their ranks were bound to (target 0); partial holds (jobs whose
ranks were some but not all bound for more than ``--partial-s`` while
another job waited; target 0); and from a job's last rank created to every
rank Running, p50/p99.
"""

from __future__ import annotations

import argparse
import bisect
import collections
import concurrent.futures
import itertools
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.burst import CLASSES, Watcher
from hcs_bus import vocabulary
from hcs_bus.settings import TelemetrySettings
from hcs_bus.telemetry import configure
from tests.e2e.api import ApiError, wait_for
from tests.e2e.cluster import Cluster, find_binaries
from tests.e2e.stack import Stack

DEVICES_PER_NODE = 8
# (share of jobs, least ranks, most ranks)
SIZES = ((0.4, 1, 2), (0.4, 4, 8), (0.2, 12, 16))
RUNS = ("independent", "gangs")
MODEL = "hcs.io/model"
GROUP = "hcs.io/network-group"


@dataclass(frozen=True, slots=True)
class Job:
    name: str
    ranks: int
    duration_s: float

    def pods(self) -> list[str]:
        return [f"{self.name}-{r}" for r in range(self.ranks)]


def job_mix(jobs: int, *, seed: int, min_s: float, max_s: float) -> list[Job]:
    """``jobs`` jobs, sizes drawn by ``SIZES``' shares, durations uniform."""
    rng = random.Random(seed)
    bounds = list(itertools.accumulate(share for share, _low, _high in SIZES))
    out = []
    for i in range(jobs):
        at = min(bisect.bisect_right(bounds, rng.random()), len(SIZES) - 1)
        _share, low, high = SIZES[at]
        out.append(Job(f"job-{i:03d}", rng.randint(low, high), rng.uniform(min_s, max_s)))
    return out


def fleet_file(nodes: int, folder: Path, *, report_interval_s: float = 5) -> Path:
    """``nodes`` × 8 devices: the classes two nodes at a time, the nodes ten
    at a time in network groups ``ng-0`` and ``ng-1`` in turn."""
    doc = {
        "report_interval_s": report_interval_s,
        "noise_pct": 0.5,
        "seed": 5,
        "nodes": [
            {
                "name": f"gang-{n:03d}",
                "network_group": f"ng-{n // 10 % 2}",
                "devices": {"model": CLASSES[n // 2 % len(CLASSES)][0], "count": 8},
                "topology": CLASSES[n // 2 % len(CLASSES)][1],
            }
            for n in range(nodes)
        ],
    }
    path = folder / "gangs-fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def rank_pod(job: Job, rank: int, *, gang: bool) -> dict[str, Any]:
    """Rank ``rank`` of ``job``; a gang member when ``gang``."""
    labels = {"bench": "gangs", "bench-job": job.name}
    annotations = {}
    if gang:
        labels[vocabulary.JOB] = job.name
        annotations[vocabulary.JOB_SIZE] = str(job.ranks)
    requests = {"ai.compute/devices": "1"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job.name}-{rank}", "labels": labels, "annotations": annotations},
        "spec": {
            "schedulerName": "hcs-scheduler",
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "main",
                    "image": "registry.example/train:1",
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
        },
    }


@dataclass
class Progress:
    """What one run's jobs did, advanced by ``tick`` from the pods last seen
    (name -> pod JSON) and when each was first seen Running. Pure: the
    caller brings the clock."""

    jobs: list[Job]
    devices: int
    partial_s: float
    started_at: float
    created_at: dict[str, float] = field(default_factory=dict)  # pod -> its create
    running_at: dict[str, float] = field(default_factory=dict)  # job -> all ranks Running
    ended_at: dict[str, float] = field(default_factory=dict)  # job -> its pods deleted
    nodes: dict[str, set[str]] = field(default_factory=lambda: collections.defaultdict(set))
    partial: dict[str, float] = field(default_factory=lambda: collections.defaultdict(float))
    first_bound_at: dict[str, float] = field(default_factory=dict)  # job -> a rank bound
    all_bound_at: dict[str, float] = field(default_factory=dict)  # job -> every rank bound
    idle_device_s: float = 0.0
    last_tick: float | None = None

    def tick(
        self, now: float, *, pods: dict[str, dict[str, Any]], running: dict[str, float]
    ) -> list[Job]:
        """Advance to ``now``; the jobs whose duration is up (to be ended)."""
        dt = 0.0 if self.last_tick is None else now - self.last_tick
        self.last_tick = now
        held, due, bound_of = 0, [], {}
        for job in self.jobs:
            if job.name in self.ended_at:
                continue
            bound = [n for p in job.pods() if (n := _node(pods.get(p)))]
            self.nodes[job.name].update(bound)
            bound_of[job.name] = len(bound)
            if bound:
                self.first_bound_at.setdefault(job.name, now)
            if len(bound) == job.ranks:
                self.all_bound_at.setdefault(job.name, now)
            held += len(bound)
            if job.name not in self.running_at and all(p in running for p in job.pods()):
                self.running_at[job.name] = max(running[p] for p in job.pods())
            start = self.running_at.get(job.name)
            if start is not None and now >= start + job.duration_s:
                due.append(job)
        waiting = [j for j in self.jobs if j.name not in self.running_at]
        if waiting:
            self.idle_device_s += max(self.devices - held, 0) * dt
        for job in waiting:
            others = len(waiting) > 1
            if others and 0 < bound_of.get(job.name, 0) < job.ranks:
                self.partial[job.name] += dt
        return due

    def end(self, job: Job, now: float) -> None:
        self.ended_at[job.name] = now

    def split(self, labels: dict[str, dict[str, str]]) -> list[str]:
        """Jobs whose ranks were bound on more than one class or network group."""
        out = []
        for job in self.jobs:
            seen = {
                (labels.get(n, {}).get(MODEL), labels.get(n, {}).get(GROUP))
                for n in self.nodes[job.name]
            }
            if len({m for m, _ in seen}) > 1 or len({g for _, g in seen}) > 1:
                out.append(job.name)
        return out

    def classes(self, labels: dict[str, dict[str, str]]) -> collections.Counter[str]:
        """Jobs per class their ranks were bound on ("+"-joined when split)."""
        return collections.Counter(
            "+".join(sorted({labels.get(n, {}).get(MODEL, "?") for n in self.nodes[j.name]}))
            for j in self.jobs
            if self.nodes[j.name]
        )

    def figures(self, labels: dict[str, dict[str, str]]) -> dict[str, Any]:
        ends = list(self.ended_at.values())
        waits = sorted(
            self.running_at[j.name] - max(self.created_at[p] for p in j.pods())
            for j in self.jobs
            if j.name in self.running_at and all(p in self.created_at for p in j.pods())
        )
        spreads = sorted(
            self.all_bound_at[j] - self.first_bound_at[j]
            for j in self.all_bound_at
            if j in self.first_bound_at
        )
        return {
            "jobs": len(self.jobs),
            "ended": len(self.ended_at),
            "makespan_s": (max(ends) - self.started_at) if ends else float("nan"),
            "idle_device_s": self.idle_device_s,
            "split": self.split(labels),
            "classes": self.classes(labels),
            "partial": sorted(j for j, s in self.partial.items() if s > self.partial_s),
            "partial_s": {j: s for j, s in self.partial.items() if s > self.partial_s},
            "bind_p50_s": _quantile(spreads, 0.5),
            "bind_p99_s": _quantile(spreads, 0.99),
            "start_p50_s": _quantile(waits, 0.5),
            "start_p99_s": _quantile(waits, 0.99),
        }


def _quantile(values: list[float], q: float) -> float:
    """The ``q`` quantile of sorted ``values`` (the median for 0.5), NaN if none."""
    if not values:
        return float("nan")
    return statistics.median(values) if q == 0.5 else values[int(q * (len(values) - 1))]


def _node(pod: dict[str, Any] | None) -> str | None:
    if not pod or pod.get("metadata", {}).get("deletionTimestamp"):
        return None
    node: str | None = (pod.get("spec") or {}).get("nodeName")
    return node


class Submitter(threading.Thread):
    """Creates every rank, again every ``retry_s`` while admission refuses
    it (as a Job controller retries), ``workers`` at a time."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        bodies: list[dict[str, Any]],
        *,
        workers: int,
        retry_s: float,
    ) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.retry_s = cluster, namespace, retry_s
        self.left = {b["metadata"]["name"]: b for b in bodies}
        self.created_at: dict[str, float] = {}
        self.refusals: collections.Counter[str] = collections.Counter()
        self.refused = 0
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers=workers)
        self.stopping = threading.Event()

    def run(self) -> None:
        while self.left and not self.stopping.is_set():
            list(self.pool.map(self._create, list(self.left)))
            if self.left:
                self.stopping.wait(self.retry_s)

    def _create(self, name: str) -> None:
        if self.stopping.is_set():
            return
        try:
            self.cluster.api.create(self.left[name], namespace=self.namespace)
        except ApiError as exc:
            if exc.status != 409:
                self.refused += 1
                self.refusals[_reason(exc)] += 1
                return
        self.created_at[name] = time.monotonic()
        del self.left[name]

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=60)
        self.pool.shutdown(wait=True)


def _reason(exc: ApiError) -> str:
    message = exc.body.get("message", "") if isinstance(exc.body, dict) else str(exc)
    head = message.split(": ", 1)[-1] if "denied the request" in message else message
    return f"HTTP {exc.status}: {head[:140]}"


def run_jobs(
    cluster: Cluster, *, label: str, jobs: list[Job], devices: int, args: argparse.Namespace
) -> dict[str, Any]:
    """Submit ``jobs`` at once (gangs when ``label`` is "gangs") and follow
    them until every one has ended or none starts or ends for ``stuck_s``."""
    namespace = cluster.namespace(f"gangs-{label}")
    watcher = Watcher(cluster, namespace)
    watcher.start()
    bodies = [rank_pod(j, r, gang=label == "gangs") for j in jobs for r in range(j.ranks)]
    start = time.monotonic()
    progress = Progress(jobs=jobs, devices=devices, partial_s=args.partial_s, started_at=start)
    submitter = Submitter(cluster, namespace, bodies, workers=args.workers, retry_s=args.retry_s)
    submitter.start()
    enders = concurrent.futures.ThreadPoolExecutor(max_workers=4)
    moved, counts = start, (0, 0)
    try:
        while len(progress.ended_at) < len(jobs):
            now = time.monotonic()
            progress.created_at = dict(submitter.created_at)
            due = progress.tick(now, pods=dict(watcher.last), running=dict(watcher.running_at))
            for job in due:
                progress.end(job, now)
                enders.submit(_delete_pods, cluster, namespace, job)
            if (len(progress.running_at), len(progress.ended_at)) != counts:
                counts, moved = (len(progress.running_at), len(progress.ended_at)), now
            if now - moved > args.stuck_s:
                break
            time.sleep(args.poll_s)
    finally:
        submitter.stop()
        watcher.stopping = True
        enders.shutdown(wait=True)
    labels = {
        n["metadata"]["name"]: n["metadata"].get("labels", {})
        for n in cluster.api.items("/api/v1/nodes")
    }
    figures = progress.figures(labels)
    figures.update(
        label=label,
        namespace=namespace,
        refused=submitter.refused,
        refusals=submitter.refusals.most_common(3),
        stuck=len(progress.ended_at) < len(jobs),
        never=[j.name for j in jobs if j.name not in progress.running_at],
    )
    return figures


def _delete_pods(cluster: Cluster, namespace: str, job: Job) -> None:
    for name in job.pods():
        try:
            cluster.api.delete(
                f"/api/v1/namespaces/{namespace}/pods/{name}", {"gracePeriodSeconds": 0}
            )
        except ApiError as exc:
            if exc.status != 404:
                raise


def clear(cluster: Cluster, stack: Stack, namespace: str) -> None:
    """Delete a run's namespace; wait until its pods are gone and HCS holds none."""
    cluster.api.delete(f"/api/v1/namespaces/{namespace}")
    wait_for(
        lambda: not cluster.api.items(f"/api/v1/namespaces/{namespace}/pods?limit=1"),
        what=f"pods of {namespace} deleted",
        timeout_s=300,
    )
    wait_for(
        lambda: stack.pods_held(namespace) == 0,
        what=f"no reservation left for {namespace}",
        timeout_s=120,
    )


def describe_mix(jobs: list[Job], *, nodes: int) -> str:
    sizes = {f"{low}-{high}": sum(low <= j.ranks <= high for j in jobs) for _s, low, high in SIZES}
    ranks = sum(j.ranks for j in jobs)
    seconds = sum(j.ranks * j.duration_s for j in jobs)
    devices = nodes * DEVICES_PER_NODE
    return (
        f"{len(jobs)} jobs ({', '.join(f'{n} of {k} ranks' for k, n in sizes.items())}), "
        f"{ranks} ranks, {seconds:,.0f} device-seconds of work; {nodes} nodes × "
        f"{DEVICES_PER_NODE} devices = {devices}, {len(CLASSES)} classes, 2 network groups "
        f"(at least {seconds / devices:.0f} s of work per device)"
    )


HEADER = (
    f"{'run':<12} {'jobs':>5} {'ended':>6} {'makespan s':>11} {'idle dev-s':>11} "
    f"{'split':>6} {'partial':>8} {'start p50 s':>12} {'start p99 s':>12} {'refused':>8}"
)


def row(r: dict[str, Any]) -> str:
    return (
        f"{r['label']:<12} {r['jobs']:>5} {r['ended']:>6} {r['makespan_s']:>11.1f} "
        f"{r['idle_device_s']:>11.0f} {len(r['split']):>6} {len(r['partial']):>8} "
        f"{r['start_p50_s']:>12.1f} {r['start_p99_s']:>12.1f} {r['refused']:>8}"
    )


def report(results: list[dict[str, Any]], *, args: argparse.Namespace) -> None:
    print()
    print(HEADER)
    for r in results:
        print(row(r))
    print(
        "\nmakespan: first create to the last job's end (of the jobs that ended); idle dev-s: "
        "devices no bound pod holds, summed while some job waits; split: jobs bound across "
        f"classes or network groups (target 0); partial: jobs some but not all of whose ranks "
        f"were bound for over {args.partial_s:g} s while another job waited (target 0); start: "
        "last rank created to every rank Running; refused: creates refused at admission "
        f"(retried every {args.retry_s:g} s)"
    )
    for r in results:
        if r["stuck"]:
            print(
                f"  {r['label']}: STUCK, no job started or ended for {args.stuck_s:g} s; "
                f"{len(r['never'])} jobs never had every rank Running "
                f"(e.g. {', '.join(r['never'][:5])})"
            )
        for reason, n in r["refusals"]:
            print(f"  {r['label']}: refused x{n}: {reason}")
        used = ", ".join(f"{k} {n}" for k, n in r["classes"].most_common())
        print(f"  {r['label']}: jobs per class: {used}")
        print(
            f"  {r['label']}: first rank bound to every rank bound, p50 {r['bind_p50_s']:.1f} s, "
            f"p99 {r['bind_p99_s']:.1f} s (polled every {args.poll_s:g} s)"
        )
        if r["partial"]:
            held = sorted(r["partial_s"].items(), key=lambda kv: -kv[1])
            print(
                f"  {r['label']}: partly bound while others waited: "
                + ", ".join(f"{j} {s:.1f} s" for j, s in held[:8])
            )
        if r["split"]:
            print(f"  {r['label']}: split: {', '.join(r['split'][:8])}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gangs", description=__doc__)
    parser.add_argument("--jobs", type=int, default=100)
    parser.add_argument("--nodes", type=int, default=50, help="hollow nodes (at least 10)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--min-s", type=float, default=10.0, help="shortest job, seconds")
    parser.add_argument("--max-s", type=float, default=30.0, help="longest job, seconds")
    parser.add_argument("--workers", type=int, default=8, help="concurrent create clients")
    parser.add_argument(
        "--retry-s", type=float, default=2.0, help="create a refused pod again after"
    )
    parser.add_argument(
        "--stuck-s", type=float, default=60.0, help="stop when nothing moves this long"
    )
    parser.add_argument(
        "--partial-s", type=float, default=5.0, help="a partial hold longer than this counts"
    )
    parser.add_argument("--poll-s", type=float, default=0.5)
    parser.add_argument("--runs", default=",".join(RUNS), help="which runs, in order")
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args(argv)
    runs = [r for r in args.runs.split(",") if r]
    if args.nodes < 10 or not runs or set(runs) - set(RUNS):
        parser.error(f"--nodes must be at least 10 and --runs a list of {', '.join(RUNS)}")
    configure(TelemetrySettings(log_format="console", log_level="warning"), service="bench-gangs")
    bins = find_binaries()
    if isinstance(bins, str):
        print(f"bench.gangs: {bins}", file=sys.stderr)
        return 2
    jobs = job_mix(args.jobs, seed=args.seed, min_s=args.min_s, max_s=args.max_s)
    print(describe_mix(jobs, nodes=args.nodes), flush=True)
    root = Path(tempfile.mkdtemp(prefix="hcs-gangs-"))
    cluster = Cluster(bins, root=root)
    stack: Stack | None = None
    try:
        cluster.start()
        fleet = fleet_file(args.nodes, root)
        names = [n["name"] for n in yaml.safe_load(fleet.read_text())["nodes"]]
        t0 = time.monotonic()
        cluster.add_nodes(names)
        print(f"{len(names)} hollow nodes Ready in {time.monotonic() - t0:.1f} s", flush=True)
        stack = Stack(cluster, fleet=fleet, root=root)
        stack.start()
        wait_ready(cluster, stack, names)
        results: list[dict[str, Any]] = []
        for label in runs:
            if results:
                clear(cluster, stack, results[-1]["namespace"])
            print(f"{label}: {len(jobs)} jobs submitted", flush=True)
            results.append(
                run_jobs(
                    cluster,
                    label=label,
                    jobs=jobs,
                    devices=len(names) * DEVICES_PER_NODE,
                    args=args,
                )
            )
            print(row(results[-1]), flush=True)
        report(results, args=args)
    finally:
        if stack is not None:
            stack.stop()
        cluster.stop()
        if args.keep:
            print(f"logs: {root / 'logs'}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    return 0


def wait_ready(cluster: Cluster, stack: Stack, names: list[str]) -> None:
    """Every node labelled with its group and advertising devices, in HCS's view."""

    def labelled() -> bool:
        for node in cluster.api.items("/api/v1/nodes"):
            if node["metadata"]["name"] in names:
                alloc = node["status"].get("allocatable", {})
                if "ai.compute/devices" not in alloc or GROUP not in node["metadata"].get(
                    "labels", {}
                ):
                    return False
        return True

    wait_for(labelled, what="every node labelled, ai.compute/* in allocatable", timeout_s=120)
    wait_for(
        lambda: not stack.views_missing(names),
        what="every node's devices in the scheduler's view",
        timeout_s=120,
        explain=lambda: f"missing: {stack.views_missing(names)}",
    )


if __name__ == "__main__":
    sys.exit(main())
