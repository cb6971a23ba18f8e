"""What sizes a pod's job, looked up at admission: the Job that owns it (an
Indexed, or any, Job's ranks are a gang of its ``parallelism``) and the
PodGroup it names (coscheduling, Volcano, KAI: its ``minMember``), so a gang
needs no ``hcs.io/job-size`` annotation (``hcs_bus.jobs`` reads them). One
GET per object, kept ``ttl_s``: a job's pods arrive together. Without a
cluster (``hcs up``) nothing is looked up and a pod's size comes from its
annotations alone."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hcs_bus import vocabulary
from hcs_bus.errors import HcsError, KubeNotFound
from hcs_bus.telemetry import logger

_log = logger("hcs.injector.owning")

GetJob = Callable[[str, str], Awaitable[dict[str, Any]]]
GetPodGroup = Callable[[str, str, str, str], Awaitable[dict[str, Any]]]

# How a pod names its PodGroup, and where that PodGroup is served, in
# ``hcs_bus.jobs``' order; a Kueue pod group carries its size on the pod.
POD_GROUPS = (
    (vocabulary.COSCHEDULING_POD_GROUP, "label", vocabulary.COSCHEDULING_API_GROUP, "v1alpha1"),
    (vocabulary.VOLCANO_POD_GROUP, "annotation", vocabulary.VOLCANO_API_GROUP, "v1beta1"),
    (vocabulary.KAI_POD_GROUP, "either", vocabulary.KAI_API_GROUP, "v2alpha2"),
)


def named_pod_group(pod: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """(API group, version, name) of the PodGroup ``pod`` names, if it names
    one that can be looked up (none when a Kueue pod group names its job)."""
    meta = pod.get("metadata") or {}
    labels, notes = meta.get("labels") or {}, meta.get("annotations") or {}
    if labels.get(vocabulary.KUEUE_POD_GROUP):
        return None
    for key, where, group, version in POD_GROUPS:
        name = (
            labels.get(key)
            if where == "label"
            else notes.get(key)
            if where == "annotation"
            else notes.get(key) or labels.get(key)
        )
        if name:
            return group, version, str(name)
    return None


def owning_job(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the batch/v1 Job controlling ``pod``, if one does."""
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or ():
        if (
            isinstance(ref, Mapping)
            and ref.get("controller")
            and ref.get("kind") == "Job"
            and str(ref.get("apiVersion", "")).startswith("batch/")
        ):
            return str(ref.get("name") or ""), str(ref.get("uid") or "")
    return None


class Owners:
    """Owning Jobs by uid and named PodGroups, looked up once and kept ``ttl_s``."""

    def __init__(
        self,
        get_job: GetJob,
        *,
        clock: Callable[[], float],
        get_pod_group: GetPodGroup | None = None,
        ttl_s: float = 60.0,
        size: int = 1024,
    ) -> None:
        self.get_job, self.clock, self.ttl_s, self.size = get_job, clock, ttl_s, size
        self.get_pod_group = get_pod_group
        self._jobs: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()
        self._groups: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()

    async def pod_group_of(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The PodGroup the pod names, or None (names none, gone, or unreadable)."""
        named = named_pod_group(pod)
        if named is None or self.get_pod_group is None:
            return None
        group, version, name = named
        key, now = f"{group}/{namespace}/{name}", self.clock()
        kept = self._groups.get(key)
        if kept is not None and now - kept[0] < self.ttl_s:
            return kept[1]
        try:
            found: dict[str, Any] | None = await self.get_pod_group(group, version, namespace, name)
        except KubeNotFound:
            found = None  # not made yet, or that scheduler not installed
        except HcsError as exc:
            _log.warning("pod_group_unreadable", namespace=namespace, group=key, error=str(exc))
            return None
        self._keep(self._groups, key, (now, found))
        return found

    def _keep(
        self,
        table: OrderedDict[str, tuple[float, dict[str, Any] | None]],
        key: str,
        value: tuple[float, dict[str, Any] | None],
    ) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.size:
            table.popitem(last=False)

    async def job_of(self, namespace: str, pod: Mapping[str, Any]) -> dict[str, Any] | None:
        """The pod's owning Job, or None (no owner, gone, or unreadable: the
        pod is then sized by its annotations, and an unreadable Job is logged)."""
        owner = owning_job(pod)
        if owner is None or not owner[0]:
            return None
        name, uid = owner
        now = self.clock()
        kept = self._jobs.get(uid)
        if kept is not None and now - kept[0] < self.ttl_s:
            return kept[1]
        try:
            job: dict[str, Any] | None = await self.get_job(namespace, name)
        except KubeNotFound:
            job = None
        except HcsError as exc:
            _log.warning("owner_job_unreadable", namespace=namespace, job=name, error=str(exc))
            return None
        if job is not None and ((job.get("metadata") or {}).get("uid") or uid) != uid:
            job = None  # another Job of that name now: not this pod's
        self._keep(self._jobs, uid, (now, job))
        return job
