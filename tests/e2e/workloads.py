"""Workloads the e2e tests put on the cluster, and what they read back."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agents import fleet as fleet_file
from bench.mixes import planned_class
from hcs_bus.profiles import load as load_profiles
from scheduler.ledger.release_loop import node_block
from tests.e2e.api import ApiError, wait_for
from tests.e2e.stack import Stack

SCHEDULER = "hcs-scheduler"


def container(requests: Mapping[str, str], *, name: str = "main") -> dict[str, Any]:
    """A container asking for ``requests`` (requests = limits, as extended resources must)."""
    return {
        "name": name,
        "image": "registry.example/train:1",
        "resources": {"requests": dict(requests), "limits": dict(requests)},
    }


def pod_spec(requests: Mapping[str, str], **spec: Any) -> dict[str, Any]:
    return {"containers": [container(requests)], "terminationGracePeriodSeconds": 0, **spec}


class Workloads:
    def __init__(self, stack: Stack, *, namespace: str) -> None:
        self.stack = stack
        self.api = stack.cluster.api
        self.namespace = namespace

    @property
    def pods_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods"

    def pod(
        self,
        name: str,
        requests: Mapping[str, str],
        *,
        labels: Mapping[str, str] | None = None,
        annotations: Mapping[str, str] | None = None,
        **spec: Any,
    ) -> dict[str, Any]:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "labels": dict(labels or {}),
                "annotations": dict(annotations or {}),
            },
            "spec": pod_spec(requests, **spec),
        }
        created: dict[str, Any] = self.api.create(body, namespace=self.namespace)
        return created

    def dry_run_class(
        self, requests: Mapping[str, str], *, annotations: Mapping[str, str] | None = None
    ) -> str:
        """The class the webhook plans such a pod into now: a dry-run create
        (no pledge), read with ``bench.mixes.planned_class``."""
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "probe", "annotations": dict(annotations or {})},
            "spec": pod_spec(requests),
        }
        return planned_class(self.api.post(f"{self.pods_path}?dryRun=All", body))

    def get(self, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = self.api.get(f"{self.pods_path}/{name}")
        return pod

    def pods(self, selector: str | None = None) -> list[dict[str, Any]]:
        query = f"?labelSelector={selector}" if selector else ""
        return self.api.items(f"{self.pods_path}{query}")

    def explain(self, name: str) -> str:
        """What the pod, its events and the HCS parts say (for failure messages)."""
        try:
            pod = self.get(name)
            status = pod.get("status", {})
            node = pod.get("spec", {}).get("nodeName")
        except ApiError as exc:
            return f"pod {name}: {exc}"
        events = self.api.items(
            f"/api/v1/namespaces/{self.namespace}/events?fieldSelector=involvedObject.name={name}"
        )
        said = [f"{e.get('reason')}: {e.get('message')}" for e in events][-6:]
        return (
            f"pod {name} on {node}: phase {status.get('phase')} reason {status.get('reason')} "
            f"message {status.get('message')} conditions {status.get('conditions')}; "
            f"events {said}; {self.stack.why()}"
        )

    def running(self, name: str, *, timeout_s: float = 60) -> dict[str, Any]:
        def check() -> dict[str, Any] | None:
            pod = self.get(name)
            phase = pod.get("status", {}).get("phase")
            if phase == "Failed":
                raise AssertionError(f"pod {name} failed: {self.explain(name)}")
            return pod if phase == "Running" else None

        return wait_for(
            check,
            what=f"pod {name} Running",
            timeout_s=timeout_s,
            explain=lambda: self.explain(name),
        )

    def node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = self.api.get(f"/api/v1/nodes/{name}")
        return node


def expected_capacity(fleet: Path) -> dict[str, dict[str, int]]:
    """What each fleet node's Node must advertise, from the profile database."""
    db = load_profiles()
    out: dict[str, dict[str, int]] = {}
    for node in fleet_file.load(fleet).nodes:
        vram_mib = devices = acu = 0
        for group in node.device_groups:
            profile = db.get(group.model)
            vram_mib += profile.vram_mib * group.count
            acu += int(profile.acu * group.count)
            devices += group.count
        out[node.name] = {"vram": vram_mib * 1024 * 1024, "devices": devices, "acu": acu}
    return out


def fleet_labelled(work: Workloads, fleet: Path, *, timeout_s: float = 60) -> dict[str, Any]:
    """Wait until every fleet node carries the HCS labels, the kubelet has
    synced every ``ai.compute/*`` capacity into allocatable, and the Node takes
    new pods (no cordon, no node-lifecycle taint: HCS plans around such a
    node, ``scheduler.ledger.release_loop.node_block``); the Nodes by name."""
    names = [n.name for n in fleet_file.load(fleet).nodes]

    def labelled(name: str) -> dict[str, Any] | None:
        node = work.node(name)
        labels = node["metadata"].get("labels", {})
        alloc = node["status"].get("allocatable", {})
        cap = node["status"].get("capacity", {})
        ours = {k: v for k, v in cap.items() if k.startswith("ai.compute/")}
        if not ours or any(alloc.get(k) != v for k, v in ours.items()):
            return None  # the kubelet has not synced allocatable yet
        if node_block(node) is not None:
            return None  # not ready yet, or cordoned: plans leave it out
        return node if "hcs.io/network-group" in labels else None

    def explain(name: str) -> str:
        node = work.node(name)
        return f"allocatable {node['status'].get('allocatable')}; takes no pods: {node_block(node)}"

    nodes = {
        name: wait_for(
            lambda name=name: labelled(name),
            what=f"HCS labels, ai.compute capacity in allocatable and new pods taken on {name}",
            timeout_s=timeout_s,
            explain=lambda name=name: explain(name),
        )
        for name in names
    }
    # the scheduler plans on its view, not on the Nodes: on a stack just started
    # its view may not hold the agents' first fingerprints yet (a 403 "the
    # cluster view holds no devices" for the first pod, else)
    wait_for(
        lambda: not work.stack.views_missing(names),
        what="every scheduler replica's view holding the fleet's nodes",
        timeout_s=timeout_s,
        explain=lambda: f"missing from the views: {work.stack.views_missing(names)}",
    )
    return nodes
