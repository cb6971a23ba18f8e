"""The loop behind ``scheduler.replanning``: once the view is replayed it
wakes every pending HCS pod (kube-scheduler parked those whose extender
calls failed during an outage), then every ``stranding_scan_s`` lists the
pending HCS pods, wakes those of classes that gained room, and re-plans the
ones stranded longer than ``replan_after_s``.

Safe with several replicas: a wake is a merge patch (two are two update
events, no harm); an eviction carries the pod's uid as a precondition, so a
second replica's (or a re-created pod's) answer is 404/409 and is let be; the
Event is named per pod incarnation, so the second create is a 409.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hcs_bus import vocabulary
from hcs_bus.errors import HcsError, KubeConflict, KubeNotFound, KubeTooManyRequests
from hcs_bus.telemetry import logger, meter
from scheduler import planning, replanning
from scheduler.replanning import Pending, Stranded
from scheduler.serving import Planner

_log = logger("hcs.scheduler.stranding")
_meter = meter("hcs.scheduler")
WOKEN = _meter.create_counter("hcs_pods_woken", description="parked pods woken")
REPLANNED = _meter.create_counter(
    "hcs_pods_replanned", description="stranded pods re-planned, by action"
)
REPORTER = "hcs-scheduler"


class Kube(Protocol):
    """The part of ``hcs_bus.kube.Kube`` this loop uses."""

    async def list_pods(self, *, field_selector: str | None = None) -> list[dict[str, Any]]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> dict[str, Any]: ...

    async def patch_pod_condition(
        self, namespace: str, name: str, condition: dict[str, Any]
    ) -> dict[str, Any]: ...

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def evict_pod(
        self, namespace: str, name: str, *, dry_run: bool = False, uid: str | None = None
    ) -> dict[str, Any]: ...


def _now_iso() -> str:
    """Wall-clock time for API objects (Event, condition), never for decisions."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class Stranding:
    kube: Kube
    planner: Planner
    scheduler_name: str
    replica: str
    replan_after_s: float = 30.0
    scan_s: float = 2.0
    wake_min_interval_s: float = 5.0
    clock: Callable[[], float] = field(default_factory=lambda: asyncio.get_running_loop().time)
    stranded_since: replanning.Clock = field(default_factory=replanning.Clock)
    waker: replanning.Waker | None = None
    _capacity: dict[str, tuple[int, int, tuple[int, ...]]] | None = None
    _wakes: int = 0

    def __post_init__(self) -> None:
        if self.waker is None:
            self.waker = replanning.Waker(min_interval_s=self.wake_min_interval_s)

    async def run(self, *, ready: asyncio.Event) -> None:
        """Forever: wait for the replay, wake everyone, then scan."""
        await ready.wait()
        while True:
            try:
                await self.scan()
            except HcsError as exc:
                _log.warning("stranding_scan_failed", error=str(exc))
            await asyncio.sleep(self.scan_s)

    async def pending(self) -> list[Pending]:
        listed = await self.kube.list_pods(
            field_selector=f"spec.schedulerName={self.scheduler_name},spec.nodeName="
        )
        out = []
        for pod in listed:
            found = replanning.pending(pod, scheduler_name=self.scheduler_name)
            if found is not None:
                out.append(found)
        return out

    async def scan(self) -> tuple[int, int]:
        """One pass: (pods woken, pods re-planned)."""
        pods = await self.pending()
        summary = self.planner.summary()
        now = self.clock()
        capacity = replanning.capacity(summary)
        classes = replanning.freed(self._capacity, capacity)
        self._capacity = capacity
        assert self.waker is not None
        woken = 0
        for pod in self.waker.pick(pods, classes=classes, now=now):
            woken += await self.wake(pod)
        found = [s for p in pods if (s := await self._stranded(p, summary)) is not None]
        replanned = 0
        for item in self.stranded_since.due(found, now=now, after_s=self.replan_after_s):
            if await self.replan(item):
                self.stranded_since.acted(item)
                replanned += 1
        return woken, replanned

    async def _stranded(self, pod: Pending, summary: planning.Summary) -> Stranded | None:
        if replanning.fits_class(pod.plan, summary):
            return None  # its class can hold it: parked at most, woken above
        request = replanning.request_of(pod)
        if request is None:
            return None
        fresh = await self.planner.plan(request)
        return replanning.stranded(pod, fresh=fresh, summary=summary)

    async def wake(self, pod: Pending) -> int:
        """Change the pod's ``hcs.io/wake`` note: an update event kube-scheduler
        answers by taking the pod out of its unschedulable queue."""
        self._wakes += 1
        ref = pod.ref
        try:
            await self.kube.patch_pod_annotations(
                ref.namespace, ref.name, {vocabulary.WAKE: f"{self.replica}/{self._wakes}"}
            )
        except KubeNotFound:
            return 0
        WOKEN.add(1)
        _log.info("pod_woken", pod=f"{ref.namespace}/{ref.name}", plan=pod.plan.key)
        return 1

    async def replan(self, item: Stranded) -> int:
        ref = item.pod.ref
        name = f"{ref.namespace}/{ref.name}"
        await self._tell(item)
        if item.action == "report":
            REPLANNED.add(1, {"action": "report"})
            _log.warning("pod_stranded", pod=name, reason=item.reason, target=item.target)
            return 1
        try:
            await self.kube.evict_pod(ref.namespace, ref.name, uid=ref.uid or None)
        except (KubeNotFound, KubeConflict):
            return 0  # gone or replaced meanwhile (another replica got there first)
        except KubeTooManyRequests as exc:
            _log.info("replan_refused_by_budget", pod=name, error=str(exc))
            return 0
        REPLANNED.add(1, {"action": "evict"})
        _log.warning(
            "pod_replanned", pod=name, owner=item.pod.owner, reason=item.reason, target=item.target
        )
        return 1

    async def _tell(self, item: Stranded) -> None:
        """The Event on the pod, and for a bare pod the condition."""
        ref, at = item.pod.ref, _now_iso()
        try:
            await self.kube.create_event(
                ref.namespace, replanning.event(item, now_iso=at, reporter=REPORTER)
            )
        except KubeConflict:
            pass  # told already (this replica earlier, or another)
        except HcsError as exc:
            _log.info("stranded_event_failed", pod=f"{ref.namespace}/{ref.name}", error=str(exc))
        if item.action != "report":
            return
        try:
            await self.kube.patch_pod_condition(
                ref.namespace, ref.name, replanning.condition(item, now_iso=at)
            )
        except KubeNotFound:
            pass


def of_settings(*, kube: Any, planner: Planner, settings: Any, replica: str) -> Stranding:
    """A ``Stranding`` configured from ``Settings`` (scheduler and injector
    groups); ``kube`` is the replica's ``hcs_bus.kube.Kube``."""
    cfg = settings.scheduler
    return Stranding(
        kube=kube,
        planner=planner,
        scheduler_name=settings.injector.scheduler_name,
        replica=replica,
        replan_after_s=cfg.replan_after_s,
        scan_s=cfg.stranding_scan_s,
        wake_min_interval_s=cfg.wake_min_interval_s,
    )
