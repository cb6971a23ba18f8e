"""The plan service (``hcs.place``) and explicit releases (``hcs.release``),
both core request-reply in the queue group of every scheduler replica.

``Planner`` keeps the class summary of the view (recomputed at most every
``max_age_s`` after a change, so plans stay O(classes), not O(nodes)).
"""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import AllocationEvent, Plan, PlanRequest, PodRef, ReleaseRequest
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger
from scheduler import planning
from scheduler.booking import Booker
from scheduler.pods import PlanAnnotation, PodInfo
from scheduler.quotas import QuotaSource
from scheduler.state import ClusterState

_log = logger("hcs.scheduler.serving")


class Planner:
    def __init__(
        self,
        state: ClusterState,
        *,
        profiles: ProfileDB,
        quotas: QuotaSource,
        max_age_s: float = 0.5,
    ) -> None:
        self.state = state
        self.profiles = profiles
        self.quotas = quotas
        self.max_age_s = max_age_s
        self._summary: planning.Summary | None = None
        self._at = float("-inf")
        self._dirty = True

    def changed(self, _node: str) -> None:
        self._dirty = True

    def summary(self) -> planning.Summary:
        now = asyncio.get_running_loop().time()
        if self._summary is None or (self._dirty and now - self._at >= self.max_age_s):
            self._dirty = False
            self._summary = planning.summarise(self.state.nodes.values())
            self._at = now
        return self._summary

    async def plan(self, request: PlanRequest) -> Plan:
        quota = await self.quotas.limits(request.namespace)
        return planning.plan(request, summary=self.summary(), profiles=self.profiles, quota=quota)

    async def demand(self, pod: PodInfo) -> PlanAnnotation | str:
        """The pod's device demand: its ``hcs.io/plan`` annotation, or a plan
        computed from its ``ai.compute/*`` requests; a string is a refusal."""
        if pod.annotation is not None:
            return pod.annotation
        assert pod.requests is not None
        request = PlanRequest(
            namespace=pod.ref.namespace,
            requests=pod.requests,
            policy=pod.policy,
            pod_name=pod.ref.name,
        )
        found = await self.plan(request)
        if not found.ok:
            return f"hcs: no plan for {pod.ref.namespace}/{pod.ref.name}: {found.reason}"
        return PlanAnnotation(
            vendor=found.vendor,
            model=found.model,
            devices=found.devices,
            vram_mib_per_device=found.vram_mib_per_device,
            whole_device=found.whole_device,
            acu_per_device=found.acu_per_device,
        )


class PlanService:
    """Answers ``hcs.place`` and ``hcs.release`` for one replica."""

    def __init__(self, bus: Bus, *, planner: Planner, booker: Booker) -> None:
        self.bus, self.planner, self.booker = bus, planner, booker
        self._subs: list[Any] = []

    async def start(self) -> None:
        self._subs = [
            await self.bus.serve(
                subjects.PLACE,
                PlanRequest,
                self._place,
                queue=subjects.PLACE_QUEUE,
                on_bad=lambda reason: Plan(ok=False, reason=reason),
            ),
            await self.bus.serve(
                subjects.RELEASE,
                ReleaseRequest,
                self._release,
                queue=subjects.PLACE_QUEUE,
                on_bad=_bad_release,
            ),
        ]

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []

    async def _place(self, request: PlanRequest) -> Plan:
        try:
            return await self.planner.plan(request)
        except Exception as exc:  # a plan request must always get an answer
            _log.error("plan_failed", namespace=request.namespace, error=repr(exc), exc_info=exc)
            return Plan(ok=False, reason=f"hcs: planning failed: {exc!r}")

    async def _release(self, request: ReleaseRequest) -> AllocationEvent:
        event = await self.booker.release(request.pod, reason=request.reason or "release request")
        if event is None:
            return AllocationEvent(
                node="",
                pod=request.pod,
                state="released",
                time_s=0.0,
                reason="no reservation held for this pod",
            )
        return event


def _bad_release(reason: str) -> AllocationEvent:
    return AllocationEvent(
        node="", pod=PodRef(namespace="", name=""), state="released", time_s=0.0, reason=reason
    )


async def ask_plan(bus: Bus, request: PlanRequest, *, timeout_s: float) -> Plan:
    """Ask any scheduler replica for a plan (``hcs place``)."""
    return await bus.request(subjects.PLACE, request, Plan, timeout_s=timeout_s)
