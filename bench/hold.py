"""What a running pod costs its kubelet, by shape: ``python -m bench.hold``.

A real control plane with ``--nodes`` hollow kubelets (``HCS_KUBE_BIN``) and
no HCS part. For each shape, ``--pods`` pods are bound straight to the nodes
(``spec.nodeName``: no scheduler, no webhook), so the kubelets are the only
ones working; once all run, the kubelets' CPU is read over ``--window-s``
and the load at rest (no pod) taken off. Shapes:

* plain: ``bench.burst``'s plain pod, the baseline;
* one per vendor profile of ``injector/data/runtimes.yaml``: the pod the
  injector makes of a 16Gi VRAM pod planned onto that vendor, by
  ``injector.mutations.mutate`` itself (volumes, env, RuntimeClass), less
  what only admission or scheduling reads (the compute requests and the
  node affinity: the hollow nodes advertise no devices and carry no labels);
* the first vendor with the ledger in a memory emptyDir, as every pod had it
  before the pod's /dev/shm held it.

Printed per shape: volumes, env entries, seconds until all run, the
kubelets' cores while holding them and the CPU per pod per second held,
against plain. In ``bench.burst`` the kubelets hold a burst's pods while
the rest of it starts, so this cost is part of each pod's cost there.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import msgspec

from bench.burst import burst_pod, cpu_s
from bench.mixes import Kind
from hcs_bus import demands
from injector import mutations as mutating
from injector import rebinds as rebinding
from injector import runtimes
from injector.plans import PlanNote, encode
from tests.e2e.api import wait_for
from tests.e2e.cluster import Cluster, find_binaries

VRAM = "16Gi"


@dataclass(frozen=True)
class Shape:
    name: str
    pod: dict[str, Any]

    @property
    def volumes(self) -> int:
        return len(self.pod["spec"].get("volumes") or []) + 1  # + the token volume

    @property
    def env(self) -> int:
        return sum(len(c.get("env") or []) for c in self.pod["spec"]["containers"])


def hcs_pod(vendor: str, ctx: mutating.Context) -> dict[str, Any]:
    """The pod the injector makes of a ``VRAM`` pod planned onto ``vendor``,
    less its compute requests and node affinity."""
    pod = burst_pod("x", Kind("vram", 100, {"ai.compute/vram": VRAM}))
    demand = demands.read(pod)
    assert demand is not None
    note = PlanNote(
        vendor=vendor, model="m", devices=1, vram_mib_per_device=16384, whole_device=False
    )
    mutation = mutating.mutate(
        pod,
        demand=demand,
        note=note,
        plan_annotations={"hcs.io/plan": encode(note)},
        choice=None,
        ctx=ctx,
    )
    out: dict[str, Any] = jsonpatch.apply_patch(pod, mutation.ops)
    out["spec"].pop("affinity", None)
    out["spec"].pop("schedulerName", None)
    for container in out["spec"]["containers"]:
        container.pop("resources", None)
    return out


def shapes() -> list[Shape]:
    base = runtimes.load()
    ctx = mutating.Context(
        runtimes=base,
        rebinding=rebinding.load(),
        scheduler_name="hcs-scheduler",
        interceptor_host_path="/usr/local/hcs/lib",
    )
    plain = burst_pod("x", Kind("plain", 100, {}))
    for container in plain["spec"]["containers"]:
        container.pop("resources", None)
    plain["spec"].pop("schedulerName", None)
    out = [Shape("plain", plain)]
    out += [Shape(vendor, hcs_pod(vendor, ctx)) for vendor in base.vendors]
    first = next(iter(base.vendors))
    old = msgspec.structs.replace(
        base, interceptor=msgspec.structs.replace(base.interceptor, ipc_shm_path=None)
    )
    out.append(Shape(f"{first}, ledger emptyDir", hcs_pod(first, ctx._replace(runtimes=old))))
    return out


def kubelets_cpu(cluster: Cluster) -> float:
    return sum(cpu_s(p.popen.pid) for p in cluster.processes if p.name.startswith("kubelet-"))


def cores(cluster: Cluster, seconds: float) -> float:
    """The hollow kubelets' CPU seconds per second over ``seconds``."""
    before, started = kubelets_cpu(cluster), time.monotonic()
    time.sleep(seconds)  # the measuring window itself
    return (kubelets_cpu(cluster) - before) / (time.monotonic() - started)


def hold(
    cluster: Cluster, shape: Shape, *, index: int, nodes: list[str], pods: int, window_s: float
) -> dict[str, float]:
    namespace = cluster.namespace(f"hold-{index}")
    cluster.ensure_default_service_account(namespace)

    def create(i: int) -> None:
        pod = copy.deepcopy(shape.pod)
        pod["metadata"]["name"] = f"p{i:04d}"
        pod["spec"]["nodeName"] = nodes[i % len(nodes)]
        cluster.api.create(pod, namespace=namespace)

    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=30) as pool:
        list(pool.map(create, range(pods)))

    def running() -> bool:
        items = cluster.api.items(f"/api/v1/namespaces/{namespace}/pods")
        return sum(p.get("status", {}).get("phase") == "Running" for p in items) >= pods

    wait_for(running, what=f"{pods} {shape.name} pods Running", timeout_s=600)
    start_s = time.monotonic() - started
    held = cores(cluster, window_s)
    cluster.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")
    wait_for(
        lambda: not cluster.api.items(f"/api/v1/namespaces/{namespace}/pods"),
        what=f"{shape.name} pods gone",
        timeout_s=600,
    )
    return {"start_s": start_s, "held": held}


def report(shapes: list[Shape], results: list[dict[str, float]], *, rest: float, pods: int) -> None:
    print(f"\nkubelets at rest: {rest:.3f} cores; {pods} pods per shape")
    print(
        f"  {'shape':<26}{'volumes':>8}{'env':>5}{'all run s':>10}"
        f"{'cores held':>11}{'ms/s per pod':>13}{'vs plain':>9}"
    )
    per_pod = [(r["held"] - rest) * 1000 / pods for r in results]
    for shape, r, cost in zip(shapes, results, per_pod, strict=True):
        print(
            f"  {shape.name:<26}{shape.volumes:>8}{shape.env:>5}{r['start_s']:>10.1f}"
            f"{r['held']:>11.3f}{cost:>13.3f}{cost / per_pod[0]:>9.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hold", description=__doc__)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--window-s", type=float, default=20.0)
    args = parser.parse_args(argv)
    bins = find_binaries()
    if isinstance(bins, str):
        print(f"bench.hold: {bins}", file=sys.stderr)
        return 2
    todo = shapes()
    cluster = Cluster(bins, root=Path(tempfile.mkdtemp(prefix="hcs-hold-")))
    try:
        cluster.start()
        cluster.add_runtime_classes(
            {s.pod["spec"]["runtimeClassName"] for s in todo if "runtimeClassName" in s.pod["spec"]}
        )
        nodes = [f"hold-{i:03d}" for i in range(args.nodes)]
        cluster.add_nodes(nodes)
        rest = cores(cluster, args.window_s)
        results = []
        for index, shape in enumerate(todo):
            print(f"{shape.name}: {args.pods} pods", flush=True)
            results.append(
                hold(
                    cluster, shape, index=index, nodes=nodes, pods=args.pods, window_s=args.window_s
                )
            )
        report(todo, results, rest=rest, pods=args.pods)
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
