"""What the scheduler reads from a pod: its ``ai.compute/*`` requests, its
policy annotations, its job, its priority and the ``hcs.io/plan`` annotation
the injector writes. Pure: decodes API JSON, no I/O. Requests and policy are
read by ``hcs_bus.demands``, the parser the injector uses at admission, so
both parts see the same demand in every pod; the job is the policy's, read by
``hcs_bus.jobs`` (``hcs.io/job``, pod groups, JobSet, the owning Job).

The ``hcs.io/plan`` annotation (written by the injector, read at filter and
bind) is ``hcs_bus.plannotes.PlanNote``, decoded strictly; here it is also
called ``PlanAnnotation``, the demand a bind reserves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from hcs_bus import demands, plannotes, vocabulary
from hcs_bus.messages import PodRef, Policy, Requests

RESOURCE_PREFIX = demands.COMPUTE
PLAN_ANNOTATION = vocabulary.PLAN
DEVICES_ANNOTATION = vocabulary.DEVICES
VRAM_QUOTA_ANNOTATION = vocabulary.VRAM_QUOTA
RESUME_ANNOTATION = vocabulary.RESUME_FROM


# A pod whose HCS requests or annotations cannot be understood.
BadPod = demands.DemandError


# The ``hcs.io/plan`` annotation: what the injector decided at admission.
PlanAnnotation = plannotes.PlanNote


# ---------------------------------------------------------------- the pod --


class _Owner(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    name: str = ""
    uid: str = ""
    controller: bool | None = None


class _Meta(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    owner_references: list[_Owner] | None = None


class _Container(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    resources: dict[str, Any] | None = None  # read by ``hcs_bus.demands``


class _Preferred(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """An affinity kind; only whether it has preferred terms is read."""

    preferred_during_scheduling_ignored_during_execution: list[Any] | None = None


class _Affinity(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    node_affinity: _Preferred | None = None
    pod_affinity: _Preferred | None = None
    pod_anti_affinity: _Preferred | None = None


class _Spread(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    when_unsatisfiable: str = ""


class _Spec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    containers: list[_Container] = []
    init_containers: list[_Container] = []
    priority: int | None = None
    node_name: str | None = None
    affinity: _Affinity | None = None
    topology_spread_constraints: list[_Spread] | None = None


# owners whose pods kube-scheduler's default topology spreading scores
SPREAD_OWNERS = frozenset({"ReplicaSet", "StatefulSet", "ReplicationController"})


class PodObject(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a core/v1 Pod we read (decoded leniently: it is the API's)."""

    metadata: _Meta = _Meta()
    spec: _Spec = _Spec()


class PodInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A pod reduced to what placing needs."""

    ref: PodRef
    requests: Requests | None
    policy: Policy
    annotation: PlanAnnotation | None
    priority: int
    job: str | None
    traceparent: str | None = None  # the admission's trace (hcs.io/traceparent)
    pledge: str = ""  # the admission's pledge in the ledger (hcs.io/pledge)
    # kube-scheduler's scoring has a say for this pod: it has preferred
    # (anti-)affinity terms or ScheduleAnyway spread constraints, or an owner
    # that default spreading applies to (``kube_prefers``)
    kube_scores: bool = True
    run: str = ""  # the job's run (``hcs_bus.jobs``: its owner's UID); "" when unknown
    resume_run: str = ""  # the run whose checkpoint it resumes (hcs.io/resume-run)
    gang: bool = False  # a member of a gang (``hcs.io/gang``): its job binds as one

    @property
    def wants_devices(self) -> bool:
        return self.annotation is not None or self.requests is not None


def pod_info(pod: PodObject) -> PodInfo:
    """Read a pod; ``BadPod`` names the field that is wrong."""
    meta = pod.metadata
    annotations = meta.annotations or {}
    labels = meta.labels or {}
    owners = [msgspec.to_builtins(o) for o in meta.owner_references or []]
    # the job as the policy reads it is the job the injector read at
    # admission: its run comes from that one read
    policy, job = demands.read_policy_and_job(annotations, labels=labels, owner_references=owners)
    return PodInfo(
        ref=PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid),
        requests=requests_of(pod),
        policy=policy,
        annotation=plan_annotation(annotations),
        priority=pod.spec.priority or 0,
        job=policy.job,
        traceparent=annotations.get(vocabulary.TRACEPARENT),
        pledge=annotations.get(vocabulary.PLEDGE, ""),
        kube_scores=kube_prefers(pod),
        run=job.run if job is not None else "",
        resume_run=annotations.get(vocabulary.RESUME_RUN, "").strip(),
        gang=bool(annotations.get(vocabulary.GANG)),
    )


def kube_prefers(pod: PodObject) -> bool:
    """Whether kube-scheduler's own scoring expresses a preference of ``pod``
    that HCS's ranking does not: preferred node or pod (anti-)affinity terms,
    ``ScheduleAnyway`` topology spread constraints, or an owner whose pods the
    default topology spreading spreads (ReplicaSet, StatefulSet,
    ReplicationController). Taints are not among them: HCS's ranking already
    weighs the device health the healer's ``PreferNoSchedule`` taint stands for."""
    spec, owners = pod.spec, pod.metadata.owner_references or []
    if any(o.kind in SPREAD_OWNERS for o in owners):
        return True
    if any(
        c.when_unsatisfiable == "ScheduleAnyway" for c in spec.topology_spread_constraints or []
    ):
        return True
    found = spec.affinity
    if found is None:
        return False
    kinds = (found.node_affinity, found.pod_affinity, found.pod_anti_affinity)
    return any(
        k is not None and k.preferred_during_scheduling_ignored_during_execution for k in kinds
    )


def pod_info_from_dict(pod: dict[str, Any]) -> PodInfo:
    try:
        return pod_info(msgspec.convert(pod, PodObject, strict=False))
    except msgspec.ValidationError as exc:
        raise BadPod(f"pod is not a core/v1 Pod: {exc}") from exc


def plan_annotation(annotations: dict[str, str]) -> PlanAnnotation | None:
    text = annotations.get(PLAN_ANNOTATION)
    if text is None:
        return None
    try:
        value = plannotes.decode(text)
    except msgspec.MsgspecError as exc:
        raise BadPod(f"annotation {PLAN_ANNOTATION} is invalid: {exc}") from exc
    if value.devices < 1 or value.vram_mib_per_device < 0:
        raise BadPod(f"annotation {PLAN_ANNOTATION}: devices must be >= 1, VRAM >= 0")
    return value


# Requests read from containers' resources, by the JSON of the init and the
# regular containers' resources (what alone decides them: names only appear
# in refusals, which are not kept; the resources were decoded from JSON, so
# two that encode alike are alike). A cluster runs few distinct shapes; the
# table is emptied when it reaches KNOWN_REQUESTS_MAX.
KNOWN_REQUESTS_MAX = 4096
_KNOWN_REQUESTS: dict[bytes, Requests | None] = {}
_RESOURCES = msgspec.json.Encoder()


def requests_of(pod: PodObject) -> Requests | None:
    """The pod's ``ai.compute/*`` requests as ``hcs_bus.demands`` reads them (as
    the injector did at admission); None when the pod asks for none.

    The pods of one workload ask alike: the requests read from each set of
    containers' resources are remembered (``_KNOWN_REQUESTS``, by their
    JSON), so a pod asking as another did is not read again; a refusal is
    not remembered, so every pod that earns one gets it, naming its own
    container."""
    key = _RESOURCES.encode(
        (
            [c.resources for c in pod.spec.init_containers],
            [c.resources for c in pod.spec.containers],
        )
    )
    try:
        return _KNOWN_REQUESTS[key]
    except KeyError:
        pass
    found = [
        (demands.ContainerRef(field, i, c.name), {"resources": c.resources})
        for field, items in (
            ("initContainers", pod.spec.init_containers),
            ("containers", pod.spec.containers),
        )
        for i, c in enumerate(items)
    ]
    asked = demands.read_requests(found)
    requests = asked.requests if asked is not None else None
    if len(_KNOWN_REQUESTS) >= KNOWN_REQUESTS_MAX:
        _KNOWN_REQUESTS.clear()
    _KNOWN_REQUESTS[key] = requests
    return requests


def policy_of(
    annotations: dict[str, str],
    *,
    labels: dict[str, str] | None = None,
    owner_references: Sequence[Mapping[str, Any]] = (),
) -> Policy:
    return demands.read_policy(annotations, labels=labels, owner_references=owner_references)
