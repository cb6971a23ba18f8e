"""Burst benchmark on a real cluster: ``python -m bench.burst [--pods N] [--nodes N] [--mix]``.

A real control plane with ``--nodes`` hollow kubelets (``HCS_KUBE_BIN``, see
tests/e2e), the HCS parts as ``hcs up`` starts them and the project's
kube-scheduler configuration. Two bursts of ``--pods`` pods, each created at
once (``--workers`` concurrent clients), through the same kube-scheduler:

* plain: each pod requests ``example.com/dev: 1``, a device-plugin-style
  resource every node advertises; kube-scheduler never calls the extender
  (``managedResources``), the webhook passes the pod through — the baseline;
* hcs: each pod requests ``ai.compute/vram`` (vendor-neutral); the webhook
  plans it, the extender filters, ranks and binds it;
* with ``--mix`` the HCS burst is ``hcs-mix``: VRAM slices of three sizes,
  FP16 TFLOPS, ACU, whole devices and pods pinned to a vendor or a model, each
  kind a share of the pods (``bench.mixes``). Before it, the mix's demand is
  printed against the fleet (packed offline with the planner's sizing).
  These bare pods carry ``hcs.io/replan: recreate``: one stranded in a class
  that filled (or fragmented) is created again and planned afresh, so the
  burst settles only after ``replan_after_s`` (30 s) plus ``--settle-s``.

Printed per burst: pods/s (create of the first → Running of the last),
create→Running p50/p99, pods still Pending when the burst settles with their
reasons, devices over-committed (from the pods' ``hcs.io/*`` annotations
against the agents' fingerprints), for the HCS burst the Pending pods for
which a class their policy allows still had room at the end (read from the
fingerprints and the ledger, as the scheduler's view holds them), and the
CPU seconds of each HCS process and of each Kubernetes process (the hollow
kubelets summed) and nats-server, up to the last pod's start. Then each
process's CPU per pod less its load at rest (measured ``--rest-s`` before
the bursts, with no pod running), and what the HCS path adds per pod: with
the machine's CPU saturated, pods/s follows that cost (also printed: the
ratio were every HCS process to cost an HCS pod what it costs a plain one,
the most a faster HCS could reach on the machine); and each process's
load once a burst's pods all run, against its load at rest. Target: hcs pods/s ≥
0.8 × plain, 0 over-committed, 0 Pending while an allowed class has room.

``--same-placement`` then runs plain pods held (by hostname nodeSelector,
still through kube-scheduler) to the nodes the last HCS burst's pods
started on, as many per node, and prints HCS's ratio against them: what the
HCS path costs apart from where its placement policy puts pods (cheapest
class that fits, packed), since a kubelet starts pods at its API client's
rate and the busiest node sets a burst's end.

``--placement spread`` runs the scheduler with ``HCS_SCHEDULER__PLACEMENT=spread``
(the class with the most VRAM free, the emptiest nodes) instead of ``pack``.

``--rounds N`` runs the two bursts N times, back to back, plain first in odd
rounds and HCS first in even ones (plain, HCS, HCS, plain, …), and prints
each pair's ratio and their median: this machine's speed drifts by more than
a small change moves one ratio, and a fixed order would hand the drift to
whichever burst always runs second.

Between bursts the last one's namespace is deleted and the next waits until
every process together is back near its load at rest (a kubelet tears a pod
down, and HCS releases its devices, after the pod is gone from the
apiserver). A hollow kubelet that dies of kubemark's fake-OS map race (its
fake container runtime crashes on concurrent container starts, most often
with 40 pods on a node) is started again; the burst it hit is named, and
the rounds it hit are marked and left out of a second median.
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import dataclasses
import http.client
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prometheus_client.parser import text_string_to_metric_families

from bench import mixes
from bench.mixes import Kind
from hcs_bus import profiles, vocabulary
from hcs_bus.settings import SchedulerSettings, TelemetrySettings
from hcs_bus.telemetry import configure
from scheduler.ledger.release_loop import node_block, on_node_event
from scheduler.plan import rules as planning
from scheduler.view.follow_loop import ClusterView
from tests.e2e.api import ApiError, wait_for
from tests.e2e.cluster import Cluster, find_binaries
from tests.e2e.stack import Stack

CLASSES = (
    ("nvidia/A100-80G", "nvlink"),
    ("nvidia/H100-SXM", "nvlink"),
    ("huawei/Ascend910B2", "hccs"),
    ("hygon/K100", "xgmi"),
    ("cambricon/MLU370-X8", "mlulink"),
)
PLAIN = "example.com/dev"
PLAIN_KIND = Kind("plain", 100, {PLAIN: "1"})  # what each pod of a plain burst asks
REPLAN_AFTER_S = SchedulerSettings().replan_after_s
TICKS = os.sysconf("SC_CLK_TCK")
# what runs on the nodes of a real cluster, each on its own node's CPU (the
# simulated fleet's agents stand for a DaemonSet), and the bench's own client
ON_NODES = ("kubelets", "agents", "bench")
BUS = "nats-server"  # counted with Kubernetes's processes, but it carries HCS's messages


def fleet_file(nodes: int, folder: Path, *, report_interval_s: float = 5) -> Path:
    """``nodes`` nodes × 8 devices, the five classes in turn, two network groups."""
    doc = {
        "report_interval_s": report_interval_s,
        "noise_pct": 0.5,
        "seed": 3,
        "nodes": [
            {
                "name": f"burst-{n:03d}",
                "network_group": f"ng-{n % 2}",
                "devices": {"model": CLASSES[n % len(CLASSES)][0], "count": 8},
                "topology": CLASSES[n % len(CLASSES)][1],
            }
            for n in range(nodes)
        ],
    }
    path = folder / "burst-fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def is_running(pod: dict[str, Any]) -> bool:
    return bool(pod.get("status", {}).get("phase") == "Running")


class Watcher(threading.Thread):
    """Watches a namespace's pods; records when each was first seen Running
    (or, with ``done``, first seen as ``done`` says)."""

    def __init__(
        self,
        cluster: Cluster,
        namespace: str,
        *,
        done: Callable[[dict[str, Any]], bool] = is_running,
    ) -> None:
        super().__init__(daemon=True)
        self.cluster, self.namespace, self.done = cluster, namespace, done
        self.running_at: dict[str, float] = {}
        self.last: dict[str, dict[str, Any]] = {}
        self.stopping = False

    def run(self) -> None:
        while not self.stopping:
            try:
                self._watch()
            except (OSError, http.client.HTTPException, ValueError):
                time.sleep(0.2)

    def _watch(self) -> None:
        api = self.cluster.api
        conn = http.client.HTTPSConnection(api.host, api.port, context=api._ssl, timeout=30)
        conn.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?watch=1&timeoutSeconds=25")
        resp = conn.getresponse()
        try:
            while not self.stopping:
                line = resp.readline()
                if not line:
                    return
                event = json.loads(line)
                pod = event.get("object", {})
                name = pod.get("metadata", {}).get("name")
                if not name:
                    continue
                self.last[name] = pod
                if self.done(pod):
                    self.running_at.setdefault(name, time.monotonic())
        finally:
            conn.close()


def burst_pod(name: str, kind: Kind, *, node: str | None = None) -> dict[str, Any]:
    """The pod; with ``node``, held to that node by its hostname label (still
    scheduled by kube-scheduler, which finds one node feasible)."""
    requests = dict(kind.requests)
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"bench": "burst"},
            "annotations": dict(kind.annotations),
        },
        "spec": {
            "schedulerName": "hcs-scheduler",
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
    if node:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": node}
    return pod


def placement(pods: list[dict[str, Any]], *, label: str, count: int) -> list[str]:
    """The node of each of a burst's pods that started somewhere, in pod order."""
    nodes = {
        p["metadata"]["name"]: (p.get("spec") or {}).get("nodeName")
        for p in pods
        if p.get("status", {}).get("phase") == "Running"
    }
    return [n for i in range(count) if (n := nodes.get(f"{label}-{i:04d}"))]


def cpu_s(pid: int) -> float:
    """User+system CPU seconds of a process and its reaped children."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return sum(int(f) for f in fields[11:15]) / TICKS


def processes(cluster: Cluster, stack: Stack) -> dict[str, tuple[str, list[int]]]:
    """Name → (group "hcs" or "kube", pids): each HCS part, each control-plane
    process, the hollow kubelets as one, nats-server."""
    found: dict[str, tuple[str, list[int]]] = {
        name: ("hcs", [p.popen.pid]) for name, p in stack.parts.items()
    }
    for p in cluster.processes:
        name = "kubelets" if p.name.startswith("kubelet-") else p.name
        found.setdefault(name, ("kube", []))[1].append(p.popen.pid)
    if stack.nats.process is not None:
        found[BUS] = ("kube", [stack.nats.process.pid])
    return found


def rest_after_settling(
    measure: Callable[[float], dict[str, float]],
    *,
    seconds: float,
    timeout_s: float = 180.0,
    fall: float = 0.8,
) -> tuple[dict[str, float], float, bool]:
    """The load at rest once a fresh cluster has settled: windows of
    ``seconds`` (``measure``) until one's total is no more than ``fall`` below
    the one before (the start-up work of new Nodes, labels and views is done),
    then those two windows averaged per process. A window taken at once can
    hold several times the lasting load (kube-apiserver at 500 fresh Nodes:
    0.8 core for the first seconds, 0.2 after), and taking that off every
    burst hides most of a process's cost per pod. Returns the load, the
    seconds it took and whether it settled within ``timeout_s`` (if not: the
    last two windows)."""
    started = time.monotonic()
    before = measure(seconds)
    while True:
        now = measure(seconds)
        done = sum(now.values()) >= fall * sum(before.values())
        if done or time.monotonic() - started >= timeout_s:
            names = before.keys() | now.keys()
            load = {n: (before.get(n, 0.0) + now.get(n, 0.0)) / 2 for n in names}
            return load, time.monotonic() - started, done
        before = now


def settled_rest(cluster: Cluster, stack: Stack, *, seconds: float) -> dict[str, float]:
    """``rest_after_settling`` of this cluster and stack, said on one line."""
    load, took, done = rest_after_settling(
        lambda s: at_rest(cluster, stack, seconds=s), seconds=seconds
    )
    busiest = ", ".join(f"{n} {v:.2f}" for n, v in sorted(load.items(), key=lambda kv: -kv[1])[:4])
    state = "settled" if done else "still settling"
    print(f"load at rest ({state} after {took:.0f} s), cores: {busiest}", flush=True)
    return load


def at_rest(cluster: Cluster, stack: Stack, *, seconds: float) -> dict[str, float]:
    """Each process's CPU seconds per second with no burst running: the load
    that comes with time (kubelets, leases, reports), not with pods."""
    before, started = cpu_now(cluster, stack), time.monotonic()
    time.sleep(seconds)  # the measuring window itself
    after, wall = cpu_now(cluster, stack), time.monotonic() - started
    return {n: (s - before.get(n, (g, 0.0))[1]) / wall for n, (g, s) in after.items()}


def cpu_now(cluster: Cluster, stack: Stack) -> dict[str, tuple[str, float]]:
    """Each process's CPU seconds so far, and this benchmark's own (its
    client threads and watcher share the machine)."""
    found = {
        name: (group, sum(cpu_s(pid) for pid in pids))
        for name, (group, pids) in processes(cluster, stack).items()
    }
    mine = os.times()
    found["bench"] = ("kube", mine.user + mine.system)
    return found


def burst(
    cluster: Cluster,
    stack: Stack,
    *,
    label: str,
    kinds: list[Kind],
    workers: int,
    settle_s: float,
    nodes: list[str] | None = None,
) -> dict[str, Any]:
    pods = len(kinds)
    namespace = cluster.namespace(f"burst-{label}")
    revived_before = len(cluster.revived)
    watcher = Watcher(cluster, namespace)
    watcher.start()
    cpu_before, cpu_start = cpu_now(cluster, stack), time.monotonic()
    scraped_before = scrape(stack, cluster)
    requests_before = api_requests(scraped_before)
    created_at: dict[str, float] = {}
    errors: list[str] = []

    def create(i: int) -> None:
        name = f"{label}-{i:04d}"
        try:
            pod = burst_pod(name, kinds[i], node=nodes[i] if nodes else None)
            cluster.api.create(pod, namespace=namespace)
            created_at[name] = time.monotonic()
        except ApiError as exc:
            errors.append(f"{name}: {exc}")

    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(create, range(pods)))
    created_s = time.monotonic() - start
    # CPU is counted up to the last pod seen starting, not through the quiet
    # wait after it: both bursts' figures then cover their pods' work only
    last_progress, seen = time.monotonic(), 0
    cpu_after, cpu_end = cpu_now(cluster, stack), time.monotonic()
    while len(watcher.running_at) < len(created_at):
        if len(watcher.running_at) != seen:
            seen, last_progress = len(watcher.running_at), time.monotonic()
            cpu_after, cpu_end = cpu_now(cluster, stack), time.monotonic()
        if time.monotonic() - last_progress > settle_s:
            break
        time.sleep(0.25)
    else:
        cpu_after, cpu_end = cpu_now(cluster, stack), time.monotonic()
    watcher.stopping = True
    cpu = {
        n: (group, s - cpu_before.get(n, (group, 0.0))[1]) for n, (group, s) in cpu_after.items()
    }
    scraped_after = scrape(stack, cluster)
    counted_before, latency_before = counters(scraped_before), histograms(scraped_before)
    requests = api_requests(scraped_after) - requests_before
    items = cluster.api.items(f"/api/v1/namespaces/{namespace}/pods")
    latencies = sorted(
        watcher.running_at[n] - created_at[n] for n in watcher.running_at if n in created_at
    )
    done = max(watcher.running_at.values(), default=start)
    spread = node_spread(watcher.last, watcher.running_at, start=start)
    pending = [p for p in items if p.get("status", {}).get("phase") != "Running"]
    return {
        "label": label,
        "pods": pods,
        "created_s": created_s,
        "running": len(watcher.running_at),
        "pods_per_s": len(watcher.running_at) / max(done - start, 1e-9),
        "p50_s": statistics.median(latencies) if latencies else float("nan"),
        "p99_s": latencies[int(0.99 * (len(latencies) - 1))] if latencies else float("nan"),
        "pending": len(pending),
        "pending_reasons": _reasons(pending),
        "spread": spread,
        "volumes": volumes(items),
        "create_errors": errors[:5],
        "create_error_count": len(errors),
        "double_booked": [] if label.startswith("plain") else double_booked(stack, items),
        "cpu_s": cpu,
        "cpu_wall_s": cpu_end - cpu_start,
        "requests": requests,
        "counted": {n: v - counted_before.get(n, 0.0) for n, v in counters(scraped_after).items()},
        "latency": {
            name: quantiles(latency_before.get(name, {}), after)
            for name, after in histograms(scraped_after).items()
        },
        "namespace": namespace,
        # kubemark's hollow kubelets crash on concurrent container starts; a
        # node's pods wait for its restart, so this burst's end may be late
        "revived": cluster.revived[revived_before:],
        "placement": placement(items, label=label, count=pods),
        "room": None
        if label.startswith("plain")
        else room_left(stack, pending, kinds=kinds, label=label),
    }


API = "kube-apiserver"

# where an HCS burst's time goes: (part, histogram) of seconds, from /metrics
LATENCIES = (
    ("injector", "hcs_injector_admission_seconds", "admission"),
    ("scheduler", "hcs_scheduler_plan_seconds", "plan"),
    ("scheduler", "hcs_extender_seconds{verb=filter}", "filter"),
    ("scheduler", "hcs_extender_seconds{verb=prioritize}", "prioritize"),
    ("scheduler", "hcs_scheduler_bind_seconds", "bind"),
    ("scheduler", "hcs_scheduler_bind_step_seconds{step=pledge}", "bind:pledge"),
    ("scheduler", "hcs_scheduler_bind_step_seconds{step=reserve}", "bind:reserve"),
    ("scheduler", "hcs_scheduler_bind_step_seconds{step=binding}", "bind:Binding"),
    ("scheduler", "hcs_scheduler_bind_step_seconds{step=mark}", "bind:mark"),
    # the API server's side: a pod's create (admission included), the
    # webhook call as the API server times it, and a Binding
    (API, "apiserver_request_duration_seconds{verb=POST,resource=pods,subresource=}", "api:create"),
    (API, "apiserver_admission_webhook_admission_duration_seconds{type=admit}", "api:webhook"),
    (
        API,
        "apiserver_request_duration_seconds{verb=POST,resource=pods,subresource=binding}",
        "api:Binding",
    ),
)


# what the scheduler wrote during a burst: (part, counter, what), per pod
COUNTERS = (
    ("scheduler", "hcs_scheduler_node_writes", "node document writes"),
    ("scheduler", "hcs_scheduler_cas_conflicts", "compare-and-set conflicts"),
)


Samples = dict[str, list[Any]]  # part -> its /metrics samples


def scrape(stack: Stack, cluster: Cluster) -> Samples:
    """The samples of every part ``LATENCIES`` and ``COUNTERS`` read, one
    /metrics request per part (none for a part that serves none), and the
    API server's."""
    out: Samples = {}
    for part in {p for p, _n, _w in (*LATENCIES, *COUNTERS)} - {API}:
        port = stack.metrics_ports.get(part)
        if not port:
            continue
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            continue
        out[part] = _samples(text)
    try:
        out[API] = _samples(str(cluster.api.request("GET", "/metrics")))
    except (ApiError, OSError):
        pass
    return out


def _samples(text: str) -> list[Any]:
    return [s for f in text_string_to_metric_families(text) for s in f.samples]


def counters(scraped: Samples) -> dict[str, float]:
    """Each of ``COUNTERS`` so far, summed over its labels."""
    return {
        name: sum(s.value for s in scraped.get(part, []) if s.name in (name, f"{name}_total"))
        for part, name, _what in COUNTERS
    }


def histograms(scraped: Samples) -> dict[str, dict[float, float]]:
    """Each of ``LATENCIES``: cumulative count per bucket bound, summed over
    its labels (absent when the part serves no /metrics)."""
    out: dict[str, dict[float, float]] = {}
    for part, name, _what in LATENCIES:
        if part not in scraped:
            continue
        metric, _, selector = name.partition("{")
        wanted = dict(kv.split("=") for kv in selector.rstrip("}").split(",") if kv)
        buckets: dict[float, float] = collections.defaultdict(float)
        for sample in scraped[part]:
            if sample.name == f"{metric}_bucket" and all(
                sample.labels.get(k) == v for k, v in wanted.items()
            ):
                buckets[float(sample.labels["le"])] += sample.value
        out[name] = dict(buckets)
    return out


def quantiles(
    before: dict[float, float], after: dict[float, float], qs: tuple[float, ...] = (0.5, 0.99)
) -> tuple[int, list[float]]:
    """(count, the bucket bound holding each quantile) of what was observed
    between two readings of one histogram."""
    bounds = sorted(after)
    delta = [after[b] - before.get(b, 0.0) for b in bounds]
    total = delta[-1] if delta else 0.0
    found = [
        next((b for b, c in zip(bounds, delta, strict=True) if c >= q * total), math.inf)
        for q in qs
    ]
    return int(total), found


def api_requests(scraped: Samples) -> collections.Counter[str]:
    """The API server's requests so far, by verb, resource and subresource
    (``apiserver_request_total``; watches counted when they open)."""
    out: collections.Counter[str] = collections.Counter()
    for sample in scraped.get(API, []):
        if sample.name != "apiserver_request_total":
            continue
        labels = sample.labels
        what = labels.get("resource", "") + (
            f"/{labels['subresource']}" if labels.get("subresource") else ""
        )
        out[f"{labels.get('verb', '')} {what}"] += int(sample.value)
    return out


def clear(cluster: Cluster, stack: Stack, namespace: str, rest: dict[str, float]) -> None:
    """Delete a burst's namespace, wait until its pods are gone, then until the
    machine is back at its load at rest (``quiet``): the next burst must not
    pay for this one's pods on the kubelets or in HCS."""
    cluster.api.delete(f"/api/v1/namespaces/{namespace}")
    wait_for(
        lambda: not cluster.api.items(f"/api/v1/namespaces/{namespace}/pods?limit=1"),
        what=f"pods of {namespace} deleted",
        timeout_s=300,
    )
    waited, calm = quiet(cluster, stack, rest)
    print(
        f"  {namespace} cleared; {'at rest' if calm else 'still busy'} after {waited:.0f} s",
        flush=True,
    )


def quiet(
    cluster: Cluster,
    stack: Stack,
    rest: dict[str, float],
    *,
    window_s: float = 2.0,
    timeout_s: float = 120.0,
) -> tuple[float, bool]:
    """Wait until every process together is back near its load at rest. A pod
    is gone from the apiserver before its kubelet has torn it down and before
    HCS has released its devices (KV writes, metering, quota status); whichever
    burst came next would pay for that. Returns the seconds waited and whether
    it got there before ``timeout_s``."""
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        load = at_rest(cluster, stack, seconds=window_s)  # the measuring window itself
        if settled(load, rest):
            return time.monotonic() - started, True
    return time.monotonic() - started, False


def settled(load: dict[str, float], rest: dict[str, float], *, margin: float = 0.1) -> bool:
    """Whether the machine's CPU seconds per second, all processes together,
    are at most a quarter above their sum at rest, plus ``margin`` of a core."""
    at_rest_total = sum(rest.values())
    return sum(load.values()) <= at_rest_total * 1.25 + margin


def node_spread(
    pods: dict[str, dict[str, Any]], running_at: dict[str, float], *, start: float
) -> dict[str, Any]:
    """How a burst's pods spread over the nodes, and when each node's last one
    started: a kubelet starts its pods at the rate its API client allows
    (kube-api-qps, 5 by default up to v1.26), so a burst ends when its
    most-loaded node has started all of its pods."""
    per_node: dict[str, list[float]] = collections.defaultdict(list)
    for name, pod in pods.items():
        node = (pod.get("spec") or {}).get("nodeName")
        if node and name in running_at:
            per_node[node].append(running_at[name] - start)
    if not per_node:
        return {
            "nodes": 0,
            "max": 0,
            "median": 0.0,
            "busiest": "",
            "busiest_done_s": 0.0,
            "last_done_s": 0.0,
        }
    busiest = max(per_node, key=lambda n: (len(per_node[n]), max(per_node[n])))
    return {
        "nodes": len(per_node),
        "max": len(per_node[busiest]),
        "median": statistics.median(len(v) for v in per_node.values()),
        "busiest": busiest,
        "busiest_done_s": max(per_node[busiest]),
        "last_done_s": max(max(v) for v in per_node.values()),
    }


def volumes(pods: list[dict[str, Any]]) -> dict[str, tuple[int, float]]:
    """Volumes per pod, by RuntimeClass ("" for none): (pods, mean volumes).
    A kubelet works on each volume of each pod it runs about ten times a
    second (bench.hold), so a burst whose pods carry more costs the kubelets
    more for as long as it goes on."""
    found: dict[str, list[int]] = collections.defaultdict(list)
    for pod in pods:
        spec = pod.get("spec") or {}
        found[spec.get("runtimeClassName") or ""].append(len(spec.get("volumes") or []))
    return {rc: (len(counts), statistics.fmean(counts)) for rc, counts in sorted(found.items())}


def _reasons(pending: list[dict[str, Any]]) -> list[tuple[int, str]]:
    counts: collections.Counter[str] = collections.Counter()
    for pod in pending:
        status = pod.get("status", {})
        message = status.get("reason") or ""
        for cond in status.get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                message = cond.get("message") or cond.get("reason") or ""
        if not message and (node := pod.get("spec", {}).get("nodeName")):
            message = f"bound to {node}, not started by its kubelet"
        counts[message[:160] or f"{status.get('phase', '?')}, not yet scheduled"] += 1
    return [(n, why) for why, n in counts.most_common(5)]


def double_booked(stack: Stack, pods: list[dict[str, Any]]) -> list[str]:
    """Devices whose granted slices (from the pods' annotations) exceed their VRAM."""
    used: dict[tuple[str, str], int] = collections.defaultdict(int)
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        notes = pod.get("metadata", {}).get("annotations") or {}
        devices = notes.get("hcs.io/devices")
        if not node or not devices:
            continue
        quotas = [
            q.split(":", 1)[1] for q in notes.get("hcs.io/vram-quota", "").split(",") if ":" in q
        ]
        for device, quota in zip(devices.split(","), quotas, strict=False):
            used[(node, device)] += int(quota.removesuffix("Mi"))
    capacity: dict[tuple[str, str], int] = {}
    for fp in stack.fingerprints({n for n, _ in used}).values():
        node = fp.node
        for d in fp.devices:
            capacity[(node, d.uuid or str(d.index))] = d.vram_usable_mib
            capacity.setdefault((node, str(d.index)), d.vram_usable_mib)
    return [
        f"{node}/{dev}: {mib} MiB granted of {capacity.get((node, dev), 0)}"
        for (node, dev), mib in used.items()
        if mib > capacity.get((node, dev), 0)
    ]


def fleet_summary(stack: Stack, nodes: list[dict[str, Any]]) -> planning.Summary:
    """Every class's devices, free VRAM and idle devices as the scheduler's
    view holds them (fingerprints, the ledger's reservations, and the Nodes:
    a cordoned or unreachable one has no room)."""

    async def read(bus: Any) -> planning.Summary:
        view = ClusterView(bus, settings=stack.settings.scheduler)
        await view.start()
        try:
            await view.wait_ready(timeout_s=30)
            for node in nodes:
                on_node_event(view, "ADDED", node)
            return planning.summarise(view.state.nodes.values())
        finally:
            await view.stop()

    return stack.on_bus(read)


def room_left(
    stack: Stack, pending: list[dict[str, Any]], *, kinds: list[Kind], label: str
) -> dict[str, Any]:
    """For the pods left unbound: which had room in a class their policy
    allows (and in the class their plan named), by kind; each class's room."""
    nodes = stack.cluster.api.items("/api/v1/nodes")
    summary = fleet_summary(stack, nodes)
    db = profiles.load()
    unbound = [p for p in pending if not p.get("spec", {}).get("nodeName")]
    with_room: collections.Counter[str] = collections.Counter()
    planned_room = 0
    examples: list[str] = []
    for pod in unbound:
        name = pod["metadata"]["name"]
        kind = kinds[int(name.removeprefix(f"{label}-"))].name
        rooms = mixes.with_room(pod, summary, db)
        if not rooms:
            continue
        with_room[kind] += 1
        planned = mixes.planned_class(pod)
        planned_room += planned in rooms
        if len(examples) < 5:
            examples.append(
                f"{name} ({kind}, planned {planned or '-'}): room in {', '.join(rooms)}"
            )
    classes = [
        f"{key}: {s.free_mib / 1024:,.0f}/{s.devices * s.vram_mib / 1024:,.0f} GiB free, "
        f"{s.idle_devices}/{s.devices} devices idle"
        for key, s in sorted(summary.classes.items())
    ]
    stranded = sum(
        any(c.get("type") == "HCSStranded" for c in p.get("status", {}).get("conditions") or [])
        for p in unbound
    )
    return {
        "unbound": len(unbound),
        "stranded": stranded,
        "while_room": sum(with_room.values()),
        "planned_room": planned_room,
        "by_kind": dict(with_room),
        "examples": examples,
        "classes": classes,
        "blocked": [f"{n['metadata']['name']} ({why})" for n in nodes if (why := node_block(n))],
    }


def print_mix(kinds: list[Kind], *, nodes: list[str], fleet: Path) -> None:
    """The mix's kinds, their sizes per class and the offline fit on the fleet."""
    doc = yaml.safe_load(fleet.read_text())
    models = [n["devices"]["model"] for n in doc["nodes"]]
    per_node = doc["nodes"][0]["devices"]["count"]
    fit = mixes.fit(kinds, models=models, per_node=per_node, profiles=profiles.load())
    print(f"mix of {len(kinds)} pods on {len(nodes)} nodes × {per_node} devices:")
    for name, (count, sizes) in fit.by_kind.items():
        print(f"  {count:>5} × {name:<28} {sizes}")
    print(
        f"  packed first-fit in the planner's class order: {sum(fit.placed.values())} placed, "
        f"{sum(fit.unplaced.values())} not; VRAM committed {fit.vram_mib / 1024:,.0f} of "
        f"{fit.vram_total_mib / 1024:,.0f} GiB ({fit.vram_mib / max(fit.vram_total_mib, 1):.0%}), "
        f"{fit.whole_devices} of {fit.devices} devices whole"
    )
    print("  per class: " + ", ".join(f"{k} {n}" for k, n in sorted(fit.placed.items())))
    if fit.unplaced:
        print(f"  WARNING: the fleet cannot hold the mix: {dict(fit.unplaced)}", flush=True)


def advertise_plain(cluster: Cluster, names: list[str], *, per_node: int) -> None:
    for name in names:
        ops = [
            {
                "op": "add",
                "path": f"/status/capacity/{PLAIN.replace('/', '~1')}",
                "value": str(per_node),
            }
        ]
        cluster.api.patch(f"/api/v1/nodes/{name}/status", ops, kind="json")
    wait_for(
        lambda: all(
            cluster.api.get(f"/api/v1/nodes/{n}")["status"].get("allocatable", {}).get(PLAIN)
            == str(per_node)
            for n in names
        ),
        what=f"{PLAIN}: {per_node} in every node's allocatable (kubelet status sync)",
        timeout_s=60,
    )


def wait_labelled(cluster: Cluster, names: list[str]) -> None:
    def ready() -> bool:
        for node in cluster.api.items("/api/v1/nodes"):
            if node["metadata"]["name"] in names:
                alloc = node["status"].get("allocatable", {})
                if "ai.compute/vram" not in alloc or "hcs.io/vendor" not in node["metadata"].get(
                    "labels", {}
                ):
                    return False
        return True

    wait_for(ready, what="every node labelled with ai.compute/* in allocatable", timeout_s=120)


def report(results: list[dict[str, Any]]) -> None:
    print()
    print(
        f"{'burst':<8} {'pods':>5} {'running':>8} {'pods/s':>8} {'p50 s':>7} {'p99 s':>7} "
        f"{'pending':>8} {'over':>5} {'create s':>9}"
    )
    for r in results:
        print(
            f"{r['label']:<8} {r['pods']:>5} {r['running']:>8} {r['pods_per_s']:>8.1f} "
            f"{r['p50_s']:>7.2f} {r['p99_s']:>7.2f} {r['pending']:>8} {len(r['double_booked']):>5} "
            f"{r['created_s']:>9.1f}"
        )
    print("\npods per node (a kubelet starts its pods at its API client's rate):")
    for r in results:
        sp = r["spread"]
        if sp["nodes"]:
            print(
                f"  {r['label']:<8} on {sp['nodes']} nodes, median {sp['median']:g} per node, "
                f"most {sp['max']} ({sp['busiest']}, its last started at "
                f"{sp['busiest_done_s']:.1f} s; the burst's last at {sp['last_done_s']:.1f} s)"
            )
    print("volumes per pod (each is kubelet work while its pod runs), by RuntimeClass:")
    for r in results:
        by_class = r.get("volumes") or {}
        pods = sum(n for n, _ in by_class.values())
        mean = sum(n * v for n, v in by_class.values()) / max(pods, 1)
        print(
            f"  {r['label']:<8} {mean:.1f} = "
            + ", ".join(f"{rc or 'none'} {n} x {v:.1f}" for rc, (n, v) in by_class.items())
        )
    plain, hcs = pairs(results[:2])[0]  # a --same-placement burst may follow the rounds
    print(f"\nratio {hcs['label']}/plain pods/s: {pods_ratio(plain, hcs):.2f} (target >= 0.8)")
    for r in results:
        if r.get("revived"):
            print(
                f"  {r['label']}: {', '.join(r['revived'])} died of kubemark's fake-OS map race "
                "during the burst and started again; pods bound there waited for the restart, "
                "and its CPU before it is not counted"
            )
        for count, why in r["pending_reasons"]:
            print(f"  {r['label']} pending x{count}: {why}")
        for line in r["double_booked"][:10]:
            print(f"  {r['label']} over-committed: {line}")
        if r["create_error_count"]:
            print(
                f"  {r['label']} create errors: {r['create_error_count']}, e.g. {r['create_errors'][:2]}"
            )
    for r in results:
        if r["room"] is not None:
            report_room(r["label"], r["room"])
    print("\nLatencies during each burst (bucket bounds from /metrics; api: the API server's):")
    for r in results:
        shown = []
        for _part, name, what in LATENCIES:
            count, (p50, p99) = r["latency"].get(name, (0, [math.nan, math.nan]))
            if count:
                shown.append(f"{what} n={count} p50<={p50:g}s p99<={p99:g}s")
        if shown:
            print(f"  {r['label']:<8} " + "\n           ".join(shown))
    print("\nScheduler writes per pod during each burst:")
    for r in results:
        shown = [
            f"{what} {r['counted'].get(name, 0.0) / max(r['pods'], 1):.2f}"
            for _p, name, what in COUNTERS
        ]
        print(f"  {r['label']:<8} " + ", ".join(shown))
    report_requests(results)
    print("\nCPU seconds during each burst (up to its last pod's start; per pod in ms):")
    for r in results:
        for group in ("hcs", "kube"):
            parts = sorted((n, s) for n, (g, s) in r["cpu_s"].items() if g == group)
            total = sum(s for _, s in parts)
            print(
                f"  {r['label']:<8} {group:<4} {total:>7.1f} = "
                + ", ".join(f"{n} {s:.1f}" for n, s in parts)
            )
        total = sum(s for _, s in r["cpu_s"].values())
        per_pod = 1000 * total / max(r["running"], 1)
        wall = r["running"] / max(r["pods_per_s"], 1e-9)
        print(f"  {r['label']:<8} all  {total:>7.1f} in {wall:.1f} s: {per_pod:.1f} ms per pod")


def report_pod_cost(results: list[dict[str, Any]], rest: dict[str, float]) -> None:
    """CPU per pod of each process, less its load at rest over the burst's
    window: what the pods themselves cost, and what the HCS path adds."""
    plain, hcs = pairs(results)[0]
    a, b = cost_per_pod(plain, rest), cost_per_pod(hcs, rest)
    print(
        "\nCPU ms per pod, less each process's load at rest "
        f"({sum(rest.values()):.2f} cores in all, measured before the bursts):"
    )
    print(f"  {'process':<26}{plain['label']:>9}{hcs['label']:>9}{'added':>9}")
    for name in sorted(b, key=lambda n: b[n] - a.get(n, 0.0), reverse=True):
        added = b[name] - a.get(name, 0.0)
        print(f"  {name:<26}{a.get(name, 0.0):>9.1f}{b[name]:>9.1f}{added:>+9.1f}")
    total_a, total_b = sum(a.values()), sum(b.values())
    print(f"  {'all':<26}{total_a:>9.1f}{total_b:>9.1f}{total_b - total_a:>+9.1f}")
    if total_b:
        by_cpu = cpu_ratio(plain, hcs, rest)
        print(f"  ratio of the two (what CPU alone predicts for pods/s): {by_cpu:.2f}")
        apart = cpu_ratio(plain, hcs, rest, leave_out=ON_NODES)
        print(
            f"  the same without {', '.join(ON_NODES)} (as where each kubelet and agent has "
            f"its node's CPU): {apart:.2f}"
        )
        ceiling = cpu_ratio(plain, hcs, rest, at_plain=hcs_own(hcs))
        print(
            "  the same were every HCS process to cost an HCS pod what it costs a plain one "
            f"(the most HCS's own code can reach here): {ceiling:.2f}"
        )
    held = [r for r in results if "held" in r]
    if held:
        print("  CPU cores with each burst's pods running, after it (none running: at rest):")
        names = sorted(rest, key=lambda n: -max(r["held"].get(n, 0.0) for r in held))[:6]
        for r in held:
            cells = ", ".join(f"{n} {r['held'].get(n, 0.0):.2f}" for n in names)
            print(f"    {r['label']:<8} {sum(r['held'].values()):.2f} = {cells}")
        print(
            f"    {'at rest':<8} {sum(rest.values()):.2f} = "
            + ", ".join(f"{n} {rest[n]:.2f}" for n in names)
        )


def cost_per_pod(r: dict[str, Any], rest: dict[str, float]) -> dict[str, float]:
    """Each process's CPU ms per started pod of burst ``r``, less its load at rest."""
    pods = max(r["running"], 1)
    return {
        n: 1000 * max(s - rest.get(n, 0.0) * r["cpu_wall_s"], 0.0) / pods
        for n, (_g, s) in r["cpu_s"].items()
    }


def pods_ratio(plain: dict[str, Any], hcs: dict[str, Any]) -> float:
    """HCS pods/s over plain pods/s: the benchmark's ratio."""
    return hcs["pods_per_s"] / plain["pods_per_s"] if plain["pods_per_s"] else math.nan


def cpu_ratio(
    plain: dict[str, Any],
    hcs: dict[str, Any],
    rest: dict[str, float],
    *,
    leave_out: tuple[str, ...] = (),
    at_plain: frozenset[str] = frozenset(),
) -> float:
    """The ratio CPU per pod predicts with the machine saturated: plain's over
    HCS's, over every process but those named in ``leave_out``; each process
    in ``at_plain`` counted in the HCS burst at what it cost a plain pod
    (with ``hcs_own``: the most a faster HCS could reach, what is left being
    the Kubernetes side's extra work for the pod HCS makes)."""
    a, b = cost_per_pod(plain, rest), cost_per_pod(hcs, rest)
    cpu_plain = sum(ms for n, ms in a.items() if n not in leave_out)
    cpu_hcs = sum(
        a.get(n, 0.0) if n in at_plain else ms for n, ms in b.items() if n not in leave_out
    )
    return cpu_plain / cpu_hcs if cpu_hcs else math.nan


def hcs_own(r: dict[str, Any]) -> frozenset[str]:
    """The processes of burst ``r`` that are HCS's: its parts and the bus."""
    return frozenset(n for n, (group, _s) in r["cpu_s"].items() if group == "hcs" or n == BUS)


def pairs(results: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The bursts, in the order they ran, two by two as (plain, HCS): a round
    may have run either first (``round_order``)."""
    out = []
    for a, b in zip(results[::2], results[1::2], strict=True):
        out.append((a, b) if a["label"].startswith("plain") else (b, a))
    return out


def round_order(rounds: int, plain: Any, hcs: Any) -> list[Any]:
    """Plain first in odd rounds, HCS first in even ones: with the machine
    slowing (or speeding up) through a run, each side runs second as often."""
    return [x for i in range(1, rounds + 1) for x in ((plain, hcs) if i % 2 else (hcs, plain))]


def report_rounds(results: list[dict[str, Any]], rest: dict[str, float]) -> None:
    """With ``--rounds``: each (plain, HCS) pair's ratio, measured and as CPU
    per pod predicts it, and their median. The machine's speed drifts
    between runs; pairs run back to back share it."""
    rounds = pairs(results)
    if len(rounds) < 2:
        return
    print("\nrounds (back to back; plain first in odd rounds, HCS first in even ones):")
    print(f"  {'round':<6}{'plain/s':>9}{'hcs/s':>9}{'ratio':>8}{'by CPU':>8}")
    measured, predicted, clean = [], [], []
    for i, (plain, hcs) in enumerate(rounds, 1):
        ratio, by_cpu = pods_ratio(plain, hcs), cpu_ratio(plain, hcs, rest)
        measured.append(ratio)
        predicted.append(by_cpu)
        hit = plain.get("revived") or hcs.get("revived")
        if not hit:
            clean.append(ratio)
        print(
            f"  {i:<6}{plain['pods_per_s']:>9.1f}{hcs['pods_per_s']:>9.1f}{ratio:>8.2f}{by_cpu:>8.2f}"
            + ("  * a kubelet restarted" if hit else "")
        )
    print(
        f"  median ratio {statistics.median(measured):.2f} (min {min(measured):.2f}, "
        f"max {max(measured):.2f}; by CPU {statistics.median(predicted):.2f}; target >= 0.8)"
    )
    if clean and len(clean) < len(measured):
        print(
            f"  median of the {len(clean)} rounds without a restarted kubelet: "
            f"{statistics.median(clean):.2f}"
        )


def report_requests(results: list[dict[str, Any]], *, top: int = 14) -> None:
    """The API server's busiest request kinds during each burst, per pod."""
    print("\nAPI server requests per pod during each burst (apiserver_request_total):")
    kinds = collections.Counter[str]()
    for r in results:
        kinds.update(r["requests"])
    names = [k for k, _ in kinds.most_common(top)]
    print(f"  {'request':<36}" + "".join(f"{r['label']:>9}" for r in results))
    for name in names:
        cells = "".join(f"{r['requests'][name] / max(r['pods'], 1):>9.2f}" for r in results)
        print(f"  {name:<36}{cells}")


def report_room(label: str, room: dict[str, Any]) -> None:
    print(
        f"\n{label}: {room['unbound']} pods unbound at the end; pending while an allowed class "
        f"had room: {room['while_room']} (target 0; {room['planned_room']} of them in their "
        f"planned class; {room['stranded']} marked HCSStranded)"
    )
    for kind, count in sorted(room["by_kind"].items()):
        print(f"  pending with room x{count}: {kind}")
    for line in room["examples"]:
        print(f"  e.g. {line}")
    print("  room at the end: " + "; ".join(room["classes"]))
    if room["blocked"]:
        print(
            "  nodes taking no new pods (their devices are not room): " + ", ".join(room["blocked"])
        )


def pinned_burst(
    cluster: Cluster,
    stack: Stack,
    hcs: dict[str, Any],
    *,
    names: list[str],
    rest: dict[str, float],
    workers: int,
    settle_s: float,
) -> dict[str, Any]:
    """Plain pods, each held to the node of one of ``hcs``'s started pods."""
    nodes = hcs["placement"]
    clear(cluster, stack, hcs["namespace"], rest)
    most = max(collections.Counter(nodes).values(), default=0)
    advertise_plain(cluster, names, per_node=most + 2)
    print(f"plainpin burst: {len(nodes)} pods on the {hcs['label']} burst's nodes", flush=True)
    return burst(
        cluster,
        stack,
        label="plainpin",
        kinds=[PLAIN_KIND] * len(nodes),
        workers=workers,
        settle_s=settle_s,
        nodes=nodes,
    )


def report_pinned(
    plain: dict[str, Any], hcs: dict[str, Any], pinned: dict[str, Any], rest: dict[str, float]
) -> None:
    """HCS against plain pods placed as HCS placed its own: the ratio without
    the placement policy's share (a kubelet starts pods at its API client's
    rate, so pods per node set the burst's end); and that share: the pinned
    plain burst against the free one, the ratio HCS would reach at no cost."""
    print(
        f"\nsame placement ({pinned['label']}: plain pods pinned to the nodes {hcs['label']} used, "
        f"as many per node): {pinned['pods_per_s']:.1f} pods/s, {hcs['label']} "
        f"{hcs['pods_per_s']:.1f}; ratio {pods_ratio(pinned, hcs):.2f}, "
        f"by CPU {cpu_ratio(pinned, hcs, rest):.2f}"
    )
    print(
        f"  the placement alone: {pinned['label']} ran at {pods_ratio(plain, pinned):.2f} of "
        f"{plain['label']} ({plain['pods_per_s']:.1f} pods/s), the ratio an HCS path that "
        "cost nothing would reach with it"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.burst", description=__doc__)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--workers", type=int, default=50, help="concurrent create clients")
    parser.add_argument("--vram", default="16Gi", help="ai.compute/vram per HCS pod")
    parser.add_argument(
        "--mix", action="store_true", help="the HCS burst asks for a mix of requests (bench.mixes)"
    )
    parser.add_argument(
        "--rest-s",
        type=float,
        default=15.0,
        help="measure each process's CPU at rest for this long before the bursts",
    )
    parser.add_argument(
        "--settle-s", type=float, default=30.0, help="stop when no pod starts for this long"
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the plain and HCS bursts this many times in turn and print each pair's ratio",
    )
    parser.add_argument(
        "--same-placement",
        action="store_true",
        help="then plain pods pinned to the nodes the last HCS burst used, as many per node "
        "(plainpin): what HCS costs apart from where its placement policy puts pods",
    )
    parser.add_argument(
        "--placement",
        choices=("pack", "spread"),
        default="pack",
        help="the scheduler's HCS_SCHEDULER__PLACEMENT (default pack, as shipped)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the logs folder")
    args = parser.parse_args(argv)
    configure(TelemetrySettings(log_format="console", log_level="warning"), service="bench-burst")
    bins = find_binaries()
    if isinstance(bins, str):
        print(f"bench.burst: {bins}", file=sys.stderr)
        return 2
    os.environ["HCS_SCHEDULER__PLACEMENT"] = args.placement  # the parts inherit it
    print(f"placement: {args.placement}", flush=True)
    root = Path(tempfile.mkdtemp(prefix="hcs-burst-"))
    cluster = Cluster(bins, root=root)
    stack: Stack | None = None
    try:
        cluster.start()
        fleet = fleet_file(args.nodes, root)
        names = [n["name"] for n in yaml.safe_load(fleet.read_text())["nodes"]]
        if args.mix:
            replan = {vocabulary.REPLAN: vocabulary.REPLAN_RECREATE}
            hcs_kinds = [
                dataclasses.replace(k, annotations={**k.annotations, **replan})
                for k in mixes.kinds_for(args.pods)
            ]
            hcs_label = "hcs-mix"
            print_mix(hcs_kinds, nodes=names, fleet=fleet)
        else:
            hcs_kinds = [Kind("vram", 100, {"ai.compute/vram": args.vram})] * args.pods
            hcs_label = "hcs"
        t0 = time.monotonic()
        cluster.add_nodes(names)
        print(f"{len(names)} hollow nodes Ready in {time.monotonic() - t0:.1f} s", flush=True)
        stack = Stack(cluster, fleet=fleet, root=root)
        stack.start()
        wait_labelled(cluster, names)
        advertise_plain(cluster, names, per_node=-(-args.pods // len(names)) + 2)
        rest = settled_rest(cluster, stack, seconds=args.rest_s)
        plain = [PLAIN_KIND] * args.pods
        results: list[dict[str, Any]] = []
        order = round_order(args.rounds, ("plain", plain), (hcs_label, hcs_kinds))
        runs = [
            (f"{name}-{i // 2 + 1}" if i > 1 else name, kinds)
            for i, (name, kinds) in enumerate(order)
        ]
        for label, kinds in runs:
            if results:
                clear(cluster, stack, results[-1]["namespace"], rest)
            print(f"{label} burst: {len(kinds)} pods, {args.workers} clients", flush=True)
            results.append(
                burst(
                    cluster,
                    stack,
                    label=label,
                    kinds=kinds,
                    workers=args.workers,
                    settle_s=args.settle_s
                    + (REPLAN_AFTER_S if label.startswith("hcs-mix") else 0.0),
                )
            )
            # the same, with the burst's pods running: what holding them costs
            results[-1]["held"] = at_rest(cluster, stack, seconds=args.rest_s)
        pinned = []
        if args.same_placement:
            pinned = [
                pinned_burst(
                    cluster,
                    stack,
                    pairs(results)[-1][1],
                    names=names,
                    rest=rest,
                    workers=args.workers,
                    settle_s=args.settle_s,
                )
            ]
        report(results + pinned)
        report_pod_cost(results, rest)
        report_rounds(results, rest)
        for run in pinned:
            report_pinned(*pairs(results)[-1], run, rest)
    finally:
        if stack is not None:
            stack.stop()
        cluster.stop()
        if args.keep:
            print(f"logs: {root / 'logs'}")
        else:
            import shutil

            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
