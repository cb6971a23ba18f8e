"""Which job a pod belongs to (pure): the one reader of a pod's job, for the
injector at admission, the scheduler at filter and bind, and the ledger audit.

A training job comes as many pods (ranks). Several projects say which pods
belong together; the first convention below that names a job names it:

=============  ==========================================================
``hcs``        ``hcs.io/job`` label, else annotation
``kueue``      label ``kueue.x-k8s.io/pod-group-name``; size from the
               annotation ``kueue.x-k8s.io/pod-group-total-count``
``coscheduling``  label ``scheduling.x-k8s.io/pod-group`` (scheduler-plugins)
``volcano``    annotation ``scheduling.k8s.io/group-name``
``kai``        annotation ``pod-group-name`` (else a label of that name)
``jobset``     label (else annotation) ``jobset.sigs.k8s.io/jobset-name``;
               run from ``jobset-uid``, role from ``replicatedjob-name``
``job``        the controlling owner of kind ``Job`` (batch/v1): run is its
               UID; rank from ``batch.kubernetes.io/job-completion-index``
=============  ==========================================================

What the pod does not carry the caller may have looked up and pass in: the
owning ``Job`` (its ``parallelism``, capped by ``completions``, is the job's
size when the Job is the job) and the ``PodGroup`` a pod-group convention
names (its ``spec.minMember`` is the job's least size, its UID the run).

Sizes: ``hcs.io/job-size``, ``hcs.io/job-min`` and ``hcs.io/job-max``
(annotations) apply to the job whichever convention names it; every pod-group
convention the pod carries adds its own count. Two counts of one bound that
differ, or bounds out of order (least > size > most), are a ``JobError``
naming both values and where each came from, so admission refuses the pod
with that reason. ``lenient=True`` (for pods already placed, whose job must
still be read) never raises: unreadable or disagreeing counts are left out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

import msgspec

from hcs_bus import vocabulary
from hcs_bus.errors import JobError

__all__ = ["SOURCES", "JobError", "JobIdentity", "Source", "read"]

Source = Literal["hcs", "kueue", "coscheduling", "volcano", "kai", "jobset", "job"]
# the conventions in precedence order: the first that names a job names it
SOURCES: Final[tuple[Source, ...]] = (
    "hcs",
    "kueue",
    "coscheduling",
    "volcano",
    "kai",
    "jobset",
    "job",
)
# the convention of a PodGroup object, by its API group
POD_GROUP_APIS: Final[Mapping[str, Source]] = {
    vocabulary.COSCHEDULING_API_GROUP: "coscheduling",
    vocabulary.VOLCANO_API_GROUP: "volcano",
    vocabulary.KAI_API_GROUP: "kai",
}
_COUNT = re.compile(r"[0-9]{1,9}")  # ASCII digits only; a billion pods is no job


class JobIdentity(msgspec.Struct, frozen=True, kw_only=True):
    """The job a pod belongs to, and what is known of it."""

    namespace: str
    name: str
    run: str = ""  # this run of the job (an owner's UID); "" when unknown
    source: Source  # the convention that named the job
    size: int | None = None  # how many pods the job has
    min_size: int | None = None  # the fewest it runs with (elastic, or a gang's minimum)
    max_size: int | None = None  # the most it runs with (elastic)
    rank: int | None = None  # this pod's index among them
    role: str = ""  # the part of the job this pod plays (a JobSet's replicated job)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def run_key(self) -> str:
        return f"{self.namespace}/{self.name}/{self.run}"


@dataclass(frozen=True, kw_only=True)
class _Named:
    source: Source
    name: str
    run: str = ""
    role: str = ""


@dataclass(frozen=True, kw_only=True)
class _Meta:
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    owner: Mapping[str, Any] | None  # the controlling Job's ownerReference
    lenient: bool

    def first(self, key: str, *, label_first: bool = True) -> str:
        """The label or annotation ``key``; "" when both are absent or empty."""
        pair = (self.labels, self.annotations) if label_first else (self.annotations, self.labels)
        return pair[0].get(key) or pair[1].get(key) or ""


def read(
    pod: Mapping[str, Any],
    *,
    namespace: str | None = None,
    job: Mapping[str, Any] | None = None,
    pod_group: Mapping[str, Any] | None = None,
    lenient: bool = False,
) -> JobIdentity | None:
    """The job ``pod`` (core/v1 Pod JSON) belongs to, or None for a pod of no
    job. ``namespace``, when given, is the pod's (at admission a pod may carry
    none yet); ``job`` is the owning batch/v1 Job and ``pod_group`` the PodGroup
    the pod names, when the caller looked them up. ``JobError`` says what
    disagrees (never raised with ``lenient``)."""
    meta = _meta(pod, lenient=lenient)
    named = _named(meta)
    if named is None:
        _no_job_sizes(meta)
        return None
    size = least = most = None
    try:
        if pod_group is not None:
            named = _with_group_run(named, meta, pod_group)
        size, least, most = _sizes(meta, named, job=job, pod_group=pod_group)
    except JobError:
        if not lenient:
            raise
    return JobIdentity(
        namespace=namespace or _namespace(pod),
        name=named.name,
        run=named.run,
        source=named.source,
        size=size,
        min_size=least,
        max_size=most,
        rank=_rank(meta) if named.source == "job" else None,
        role=named.role,
    )


# ------------------------------------------------------------------ names --


def _named(meta: _Meta) -> _Named | None:
    for source in SOURCES:
        found = _name_by(source, meta)
        if found is not None:
            return found
    return None


def _name_by(source: Source, meta: _Meta) -> _Named | None:
    if source == "jobset":
        name = meta.first(vocabulary.JOBSET_NAME)
        if not name:
            return None
        run = meta.first(vocabulary.JOBSET_UID)
        return _Named(
            source=source, name=name, run=run, role=meta.first(vocabulary.JOBSET_REPLICATED_JOB)
        )
    if source == "job":
        owner = meta.owner
        if owner is None:
            return None
        return _Named(source=source, name=owner["name"], run=str(owner.get("uid") or ""))
    name = _group_name(source, meta)
    return _Named(source=source, name=name) if name else None


def _group_name(source: Source, meta: _Meta) -> str:
    """The name the label/annotation convention ``source`` gives; "" when none."""
    if source == "hcs":
        return meta.first(vocabulary.JOB)
    if source == "kueue":
        return meta.labels.get(vocabulary.KUEUE_POD_GROUP) or ""
    if source == "coscheduling":
        return meta.labels.get(vocabulary.COSCHEDULING_POD_GROUP) or ""
    if source == "volcano":
        return meta.annotations.get(vocabulary.VOLCANO_POD_GROUP) or ""
    if source == "kai":
        return meta.first(vocabulary.KAI_POD_GROUP, label_first=False)
    return ""


def _with_group_run(named: _Named, meta: _Meta, pod_group: Mapping[str, Any]) -> _Named:
    """The run of a job named by the PodGroup passed in: that PodGroup's UID."""
    source, name, uid = _pod_group_of(meta, pod_group)
    if named.source != source or named.name != name or not uid:
        return named
    return _Named(source=named.source, name=named.name, run=uid, role=named.role)


def _pod_group_of(meta: _Meta, pod_group: Mapping[str, Any]) -> tuple[Source, str, str]:
    """The convention, name and UID of the PodGroup passed in; ``JobError``
    unless it is a PodGroup the pod names."""
    api = pod_group.get("apiVersion")
    group = api.split("/", 1)[0] if isinstance(api, str) else ""
    source = POD_GROUP_APIS.get(group)
    if source is None or pod_group.get("kind") != "PodGroup":
        known = ", ".join(sorted(POD_GROUP_APIS))
        raise JobError(f"a PodGroup of {api!r} was passed; known API groups: {known}")
    gmeta = pod_group.get("metadata")
    gmeta = gmeta if isinstance(gmeta, Mapping) else {}
    name = gmeta.get("name")
    named = _group_name(source, meta)
    if not named or named != name:
        raise JobError(
            f"the {source} PodGroup {name!r} passed is not the pod's (the pod names {named!r})"
        )
    uid = gmeta.get("uid")
    return source, named, uid if isinstance(uid, str) else ""


# ------------------------------------------------------------------ sizes --


class _Figures:
    """Every count given for each bound, with where it came from."""

    def __init__(self) -> None:
        self.given: dict[str, list[tuple[int, str]]] = {"size": [], "min": [], "max": []}

    def add(self, bound: str, value: int | None, where: str) -> None:
        if value is not None:
            self.given[bound].append((value, where))

    def one(self, bound: str) -> int | None:
        found = self.given[bound]
        for value, where in found[1:]:
            if value != found[0][0]:
                first, there = found[0]
                raise JobError(
                    f"the job's {_BOUND_WORDS[bound]} disagree: {there} says {first}, "
                    f"{where} says {value}"
                )
        return found[0][0] if found else None

    def where(self, bound: str) -> str:
        return self.given[bound][0][1]


_BOUND_WORDS: Final = {"size": "sizes", "min": "least sizes", "max": "most sizes"}
_BOUND_WORD: Final = {"size": "size", "min": "least size", "max": "most size"}


def _sizes(
    meta: _Meta,
    named: _Named,
    *,
    job: Mapping[str, Any] | None,
    pod_group: Mapping[str, Any] | None,
) -> tuple[int | None, int | None, int | None]:
    figures = _Figures()
    notes = meta.annotations
    for bound, key in (
        ("size", vocabulary.JOB_SIZE),
        ("min", vocabulary.JOB_MIN),
        ("max", vocabulary.JOB_MAX),
    ):
        figures.add(bound, _count(notes.get(key), where=key), key)
    if meta.labels.get(vocabulary.KUEUE_POD_GROUP):
        key = vocabulary.KUEUE_POD_GROUP_TOTAL
        figures.add("size", _count(notes.get(key), where=key), key)
    if pod_group is not None:
        source, name, _ = _pod_group_of(meta, pod_group)
        figures.add("min", _min_member(pod_group, source), f"{source} PodGroup {name} minMember")
    if job is not None:
        _check_owner(meta, job)
        if named.source == "job":
            figures.add("size", _job_size(job), f"Job {named.name} parallelism/completions")
    size, least, most = figures.one("size"), figures.one("min"), figures.one("max")
    for low, high, lo_value, hi_value in (
        ("min", "size", least, size),
        ("size", "max", size, most),
        ("min", "max", least, most),
    ):
        if lo_value is not None and hi_value is not None and lo_value > hi_value:
            raise JobError(
                f"the job's {_BOUND_WORD[low]} {lo_value} ({figures.where(low)}) is more "
                f"than its {_BOUND_WORD[high]} {hi_value} ({figures.where(high)})"
            )
    return size, least, most


def _no_job_sizes(meta: _Meta) -> None:
    """A size annotation on a pod of no job is a mistake worth refusing."""
    if meta.lenient:
        return
    for key in (vocabulary.JOB_SIZE, vocabulary.JOB_MIN, vocabulary.JOB_MAX):
        if key in meta.annotations:
            raise JobError(
                f"{key} is set but the pod belongs to no job: name it with {vocabulary.JOB}"
            )


def _count(text: str | None, *, where: str) -> int | None:
    """A count of pods written as an annotation; None when absent."""
    if text is None:
        return None
    value = text.strip()
    if _COUNT.fullmatch(value) is None or int(value) < 1:
        raise JobError(f"{where}: {text!r} is not a number of pods (a whole number, 1 or more)")
    return int(value)


def _min_member(pod_group: Mapping[str, Any], source: Source) -> int | None:
    spec = pod_group.get("spec")
    found = spec.get("minMember") if isinstance(spec, Mapping) else None
    if found is None or found == 0:  # no least size: the group is no gang
        return None
    if not isinstance(found, int) or isinstance(found, bool) or found < 0:
        raise JobError(f"the {source} PodGroup's spec.minMember {found!r} is not a number of pods")
    return found


def _job_size(job: Mapping[str, Any]) -> int | None:
    """How many pods of a Job run at once: ``parallelism`` (1 when unset),
    never more than ``completions``; None for a Job that runs none."""
    spec = job.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    parallelism = spec.get("parallelism", 1)
    completions = spec.get("completions")
    for field, value in (("parallelism", parallelism), ("completions", completions)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise JobError(f"the Job's spec.{field} {value!r} is not a number of pods")
    size = parallelism if completions is None else min(parallelism or 0, completions)
    return size if size else None


def _check_owner(meta: _Meta, job: Mapping[str, Any]) -> None:
    """``JobError`` unless ``job`` is the Job that controls the pod."""
    jmeta = job.get("metadata")
    jmeta = jmeta if isinstance(jmeta, Mapping) else {}
    owner = meta.owner
    name, uid = jmeta.get("name"), jmeta.get("uid")
    if owner is None:
        raise JobError(f"the Job {name!r} passed does not control the pod (it has no Job owner)")
    if owner["name"] != name or (owner.get("uid") and uid and owner["uid"] != uid):
        raise JobError(
            f"the Job {name!r} (uid {uid!r}) passed is not the pod's owner "
            f"{owner['name']!r} (uid {owner.get('uid')!r})"
        )


def _rank(meta: _Meta) -> int | None:
    text = meta.first(vocabulary.JOB_COMPLETION_INDEX, label_first=False)
    if not text:
        return None
    if _COUNT.fullmatch(text) is None:
        if meta.lenient:
            return None
        raise JobError(f"{vocabulary.JOB_COMPLETION_INDEX}: {text!r} is not an index")
    return int(text)


# --------------------------------------------------------------- the pod --


def _meta(pod: Mapping[str, Any], *, lenient: bool) -> _Meta:
    metadata = pod.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    return _Meta(
        labels=_strings(metadata, "labels", lenient=lenient),
        annotations=_strings(metadata, "annotations", lenient=lenient),
        owner=_controlling_job(metadata.get("ownerReferences")),
        lenient=lenient,
    )


def _strings(metadata: Mapping[str, Any], part: str, *, lenient: bool) -> Mapping[str, str]:
    found = metadata.get(part)
    if found is None:
        return {}
    if isinstance(found, Mapping) and all(
        isinstance(k, str) and isinstance(v, str) for k, v in found.items()
    ):
        return found
    if lenient:
        return {}
    raise JobError(f"metadata.{part} must map strings to strings")


def _controlling_job(refs: Any) -> Mapping[str, Any] | None:
    """The pod's controlling ownerReference when it is a batch/v1 Job."""
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if (
            isinstance(ref, Mapping)
            and ref.get("controller") is True
            and ref.get("kind") == "Job"
            and ref.get("apiVersion") == "batch/v1"
            and isinstance(ref.get("name"), str)
            and ref["name"]
        ):
            return ref
    return None


def _namespace(pod: Mapping[str, Any]) -> str:
    metadata = pod.get("metadata")
    found = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return found if isinstance(found, str) and found else "default"
