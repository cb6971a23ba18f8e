"""The loop behind ``scheduler.replan.rules``: once the view is replayed it
wakes every pending HCS pod (kube-scheduler parked those whose extender
calls failed during an outage), then every ``stranding_scan_s`` takes the
pending HCS pods, wakes those of classes that gained room, and re-plans the
ones stranded longer than ``replan_after_s``; a waiting gang moves whole
(``replanning.gang_move``: its record pinned to the new class by
compare-and-set, then each member re-planned as a stranded pod is). The pending pods are read from
``pending_pods`` (kept by the pod watch, ``scheduler.replan.pending_pods``) while it
is synced; without it, or until it is (startup, a watch re-opened), they are
listed from the API server's watch cache.

Safe with several replicas: a wake is a merge patch (two are two update
events, no harm); an eviction carries the pod's uid as a precondition, so a
second replica's (or a re-created pod's) answer is 404/409 and is let be; the
Event is named per pod incarnation, so the second create is a 409.

A bare pod with ``hcs.io/replan: recreate`` is read again, its new body
built and logged (``pod_recreating``: the copy, in full) before anything is
deleted; then it is deleted with uid and resourceVersion preconditions (one
replica wins; a pod bound or changed since it was read is let be), awaited
gone, and created again (transient failures retried). A create that fails
for good is logged with the body and told in an ``HCSRecreateFailed`` Event.
Not covered: a replica that dies between the delete and the create; the
copy then lives only in its log (nothing retries it on restart).
"""

from __future__ import annotations

import asyncio
import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from hcs_bus import kvcas, tasks, vocabulary
from hcs_bus.errors import (
    HcsError,
    KubeConflict,
    KubeNotFound,
    KubeTooManyRequests,
    KubeUnavailable,
)
from hcs_bus.telemetry import logger, meter
from scheduler.plan import gang_records
from scheduler.plan import rules as planning
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.service import Planner
from scheduler.replan import rules as replanning
from scheduler.replan.pending_pods import PendingPods
from scheduler.replan.rules import Pending, Stranded

_log = logger("hcs.scheduler.stranding")
_meter = meter("hcs.scheduler")
WOKEN = _meter.create_counter("hcs_pods_woken", description="parked pods woken")
REPLANNED = _meter.create_counter(
    "hcs_pods_replanned", description="stranded pods re-planned, by action"
)
REPORTER = "hcs-scheduler"


class Kube(Protocol):
    """The part of ``hcs_bus.kube.Kube`` this loop uses."""

    async def list_pods(
        self, *, field_selector: str | None = None, cached: bool = False
    ) -> list[dict[str, Any]]: ...

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> dict[str, Any]: ...

    async def patch_pod_condition(
        self, namespace: str, name: str, condition: dict[str, Any]
    ) -> dict[str, Any]: ...

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    async def delete_pod(
        self, namespace: str, name: str, *, uid: str, resource_version: str | None = None
    ) -> dict[str, Any]: ...

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

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
    gone_within_s: float = 30.0  # a deleted pod to re-create must be gone by then
    create_retries_s: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)  # waits between create tries
    clock: Callable[[], float] = field(default_factory=lambda: asyncio.get_running_loop().time)
    stranded_since: replanning.Clock = field(default_factory=replanning.Clock)
    gangs_since: replanning.Clock = field(default_factory=replanning.Clock)  # gangs to move
    waker: replanning.Waker | None = None
    pending_pods: PendingPods | None = None  # kept by the pod watch; listed without
    scans: int = 0
    _capacity: dict[str, tuple[int, int, tuple[int, ...]]] | None = None
    _planned: dict[str, int] | None = None  # per class, devices of pledged gangs' ranks
    _wakes: int = 0

    def __post_init__(self) -> None:
        if self.waker is None:
            self.waker = replanning.Waker(min_interval_s=self.wake_min_interval_s)

    async def run(self, *, ready: asyncio.Event) -> None:
        """Forever: wait for the replay, wake everyone, then scan."""
        await ready.wait()
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            try:
                await self.scan()
            except HcsError as exc:
                _log.warning("stranding_scan_failed", error=str(exc))
            await asyncio.sleep(tasks.spacing_s(loop.time() - began, every_s=self.scan_s))

    async def pending(self) -> list[Pending]:
        """The pending HCS pods: from the watch's store when it is synced,
        else listed (the API server's watch cache)."""
        if self.pending_pods is not None and (kept := self.pending_pods.pods()) is not None:
            return kept
        listed = await self.kube.list_pods(
            cached=True, field_selector=f"spec.schedulerName={self.scheduler_name},spec.nodeName="
        )
        out = []
        for pod in listed:
            found = replanning.pending(pod, scheduler_name=self.scheduler_name)
            if found is not None:
                out.append(found)
        return out

    async def scan(self) -> tuple[int, int]:
        """One pass: (pods woken, pods re-planned)."""
        self.scans += 1
        pods = await self.pending()
        summary = self.planner.summary()
        now = self.clock()
        capacity = replanning.capacity(summary)
        classes = replanning.freed(self._capacity, capacity)
        self._capacity = capacity
        planned = self._gang_planned()
        if classes is not None:
            classes |= replanning.unplanned(self._planned, planned)
        self._planned = planned
        assert self.waker is not None
        woken = 0
        queued = [p for p in pods if not p.gated]  # a gated pod is not parked: no wake
        for pod in self.waker.pick(queued, classes=classes, now=now):
            woken += await self.wake(pod)
        alone, members = replanning.by_gang(pods)
        found = [s for p in alone if (s := await self._stranded(p, summary)) is not None]
        replanned = 0
        for item in self.stranded_since.due(found, now=now, after_s=self.replan_after_s):
            if await self.replan(item):
                self.stranded_since.acted(item)
                replanned += 1
        moves = self._gang_moves(members)
        for move in self.gangs_since.due(moves, now=now, after_s=self.replan_after_s):
            moved = await self.move(move)
            if moved:
                self.gangs_since.acted(move)
                replanned += moved
        return woken, replanned

    def _gang_planned(self) -> dict[str, int]:
        pledger = self.planner.pledger
        if pledger is None:
            return {}
        return replanning.planned(r for r, _ in pledger.gangs.all())

    def _gang_moves(self, members: dict[str, list[Pending]]) -> list[replanning.GangMove]:
        """The waiting gangs to move whole (``replanning.gang_move``), each
        planned with what the pledged ranks of other gangs take."""
        pledger = self.planner.pledger
        if not members or pledger is None:
            return []
        known = [r for r, _ in pledger.gangs.all()]
        placed = gang_records.outstanding_ranks(known, reserved=self.planner.summary().pledge_ids)
        state = gang_records.with_placed(self.planner.state, placed)
        held = gang_records.without(self.planner.held(), placed)
        out = []
        for key, pods in sorted(members.items()):
            found = pledger.gangs.get(key)
            if found is None:
                continue
            move = replanning.gang_move(
                found[0], pods, state=state, held=held, profiles=self.planner.profiles
            )
            if move is not None:
                out.append(move)
        return out

    async def move(self, move: replanning.GangMove) -> int:
        """Pin the gang's record to its new class (compare-and-set: it must be
        the record the decision read), then admit every member again there.
        How many members were re-planned; 0 when the record changed meanwhile."""
        pledger = self.planner.pledger
        assert pledger is not None
        known = pledger.gangs.get(move.key)

        def decide(
            found: GangRecord | None,
        ) -> kvcas.Change[GangRecord, GangRecord | None]:
            if found is None or found != move.record:
                return kvcas.Keep(None)
            done = gang_records.moved(found, vendor=move.vendor, model=move.model)
            return kvcas.Put(done, done)

        def seen(read: kvcas.Read[GangRecord]) -> None:
            if read.value is not None and read.revision is not None:
                pledger.gangs.apply(
                    move.key, gang_records.ENCODER.encode(read.value), read.revision
                )

        written = await kvcas.update(
            pledger.kv,
            move.key,
            decide,
            decode=gang_records.DECODER.decode,
            encode=gang_records.ENCODER.encode,
            known=kvcas.Read(known[0], known[1]) if known is not None else None,
            seen=seen,
        )
        if written is None:
            _log.info("gang_move_lost", gang=move.key, target=move.target)
            return 0
        REPLANNED.add(1, {"action": "gang"})
        _log.warning(
            "gang_replanned",
            gang=move.key,
            source=move.record.class_key,
            target=move.target,
            members=len(move.members),
            reason=move.reason,
        )
        done = 0
        for item in move.stranded():
            done += await self.replan(item)
        return max(done, 1)

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
        if item.action == "recreate":
            return await self.recreate(item)
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

    async def recreate(self, item: Stranded) -> int:
        """Delete the bare pod and create it again as submitted (module doc)."""
        ref = item.pod.ref
        name = f"{ref.namespace}/{ref.name}"
        try:
            pod = await self.kube.get_pod(ref.namespace, ref.name)
        except KubeNotFound:
            return 0
        now = replanning.pending(pod, scheduler_name=self.scheduler_name)
        body = replanning.recreation(pod)
        if now is None or now.ref.uid != ref.uid or body is None:
            return 0  # bound, going or replaced since the scan; or no readable copy
        _log.warning("pod_recreating", pod=name, reason=item.reason, target=item.target, body=body)
        rv = (pod.get("metadata") or {}).get("resourceVersion")
        try:
            await self.kube.delete_pod(ref.namespace, ref.name, uid=ref.uid, resource_version=rv)
        except (KubeNotFound, KubeConflict):
            return 0  # changed or gone meanwhile (another replica, kube-scheduler)
        if not await self._gone(ref.namespace, ref.name, uid=ref.uid):
            await self._failed(item, body, error=f"it was not gone within {self.gone_within_s}s")
            return 1
        error = await self._create(ref.namespace, body)
        if error is not None:
            await self._failed(item, body, error=error)
            return 1
        REPLANNED.add(1, {"action": "recreate"})
        _log.warning("pod_recreated", pod=name, reason=item.reason, target=item.target)
        return 1

    async def _gone(self, namespace: str, name: str, *, uid: str) -> bool:
        """Wait (polling) until that incarnation of the pod is no more."""
        deadline = self.clock() + self.gone_within_s
        while True:
            try:
                pod = await self.kube.get_pod(namespace, name)
            except KubeNotFound:
                return True
            if (pod.get("metadata") or {}).get("uid") != uid:
                return True
            if self.clock() >= deadline:
                return False
            await asyncio.sleep(0.2)

    async def _create(self, namespace: str, body: dict[str, Any]) -> str | None:
        """Create ``body``, retrying what may pass later; the error, or None."""
        waits = iter(self.create_retries_s)
        while True:
            try:
                await self.kube.create_pod(namespace, body)
                return None
            except KubeConflict:
                _log.warning(
                    "pod_recreated_elsewhere", pod=f"{namespace}/{body['metadata']['name']}"
                )
                return None  # the name is taken again: a replica's copy or the user's own
            except (KubeUnavailable, KubeTooManyRequests) as exc:
                wait = next(waits, None)
                if wait is None:
                    return str(exc)
                _log.info("pod_recreate_retry", error=str(exc), wait_s=wait)
                await asyncio.sleep(wait)
            except HcsError as exc:
                return str(exc)

    async def _failed(self, item: Stranded, body: dict[str, Any], *, error: str) -> None:
        ref = item.pod.ref
        REPLANNED.add(1, {"action": "recreate_failed"})
        _log.error("pod_recreate_failed", pod=f"{ref.namespace}/{ref.name}", error=error, body=body)
        event = replanning.failed_event(ref, error=error, now_iso=_now_iso(), reporter=REPORTER)
        try:
            await self.kube.create_event(ref.namespace, event)
        except HcsError as exc:
            _log.info("recreate_failed_event_failed", error=str(exc))

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


def of_settings(
    *,
    kube: Any,
    planner: Planner,
    settings: Any,
    replica: str,
    pending_pods: PendingPods | None = None,
) -> Stranding:
    """A ``Stranding`` configured from ``Settings`` (scheduler and injector
    groups); ``kube`` is the replica's ``hcs_bus.kube.Kube``; ``pending_pods``
    the store its pod watch keeps."""
    cfg = settings.scheduler
    return Stranding(
        kube=kube,
        planner=planner,
        scheduler_name=settings.injector.scheduler_name,
        replica=replica,
        replan_after_s=cfg.replan_after_s,
        scan_s=cfg.stranding_scan_s,
        wake_min_interval_s=cfg.wake_min_interval_s,
        pending_pods=pending_pods,
    )
