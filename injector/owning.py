"""The Job that owns a pod, looked up at admission so that an Indexed (or
any) Job's ranks are a gang of its ``parallelism`` without an ``hcs.io/job-size``
annotation (``hcs_bus.jobs`` reads it). One GET per Job, kept ``ttl_s``: a
Job's pods arrive together. Without a cluster (``hcs up``) nothing is looked
up and a pod's size comes from its annotations alone."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hcs_bus.errors import HcsError, KubeNotFound
from hcs_bus.telemetry import logger

_log = logger("hcs.injector.owning")

GetJob = Callable[[str, str], Awaitable[dict[str, Any]]]


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
    """Owning Jobs by uid, looked up once and kept ``ttl_s``."""

    def __init__(
        self,
        get_job: GetJob,
        *,
        clock: Callable[[], float],
        ttl_s: float = 60.0,
        size: int = 1024,
    ) -> None:
        self.get_job, self.clock, self.ttl_s, self.size = get_job, clock, ttl_s, size
        self._jobs: OrderedDict[str, tuple[float, dict[str, Any] | None]] = OrderedDict()

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
        self._jobs[uid] = (now, job)
        self._jobs.move_to_end(uid)
        while len(self._jobs) > self.size:
            self._jobs.popitem(last=False)
        return job
