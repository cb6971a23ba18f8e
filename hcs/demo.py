"""A demo training job for ``hcs up``, where no Kubernetes cluster exists.

It plays the parts a cluster would play around HCS, and talks to the real
HCS parts exactly as those would:

* as kube-apiserver: it sends the pod's ``AdmissionReview`` to the injector's
  webhook (HTTPS) and applies the returned JSONPatch;
* as kube-scheduler: it calls the extender's ``/filter``, ``/prioritize`` and
  ``/bind`` with ``ExtenderArgs`` documents, over HTTPS with kube-scheduler's
  client certificate;
* as the training code: it reports a checkpoint every few seconds through
  ``hcs_bus.checkpoint.report``;
* as the kubelet carrying out an eviction: when the healer's action names
  the pod (in dry-run, an ``action`` event on ``hcs.health.<node>``), it
  releases the pod's devices (``hcs.release``) and submits a replacement,
  which the injector plans again (substitution allowed) and bind gives
  ``hcs.io/resume-from``, the last checkpoint.

It is a feature for demos, beside the real paths, never instead of them.
"""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import jsonpatch

from hcs import alerts
from hcs_bus import checkpoint, messages, subjects, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.errors import HcsError
from hcs_bus.messages import (
    AllocationEvent,
    HealthEvent,
    Plan,
    PlanRequest,
    PodRef,
    Policy,
    ReleaseRequest,
    Requests,
)
from hcs_bus.telemetry import logger
from hcs_bus.units import quantity_mib
from scheduler.view.state import ClusterState

_log = logger("hcs.demo")
NAMESPACE = "demo"


@dataclass(frozen=True)
class DemoSpec:
    job: str = "llama"
    model: str = "A100-80G"
    devices: int = 8
    vram: str = "80Gi"
    checkpoint_every_s: float = 2.0
    steps_per_checkpoint: int = 100


@dataclass
class Attempt:
    """One pod of the job: where it ran and what it was given."""

    name: str
    uid: str
    node: str = ""
    model: str = ""
    resume_from: str = ""


@dataclass
class DemoJob:
    bus: Bus
    state: ClusterState
    webhook_url: str
    extender_url: str
    ca_file: Path
    client_cert_file: Path | None = None  # kube-scheduler's, for the extender
    client_key_file: Path | None = None
    spec: DemoSpec = field(default_factory=DemoSpec)
    attempts: list[Attempt] = field(default_factory=list)
    step: int = 0

    async def run(self) -> None:
        ssl_context = ssl.create_default_context(cafile=str(self.ca_file))
        if self.client_cert_file is not None:  # sent only to a server that asks for it
            ssl_context.load_cert_chain(self.client_cert_file, self.client_key_file)
        connector = aiohttp.TCPConnector(ssl=ssl_context)
        async with aiohttp.ClientSession(connector=connector) as http:
            evicted = asyncio.Event()
            sub = await self._watch_evictions(evicted)
            try:
                await self._lifecycle(http, evicted)
            finally:
                await sub.unsubscribe()

    async def _lifecycle(self, http: aiohttp.ClientSession, evicted: asyncio.Event) -> None:
        while True:
            attempt = await self._start_pod(http)
            trainer = asyncio.create_task(self._train(), name="demo:trainer")
            try:
                await evicted.wait()
            finally:  # evicted, or the job stopped (hcs up ending): never left to outlive the bus
                trainer.cancel()
                await asyncio.gather(trainer, return_exceptions=True)
            evicted.clear()
            _log.warning("demo_pod_evicted", pod=attempt.name, node=attempt.node, step=self.step)
            await self.bus.request(
                subjects.RELEASE,
                ReleaseRequest(pod=PodRef(NAMESPACE, attempt.name, attempt.uid), reason="evicted"),
                AllocationEvent,
                timeout_s=5.0,
            )

    # -- admission and scheduling, as the apiserver and kube-scheduler do it --
    async def _planner_ready(self) -> None:
        """Wait until a dry-run plan for the job's first class comes back
        promptly: an admission whose plan answers after the webhook gave up
        would leave a pledge holding that class until it is swept."""
        s = self.spec
        request = PlanRequest(
            namespace=NAMESPACE,
            requests=Requests(vram_mib=quantity_mib(s.vram), devices=s.devices),
            policy=Policy(models=(s.model,)),
            dry_run=True,
        )
        while True:
            try:
                plan = await self.bus.request(subjects.PLACE_DRY, request, Plan, timeout_s=1.0)
            except (TimeoutError, HcsError):
                plan = None
            if plan is not None and plan.ok:
                return
            await asyncio.sleep(1.0)

    async def _start_pod(self, http: aiohttp.ClientSession) -> Attempt:
        if not self.attempts:
            await self._planner_ready()
        attempt = Attempt(name=f"train-{len(self.attempts)}", uid=str(uuid.uuid4()))
        while True:
            if await self._try_start(http, attempt):
                break
            await asyncio.sleep(2.0)
        self.attempts.append(attempt)
        if attempt.resume_from:
            self.step = int(attempt.resume_from.rsplit("-", 1)[-1])
        _log.info(
            "demo_pod_running",
            pod=attempt.name,
            node=attempt.node,
            model=attempt.model,
            resume_from=attempt.resume_from or None,
        )
        return attempt

    async def _try_start(self, http: aiohttp.ClientSession, attempt: Attempt) -> bool:
        """Admit and schedule once; False (try again) while a part is not up yet."""
        try:
            pod = await self._admit(http, self._pod(attempt))
            return pod is not None and await self._schedule(http, pod, attempt)
        except (aiohttp.ClientError, OSError, TimeoutError, HcsError) as exc:
            _log.info("demo_waiting_for_the_stack", pod=attempt.name, error=str(exc)[:200])
            return False

    def _pod(self, attempt: Attempt) -> dict[str, Any]:
        s = self.spec
        limits = {"ai.compute/vram": s.vram, "ai.compute/devices": str(s.devices)}
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": attempt.name,
                "namespace": NAMESPACE,
                "uid": attempt.uid,
                "labels": {"app": s.job},
                "annotations": {
                    vocabulary.JOB: s.job,
                    vocabulary.MODELS: s.model,
                    vocabulary.SUBSTITUTION: "allow",
                },
            },
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": "pytorch/pytorch:latest",
                        "command": ["python", "train.py"],
                        "resources": {"limits": limits, "requests": dict(limits)},
                    }
                ]
            },
        }

    async def _admit(
        self, http: aiohttp.ClientSession, pod: dict[str, Any]
    ) -> dict[str, Any] | None:
        review = _review(pod)
        async with http.post(self.webhook_url, json=review) as answer:
            body = await answer.json()
        response = body["response"]
        if not response.get("allowed"):
            _log.warning("demo_admission_denied", reason=response.get("status", {}))
            return None
        patch = json.loads(base64.b64decode(response.get("patch") or "W10="))
        return dict(jsonpatch.apply_patch(pod, patch))

    async def _schedule(
        self, http: aiohttp.ClientSession, pod: dict[str, Any], attempt: Attempt
    ) -> bool:
        names = sorted(n.name for n in self.state.schedulable())
        args = {"Pod": pod, "Nodes": None, "NodeNames": names}
        filtered = await _post(http, f"{self.extender_url}/filter", args)
        fits = filtered.get("NodeNames") or []
        if not fits:
            _log.info("demo_pod_pending", pod=attempt.name, why=filtered.get("FailedNodes"))
            return False
        scores = await _post(http, f"{self.extender_url}/prioritize", {**args, "NodeNames": fits})
        node = max(scores, key=lambda s: (s["Score"], s["Host"]))["Host"]
        return await self._bind(http, attempt, node=node)

    async def _bind(self, http: aiohttp.ClientSession, attempt: Attempt, *, node: str) -> bool:
        bound = await self.bus.nc.subscribe(subjects.alloc(node))
        try:
            args = {
                "PodName": attempt.name,
                "PodNamespace": NAMESPACE,
                "PodUID": attempt.uid,
                "Node": node,
            }
            result = await _post(http, f"{self.extender_url}/bind", args)
            if result.get("Error"):
                _log.info("demo_bind_refused", pod=attempt.name, error=result["Error"])
                return False
            event = await _bound_event(bound, attempt)
        finally:
            await bound.unsubscribe()
        attempt.node = node
        attempt.model = f"{event.devices and len(event.devices)} × {event.vendor}/{event.model}"
        attempt.resume_from = event.annotations.get(vocabulary.RESUME_FROM, "")
        return True

    # -- training and eviction ------------------------------------------------
    async def _train(self) -> None:
        while True:
            await asyncio.sleep(self.spec.checkpoint_every_s)
            self.step += self.spec.steps_per_checkpoint
            await checkpoint.report(
                self.bus,
                namespace=NAMESPACE,
                job=self.spec.job,
                uri=f"s3://hcs-demo/{self.spec.job}/step-{self.step}",
                step=self.step,
                framework="demo",
            )

    async def _watch_evictions(self, evicted: asyncio.Event) -> Any:
        async def on_msg(msg: Any) -> None:
            event = alerts.decoded(msg.subject, msg.data)  # forged or undecodable: None
            if event and self.attempts and _evicts(event, f"{NAMESPACE}/{self.attempts[-1].name}"):
                evicted.set()

        return await self.bus.nc.subscribe(subjects.HEALTH_ALL, cb=on_msg)


def _evicts(event: HealthEvent, pod: str) -> bool:
    if (
        event.source != "healer"
        or event.kind != "action"
        or event.evidence.get("action") != "evict"
    ):
        return False
    return pod in str(event.evidence.get("pods", "")).split(",")


async def _bound_event(sub: Any, attempt: Attempt) -> AllocationEvent:
    decode = messages.decoder_for(AllocationEvent).decode
    async with asyncio.timeout(10):
        while True:
            event = decode((await sub.next_msg(timeout=10)).data)
            if event.state == "bound" and event.pod.name == attempt.name:
                return event


async def _post(http: aiohttp.ClientSession, url: str, body: dict[str, Any]) -> Any:
    async with http.post(url, json=body) as answer:
        if answer.status != 200:
            raise HcsError(f"{url}: HTTP {answer.status}: {await answer.text()}")
        return await answer.json()


def _review(pod: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": NAMESPACE,
            "operation": "CREATE",
            "userInfo": {"username": "system:serviceaccount:demo:job-controller"},
            "object": pod,
            "dryRun": False,
        },
    }
