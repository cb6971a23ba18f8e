"""Builders for scheduler tests: fingerprints with real profile numbers, a
fake Kube, and a running replica."""

from __future__ import annotations

import asyncio
import copy
import json
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp

from hcs_bus import profiles, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import KubeNotFound
from hcs_bus.messages import Compute, DeviceFingerprint, Link, NodeFingerprint, PodRef, Policy
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.view.state import ClusterState

K8S = Path(__file__).with_name("wire")  # copies of the shared k8s/ extender documents
DB = profiles.load()


def k8s_doc(name: str) -> Any:
    return json.loads((K8S / name).read_text())


def dev(
    index: int,
    key: str = "nvidia/A100-80G",
    *,
    links: dict[int, float] | None = None,
    health: int = 100,
    error: str | None = None,
    driver_mib: int = 0,
) -> DeviceFingerprint:
    p = DB.get(key)
    return DeviceFingerprint(
        index=index,
        uuid=f"GPU-{p.model}-{index}",
        vendor=p.vendor,
        model=p.model,
        vram_total_mib=p.vram_mib,
        vram_free_mib=p.vram_mib - driver_mib,
        vram_driver_mib=driver_mib,
        compute=Compute(acu_profile=p.acu, tflops_fp16_profile=p.tflops_fp16),
        links=tuple(
            Link(peer_index=k, type=p.interconnect, bandwidth_gbps=v)
            for k, v in (links or {}).items()
        ),
        health_score=health,
        error=error,
    )


def node_fp(
    name: str,
    key: str = "nvidia/A100-80G",
    *,
    count: int = 8,
    devices: tuple[DeviceFingerprint, ...] | None = None,
    labels: dict[str, str] | None = None,
    seq: int = 1,
) -> NodeFingerprint:
    return NodeFingerprint(
        node=name,
        agent_version="test",
        boot_id="b1",
        seq=seq,
        time_s=1.0,
        devices=devices if devices is not None else tuple(dev(i, key) for i in range(count)),
        labels=labels or {},
    )


def state_of(*fps: NodeFingerprint) -> ClusterState:
    state = ClusterState()
    for fp in fps:
        state.apply_fingerprint(fp, now=0.0)
    return state


async def publish_fleet(bus: Bus, *fps: NodeFingerprint) -> None:
    for fp in fps:
        # unique ids: the stream's duplicate window outlives the purge between tests
        msg_id = f"{fp.node}:{fp.boot_id}:{fp.seq}:{uuid.uuid4().hex}"
        await bus.publish(subjects.fp(fp.node), fp, msg_id=msg_id)


async def post(port: int, verb: str, body: Any) -> tuple[int, Any]:
    """POST an extender verb; the status and the decoded answer (or its text)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}/{verb}", data=data) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text


async def until(predicate: Callable[[], object], *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not predicate():
            await asyncio.sleep(0.01)


def pod(
    name: str,
    *,
    namespace: str = "ml-team",
    uid: str | None = None,
    plan: dict[str, Any] | None = None,
    requests: dict[str, str] | None = None,
    priority: int = 0,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod shaped like the one in extender-filter-args-*.json."""
    base = copy.deepcopy(k8s_doc("extender-filter-args-nodecache.json")["Pod"])
    base["metadata"].update(name=name, namespace=namespace, uid=uid or f"uid-{name}")
    base["metadata"]["labels"].update(labels or {})
    if plan is not None:
        base["metadata"]["annotations"]["hcs.io/plan"] = json.dumps(plan)
    container = base["spec"]["containers"][0]
    container["resources"]["requests"].update(requests or {})  # extended resources:
    container["resources"]["limits"].update(requests or {})  # the limit equals the request
    base["spec"]["priority"] = priority
    return base


A100_SLICE = {
    "vendor": "nvidia",
    "model": "A100-80G",
    "devices": 1,
    "vram_mib_per_device": 16384,
    "whole_device": False,
}
A100_TWO = {
    "vendor": "nvidia",
    "model": "A100-80G",
    "devices": 2,
    "vram_mib_per_device": 81920,
    "whole_device": True,
    "acu_per_device": 100.0,
}
A100_WHOLE = {**A100_TWO, "devices": 1}  # one whole A100-80G


def pod_info(
    name: str,
    *,
    namespace: str = "ml",
    uid: str | None = None,
    job: str | None = None,
    annotation: PlanAnnotation | None = None,
    pledge: str = "",
) -> PodInfo:
    """A pod as placing sees it: no requests, default policy, priority 0."""
    return PodInfo(
        ref=PodRef(namespace=namespace, name=name, uid=f"uid-{name}" if uid is None else uid),
        requests=None,
        policy=Policy(),
        annotation=annotation,
        priority=0,
        job=job,
        pledge=pledge,
    )


class FakeKube:
    """Records Bindings; serves pods, and pod and node watches from queues."""

    def __init__(self) -> None:
        self.bindings: list[dict[str, Any]] = []
        self.pods: dict[tuple[str, str], dict[str, Any]] = {}
        self.events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.node_events: asyncio.Queue[tuple[str, dict[str, Any]]] = asyncio.Queue()
        self.quotas: dict[str, list[dict[str, Any]]] = {}
        self.pod_selectors: list[str | None] = []  # each pod watch's field selector

    def add_pod(self, namespace: str, name: str, *, node: str, uid: str) -> dict[str, Any]:
        """A pod bound to ``node`` and running."""
        found = self.pods[(namespace, name)] = {
            "metadata": {"namespace": namespace, "name": name, "uid": uid},
            "spec": {"nodeName": node, "schedulerName": "hcs-scheduler"},
            "status": {"phase": "Running"},
        }
        return found

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> dict[str, Any]:
        self.bindings.append(
            {
                "namespace": namespace,
                "name": name,
                "uid": uid,
                "node": node,
                "annotations": annotations,
            }
        )
        return {"kind": "Status", "status": "Success"}

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return self.pods[(namespace, name)]
        except KeyError:  # as the adapter answers a 404
            raise KubeNotFound(f"get pod {namespace}/{name}: not found") from None

    async def watch_pods(
        self, *, field_selector: str | None = None, synced: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.pod_selectors.append(field_selector)
        if synced is not None:  # an empty first list
            synced.set()
        while True:
            yield await self.events.get()

    async def watch_nodes(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        synced: asyncio.Event | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        if synced is not None:  # an empty first list
            synced.set()
        while True:
            yield await self.node_events.get()

    async def list_compute_quotas(self, namespace: str) -> list[dict[str, Any]]:
        return self.quotas.get(namespace, [])

    async def patch_compute_quota_used(
        self, namespace: str, name: str, used: dict[str, Any]
    ) -> dict[str, Any]:
        for quota in self.quotas.get(namespace, []):
            if quota["metadata"]["name"] == name:
                quota.setdefault("status", {})["used"] = used
                return quota
        raise KeyError(name)

    async def patch_compute_quota_conditions(
        self, namespace: str, name: str, conditions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        for quota in self.quotas.get(namespace, []):
            if quota["metadata"]["name"] == name:
                quota.setdefault("status", {})["conditions"] = conditions
                return quota
        raise KeyError(name)

    async def list_pods(self, **_selectors: Any) -> list[dict[str, Any]]:
        return list(self.pods.values())

    async def list_pod_summaries(self) -> list[dict[str, Any]]:
        return list(self.pods.values())

    async def list_pod_annotations(self, namespace: str) -> list[dict[str, Any]]:
        return [
            {"metadata": {"annotations": dict(p["metadata"].get("annotations") or {})}}
            for (ns, _name), p in self.pods.items()
            if ns == namespace
        ]


def a100_slice(mib: int, *, whole: bool = False) -> PlanAnnotation:
    """The plan note of one A100-80G device: a ``mib`` slice, or the whole device."""
    return PlanAnnotation(
        vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=mib, whole_device=whole
    )
