"""Stranded and parked pods: which pending HCS pods to wake, which to re-plan
(docs/architecture.md#flow-of-a-pod). Pure: API JSON and a class summary in, decisions out; time is
an injected ``now`` (the event loop's clock in the service, ``stranding``).

A *pending HCS pod* runs under the HCS scheduler profile, carries the
injector's ``hcs.io/plan`` note and is neither bound nor being deleted. Its
vendor/model class was fixed at admission (a required node affinity), so:

- **stranded**: no node of its class can hold it now while the plan it would
  get today (same requests, same policy) names another class with room. Once
  that has held for ``replan_after_s`` without a break, the pod is re-planned:
  one with a controller (ReplicaSet, Job, StatefulSet, …) is evicted so its
  owner re-creates it and the new pod is admitted afresh; a bare pod gets an
  Event and the ``HCSStranded`` condition (nothing re-creates it for us),
  unless it asks for ``hcs.io/replan: recreate``: then it is deleted and
  created again from the copy the injector kept of it as submitted
  (``hcs.io/submitted``; ``recreation`` builds the new pod).
- **gang members** (``hcs.io/gang``) are never re-planned one by one: the
  ranks of one job must share a class. A gang still waiting (its record
  ``pinned``, nothing pledged) whose pinned class cannot hold it whole while
  another class can is *moved* (``gang_move``), only when its policy's
  ``substitution`` is ``allow``: its record is pinned to the new class, then
  every member is evicted or re-created (as above) and admitted again on it.
  A gang with a bare member that cannot be re-created is not moved at all.
- **parked**: kube-scheduler keeps a pod whose extender call failed in its
  unschedulable queue until a pod or node update event or a 5-minute flush.
  After the scheduler becomes ready, and whenever a class gains free
  capacity, its pending pods are *woken*: a changed ``hcs.io/wake`` note is
  an update event, so kube-scheduler tries them again at once.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, TypeVar

from hcs_bus import vocabulary
from hcs_bus.messages import Plan, PlanRequest, PodRef, Policy, Requests
from hcs_bus.profiles import ProfileDB
from scheduler.ledger.pledge_rules import Held
from scheduler.plan import gang_records as gangs
from scheduler.plan import gang_rules as ganging
from scheduler.plan import rules as planning
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.pods import BadPod, PlanAnnotation, pod_info_from_dict
from scheduler.view.state import ClusterState

CONDITION = "HCSStranded"
EVENT_REASON = "HCSStranded"
FAILED_REASON = "HCSRecreateFailed"
Action = Literal["evict", "recreate", "report"]


@dataclass(frozen=True, slots=True)
class Pending:
    """A pending HCS pod, reduced to what these rules need."""

    ref: PodRef
    plan: PlanAnnotation
    requests: Requests | None
    policy: Policy
    owner: str | None  # "ReplicaSet/web-5d8f" for a pod with a controller
    recreate: bool = False  # asks for hcs.io/replan: recreate and has its copy
    gang: str = ""  # its gang's record key (``hcs.io/gang``); "" for a pod of none
    gated: bool = False  # held by a scheduling gate: kube-scheduler does not queue it


@dataclass(frozen=True, slots=True)
class Stranded:
    pod: Pending
    target: str  # the class with room that a new plan names
    reason: str

    @property
    def action(self) -> Action:
        return action_of(self.pod)

    @property
    def key(self) -> str:
        return uid_key(self.pod.ref)


def action_of(pod: Pending) -> Action:
    """How a pod is planned afresh: evicted (its controller re-creates it),
    re-created as submitted, or only told (a bare pod)."""
    if pod.owner:
        return "evict"
    return "recreate" if pod.recreate else "report"


def pending(pod: dict[str, Any], *, scheduler_name: str) -> Pending | None:
    """``pod`` as a pending HCS pod, or None (not ours, bound, going, unreadable)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    if spec.get("schedulerName") != scheduler_name or spec.get("nodeName"):
        return None
    if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase", "Pending") != (
        "Pending"
    ):
        return None
    try:
        info = pod_info_from_dict(pod)
    except BadPod:
        return None
    if info.annotation is None:
        return None
    return Pending(
        ref=info.ref,
        plan=info.annotation,
        requests=info.requests,
        policy=info.policy,
        owner=controller(meta),
        recreate=recreatable(meta),
        gang=gangs.gang_key_of(pod),
        gated=bool(spec.get("schedulingGates")),
    )


def recreatable(meta: dict[str, Any]) -> bool:
    """The pod asks to be re-created when stranded and carries its copy."""
    notes = meta.get("annotations") or {}
    return (
        notes.get(vocabulary.REPLAN) == vocabulary.REPLAN_RECREATE and vocabulary.SUBMITTED in notes
    )


def recreation(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod to create in place of ``pod``, as its user submitted it: name,
    namespace and labels of ``pod``; its annotations less every ``hcs.io/*``
    one, plus the user's ``hcs.io/*`` ones as submitted; the submitted spec.
    None when ``pod`` holds no readable copy."""
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    try:
        kept = json.loads(notes.get(vocabulary.SUBMITTED) or "null")
    except ValueError:
        return None
    if not isinstance(kept, dict) or not isinstance(kept.get("spec"), dict):
        return None
    own = kept.get("annotations")
    annotations = {k: v for k, v in notes.items() if not k.startswith(vocabulary.PREFIX)}
    if isinstance(own, dict):
        annotations |= {k: str(v) for k, v in own.items() if str(k).startswith(vocabulary.PREFIX)}
    new_meta: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace")}
    if meta.get("labels"):
        new_meta["labels"] = dict(meta["labels"])
    if annotations:
        new_meta["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": new_meta, "spec": kept["spec"]}


def controller(meta: dict[str, Any]) -> str | None:
    """``Kind/name`` of the pod's controlling owner, or None for a bare pod."""
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind"):
            return f"{ref['kind']}/{ref.get('name', '')}"
    return None


def _sizing(plan: PlanAnnotation) -> planning.Sizing:
    return planning.Sizing(
        plan.devices, plan.vram_mib_per_device, plan.whole_device, plan.acu_per_device, 0.0, ""
    )


def fits_class(plan: PlanAnnotation, summary: planning.Summary) -> bool:
    """Some node of the pod's planned class can hold it now."""
    stats = summary.classes.get(plan.key)
    return stats is not None and planning.has_room(stats, _sizing(plan))


def request_of(pod: Pending) -> PlanRequest | None:
    """The dry-run plan request a stranded check asks for ``pod``: only when it
    has requests to plan from and is no gang member (``gang_move`` moves those)."""
    if pod.requests is None or pod.gang:
        return None
    return PlanRequest(
        namespace=pod.ref.namespace,
        requests=pod.requests,
        policy=pod.policy,
        pod_name=pod.ref.name,
        dry_run=True,
    )


def stranded(pod: Pending, *, fresh: Plan, summary: planning.Summary) -> Stranded | None:
    """Whether ``pod`` is stranded now: no node of its class can hold it, and
    ``fresh`` (the plan its requests and policy get today) names another class
    where a node has room. A gang member never is: its gang moves whole or not at all."""
    if pod.gang or fits_class(pod.plan, summary):
        return None
    target = f"{fresh.vendor}/{fresh.model}"
    if not fresh.ok or not fresh.vendor or target == pod.plan.key:
        return None
    stats = summary.classes.get(target)
    sizing = planning.Sizing(
        fresh.devices, fresh.vram_mib_per_device, fresh.whole_device, 0.0, 0.0, ""
    )
    if stats is None or not planning.has_room(stats, sizing):
        return None
    reason = (
        f"no {pod.plan.key} node can hold {pod.plan.devices} device(s) of "
        f"{pod.plan.vram_mib_per_device} MiB while {target} has room"
    )
    return Stranded(pod=pod, target=target, reason=reason)


@dataclass(frozen=True, slots=True)
class GangMove:
    """A waiting gang to pin to ``vendor/model`` and admit again, every member."""

    record: GangRecord
    members: tuple[Pending, ...]
    vendor: str
    model: str
    reason: str

    @property
    def key(self) -> str:
        return self.record.key

    @property
    def target(self) -> str:
        return f"{self.vendor}/{self.model}"

    def stranded(self) -> list[Stranded]:
        """One re-planning per member (those not admitted on the new class yet)."""
        return [
            Stranded(pod=m, target=self.target, reason=self.reason)
            for m in self.members
            if m.plan.key != self.target
        ]


def gang_move(
    record: GangRecord,
    members: Iterable[Pending],
    *,
    state: ClusterState,
    held: Mapping[str, Held],
    profiles: ProfileDB | None = None,
) -> GangMove | None:
    """Whether a waiting gang moves, whole, to another class: its record is
    ``pinned``, its policy allows substitution, its pinned class cannot hold
    the whole gang now (``plan_gang``), another class can, and every member
    present can be admitted again (evicted for its controller, or re-created).
    ``state`` and ``held`` count what other gangs' pledged ranks take."""
    found = tuple(members)
    policy = record.policy or Policy()
    if record.state != "pinned" or record.requests is None or not found:
        return None
    if policy.substitution != "allow" or any(action_of(m) == "report" for m in found):
        return None
    gang = gangs.gang_of(record.key, size=record.fewest, requests=record.requests, policy=policy)
    here = gangs.pinned_to(gang, vendor=record.vendor, model=record.model)
    if ganging.plan_gang(state, here, held=held, profiles=profiles).ok:
        return None  # it fits where it is pinned: the gang loop pledges it
    fresh = ganging.plan_gang(state, gang, held=held, profiles=profiles)
    if not fresh.ok:
        return None
    for key in fresh.classes:
        vendor, _, model = key.partition("/")
        if key == record.class_key:
            continue
        there = gangs.pinned_to(gang, vendor=vendor, model=model)
        if ganging.plan_gang(state, there, held=held, profiles=profiles).ok:
            reason = (
                f"gang {record.namespace}/{record.job}: {record.class_key} cannot hold its "
                f"{record.fewest} ranks while {key} can (substitution: allow); every member is "
                "planned again there"
            )
            return GangMove(record=record, members=found, vendor=vendor, model=model, reason=reason)
    return None


def by_gang(pods: Iterable[Pending]) -> tuple[list[Pending], dict[str, list[Pending]]]:
    """The pods of no gang, and the gang members by their gang's record key."""
    alone: list[Pending] = []
    members: dict[str, list[Pending]] = {}
    for pod in pods:
        if pod.gang:
            members.setdefault(pod.gang, []).append(pod)
        else:
            alone.append(pod)
    return alone, members


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...


K = TypeVar("K", bound=_Keyed)


@dataclass(slots=True)
class Clock:
    """Since when each pod has been stranded without a break (loop time), and
    which were re-planned already (each is acted on once per stranding)."""

    since: dict[str, float] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def due(self, found: Iterable[K], *, now: float, after_s: float) -> list[K]:
        """The stranded pods (or gangs) whose deadline has passed and that were
        not acted on; one no longer stranded starts again from zero next time."""
        seen: dict[str, float] = {}
        out: list[K] = []
        for item in found:
            key = item.key
            seen[key] = self.since.get(key, now)
            if now - seen[key] >= after_s and key not in self.done:
                out.append(item)
        self.since = seen
        self.done &= set(seen)
        return out

    def acted(self, item: _Keyed) -> None:
        self.done.add(item.key)


def uid_key(ref: PodRef) -> str:
    return ref.uid or f"{ref.namespace}/{ref.name}"


def capacity(summary: planning.Summary) -> dict[str, tuple[int, int, tuple[int, ...]]]:
    """Per class: free MiB, most idle devices on one node, best free per k-th device."""
    return {
        key: (s.free_mib, s.max_idle_per_node, tuple(s.kth_free))
        for key, s in summary.classes.items()
    }


def freed(
    before: dict[str, tuple[int, int, tuple[int, ...]]] | None,
    after: dict[str, tuple[int, int, tuple[int, ...]]],
) -> set[str] | None:
    """Classes whose capacity grew between two ``capacity`` readings (a class
    new to the view counts); None (every class) when there is no earlier one."""
    if before is None:
        return None
    out: set[str] = set()
    for key, (free, idle, kth) in after.items():
        old = before.get(key)
        if old is None or free > old[0] or idle > old[1] or _grew(old[2], kth):
            out.add(key)
    return out


def planned(records: Iterable[GangRecord]) -> dict[str, int]:
    """Per class, the devices of the ranks pledged gangs hold, booked or not:
    the extender keeps a rank's room for it until its gang's record drops
    the rank or goes, whether or not its pod still holds a reservation."""
    out: dict[str, int] = {}
    for record in records:
        if record.state != "pledged":
            continue
        for r in record.ranks:
            out[r.pledge.key] = out.get(r.pledge.key, 0) + r.pledge.devices
    return out


def unplanned(before: dict[str, int] | None, after: dict[str, int]) -> set[str]:
    """Classes where pledged gangs hold fewer ranks than before (a gang
    released, shrunk or moved): the room they kept may be free to others
    now, though no device was freed then (its pods may have gone before)."""
    if before is None:
        return set()
    return {key for key, devices in before.items() if after.get(key, 0) < devices}


def _grew(old: tuple[int, ...], new: tuple[int, ...]) -> bool:
    return len(new) > len(old) or any(n > o for o, n in zip(old, new, strict=False))


@dataclass(slots=True)
class Waker:
    """Which pending pods to wake: those of a class that gained room (all after
    a restart), each at most once per ``min_interval_s``."""

    min_interval_s: float
    last: dict[str, float] = field(default_factory=dict)

    def pick(
        self, pods: Iterable[Pending], *, classes: set[str] | None, now: float
    ) -> list[Pending]:
        out: list[Pending] = []
        alive: dict[str, float] = {}
        for pod in pods:
            key = uid_key(pod.ref)
            if key in self.last:
                alive[key] = self.last[key]
            if classes is not None and pod.plan.key not in classes:
                continue
            if key in alive and now - alive[key] < self.min_interval_s:
                continue
            alive[key] = now
            out.append(pod)
        self.last = alive
        return out


def event_name(ref: PodRef) -> str:
    """One name per pod incarnation: a second replica's create is a 409."""
    return f"{ref.name}.hcs-stranded.{(ref.uid or 'pod')[:8]}"


def condition(item: Stranded, *, now_iso: str) -> dict[str, Any]:
    """The pod condition a bare stranded pod gets."""
    return {
        "type": CONDITION,
        "status": "True",
        "reason": "ClassFull",
        "message": f"{item.reason}; delete and re-create the pod to be planned again",
        "lastTransitionTime": now_iso,
    }


def event(item: Stranded, *, now_iso: str, reporter: str) -> dict[str, Any]:
    """A core/v1 Event on the pod, named so two replicas write it once."""
    ref = item.pod.ref
    action = {
        "evict": f"evicted so {item.pod.owner} re-creates it and it is planned afresh",
        "recreate": (
            f"deleted and created again as submitted ({vocabulary.REPLAN}: "
            f"{vocabulary.REPLAN_RECREATE}) so it is planned afresh"
        ),
        "report": "a bare pod: delete and re-create it to be planned again",
    }[item.action]
    return _event(
        ref,
        reason=EVENT_REASON,
        message=f"{item.reason}: {action}",
        now_iso=now_iso,
        reporter=reporter,
        name=event_name(ref),
    )


def failed_event(ref: PodRef, *, error: str, now_iso: str, reporter: str) -> dict[str, Any]:
    """A core/v1 Event on the deleted pod: its copy could not be created."""
    message = (
        f"deleted to be re-created as submitted, but creating it again failed: {error}; "
        "the pod as submitted is in the hcs-scheduler log (event pod_recreating)"
    )
    name = f"{ref.name}.hcs-recreate-failed.{(ref.uid or 'pod')[:8]}"
    return _event(
        ref, reason=FAILED_REASON, message=message, now_iso=now_iso, reporter=reporter, name=name
    )


def _event(
    ref: PodRef, *, reason: str, message: str, now_iso: str, reporter: str, name: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name, "namespace": ref.namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": ref.namespace,
            "name": ref.name,
            "uid": ref.uid,
        },
        "type": "Warning",
        "reason": reason,
        "message": message,
        "source": {"component": reporter},
        "reportingComponent": reporter,
        "firstTimestamp": now_iso,
        "lastTimestamp": now_iso,
        "count": 1,
    }
