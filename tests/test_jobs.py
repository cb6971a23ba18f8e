"""One job reader (``hcs_bus.jobs``): every convention that says which pods
form a job, read from pods as the API server returns them; one precedence;
sizes that disagree refused with both values named, by the injector and the
scheduler alike; and the job's name is what every part calls the job."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus import demands, jobs, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import DemandError, JobError
from hcs_bus.jobs import JobIdentity
from healer.bindings import Binding
from healer.requesting import CheckpointAsker
from scheduler.ledger import audit_rules
from scheduler.plan import pods as scheduler_pods

JOB_UID = "5b7c0f2e-3c1a-4e8b-9d61-0f6a2b7e9c11"
JOBSET_UID = "0d3b8a5e-7f21-4c55-a1f2-8e4c1b9d2a77"
GROUP_UID = "c1e0a7d4-9b3f-4f0e-8a2d-6e5b4c3a2f19"


def api_pod(
    name: str = "trainer-0-abcde",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A pod as the API server returns it (GET /api/v1/namespaces/ml/pods/...)."""
    metadata: dict[str, Any] = {
        "name": name,
        "generateName": name.rsplit("-", 1)[0] + "-",
        "namespace": "ml",
        "uid": "9f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b",
        "resourceVersion": "48211",
        "creationTimestamp": "2025-05-14T09:12:44Z",
        "labels": {"app.kubernetes.io/name": "trainer", **(labels or {})},
    }
    if annotations:
        metadata["annotations"] = annotations
    if owners:
        metadata["ownerReferences"] = owners
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {
            "containers": [
                {
                    "name": "trainer",
                    "image": "registry.example/train:1",
                    "resources": {
                        "limits": {"ai.compute/devices": "1"},
                        "requests": {"ai.compute/devices": "1"},
                    },
                }
            ],
            "restartPolicy": "Never",
            "schedulerName": "default-scheduler",
            "priority": 0,
        },
        "status": {"phase": "Pending", "qosClass": "BestEffort"},
    }


def job_owner(name: str = "trainer", uid: str = JOB_UID) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def job_pod(index: int = 2, *, notes: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod of the Indexed Job ``trainer`` as the Job controller creates it."""
    return api_pod(
        f"trainer-{index}-x7k2p",
        labels={
            "batch.kubernetes.io/controller-uid": JOB_UID,
            "batch.kubernetes.io/job-name": "trainer",
            "batch.kubernetes.io/job-completion-index": str(index),
            "controller-uid": JOB_UID,
            "job-name": "trainer",
        },
        annotations={"batch.kubernetes.io/job-completion-index": str(index), **(notes or {})},
        owners=[job_owner()],
    )


def batch_job(parallelism: int | None, completions: int | None, *, indexed: bool) -> dict[str, Any]:
    spec: dict[str, Any] = {"backoffLimit": 6, "suspend": False}
    if parallelism is not None:
        spec["parallelism"] = parallelism
    if completions is not None:
        spec["completions"] = completions
    spec["completionMode"] = "Indexed" if indexed else "NonIndexed"
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "trainer", "namespace": "ml", "uid": JOB_UID},
        "spec": spec,
        "status": {"active": parallelism or 0},
    }


def jobset_pod() -> dict[str, Any]:
    """A pod of JobSet ``llm`` (replicated job ``workers``, child Job ``llm-workers-1``)."""
    jobset = {
        "jobset.sigs.k8s.io/jobset-name": "llm",
        "jobset.sigs.k8s.io/jobset-uid": JOBSET_UID,
        "jobset.sigs.k8s.io/replicatedjob-name": "workers",
        "jobset.sigs.k8s.io/replicatedjob-replicas": "2",
        "jobset.sigs.k8s.io/job-index": "1",
        "jobset.sigs.k8s.io/job-key": "3f2a9c1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f",
    }
    return api_pod(
        "llm-workers-1-0-q9w8e",
        labels={
            **jobset,
            "batch.kubernetes.io/job-name": "llm-workers-1",
            "job-name": "llm-workers-1",
        },
        annotations={**jobset, "batch.kubernetes.io/job-completion-index": "0"},
        owners=[job_owner("llm-workers-1", "7a6b5c4d-3e2f-1a0b-9c8d-7e6f5a4b3c2d")],
    )


def pod_group(api_version: str, name: str, min_member: Any) -> dict[str, Any]:
    return {
        "apiVersion": api_version,
        "kind": "PodGroup",
        "metadata": {"name": name, "namespace": "ml", "uid": GROUP_UID},
        "spec": {"minMember": min_member},
        "status": {"phase": "Pending"},
    }


def identity(**fields: Any) -> JobIdentity:
    return JobIdentity(**{"namespace": "ml", **fields})


KUEUE = {"kueue.x-k8s.io/pod-group-name": "sweep-7", "kueue.x-k8s.io/queue-name": "user-queue"}
KUEUE_COUNT = {"kueue.x-k8s.io/pod-group-total-count": "4"}
COSCHED = {"scheduling.x-k8s.io/pod-group": "nginx-gang"}
VOLCANO = {"scheduling.k8s.io/group-name": "podgroup-6c1f"}
KAI = {"pod-group-name": "pg-trainer-0"}

# name, pod, what the caller looked up, the identity read
CONVENTIONS: list[tuple[str, dict[str, Any], dict[str, Any], JobIdentity | None]] = [
    (
        "hcs.io/job as a label",
        api_pod(labels={"hcs.io/job": "llama"}),
        {},
        identity(name="llama", source="hcs"),
    ),
    (
        "hcs.io/job as an annotation",
        api_pod(annotations={"hcs.io/job": "llama"}),
        {},
        identity(name="llama", source="hcs"),
    ),
    (
        "the hcs.io/job label wins over the annotation",
        api_pod(labels={"hcs.io/job": "label"}, annotations={"hcs.io/job": "annotation"}),
        {},
        identity(name="label", source="hcs"),
    ),
    (
        "an empty hcs.io/job label leaves the annotation",
        api_pod(labels={"hcs.io/job": ""}, annotations={"hcs.io/job": "annotation"}),
        {},
        identity(name="annotation", source="hcs"),
    ),
    (
        "hcs.io/job with its size and elastic bounds",
        api_pod(
            labels={"hcs.io/job": "llama"},
            annotations={"hcs.io/job-size": "8", "hcs.io/job-min": "4", "hcs.io/job-max": "16"},
        ),
        {},
        identity(name="llama", source="hcs", size=8, min_size=4, max_size=16),
    ),
    (
        "a Kueue pod group and its total count",
        api_pod(labels=KUEUE, annotations=KUEUE_COUNT),
        {},
        identity(name="sweep-7", source="kueue", size=4),
    ),
    (
        "a coscheduling pod group, its PodGroup not looked up",
        api_pod(labels=COSCHED),
        {},
        identity(name="nginx-gang", source="coscheduling"),
    ),
    (
        "a coscheduling pod group with its PodGroup's minMember and UID",
        api_pod(labels=COSCHED),
        {"pod_group": pod_group("scheduling.x-k8s.io/v1alpha1", "nginx-gang", 3)},
        identity(name="nginx-gang", source="coscheduling", run=GROUP_UID, min_size=3),
    ),
    (
        "a Volcano pod group with its PodGroup",
        api_pod(annotations=VOLCANO),
        {"pod_group": pod_group("scheduling.volcano.sh/v1beta1", "podgroup-6c1f", 2)},
        identity(name="podgroup-6c1f", source="volcano", run=GROUP_UID, min_size=2),
    ),
    (
        "a Volcano PodGroup with minMember 0 sets no least size",
        api_pod(annotations=VOLCANO),
        {"pod_group": pod_group("scheduling.volcano.sh/v1beta1", "podgroup-6c1f", 0)},
        identity(name="podgroup-6c1f", source="volcano", run=GROUP_UID),
    ),
    (
        "a KAI pod group (annotation) with its PodGroup",
        api_pod(annotations=KAI),
        {"pod_group": pod_group("scheduling.run.ai/v2alpha2", "pg-trainer-0", 4)},
        identity(name="pg-trainer-0", source="kai", run=GROUP_UID, min_size=4),
    ),
    (
        "a KAI pod group given as a label",
        api_pod(labels=KAI),
        {},
        identity(name="pg-trainer-0", source="kai"),
    ),
    (
        "a JobSet: its name, UID as run, replicated job as role, no size from the child Job",
        jobset_pod(),
        {"job": {**batch_job(4, 4, indexed=True), "metadata": {"name": "llm-workers-1"}}},
        identity(name="llm", source="jobset", run=JOBSET_UID, role="workers"),
    ),
    (
        "an Indexed Job, not looked up: its name, UID as run, completion index as rank",
        job_pod(2),
        {},
        identity(name="trainer", source="job", run=JOB_UID, rank=2),
    ),
    (
        "an Indexed Job looked up: its completions as size",
        job_pod(0),
        {"job": batch_job(8, 8, indexed=True)},
        identity(name="trainer", source="job", run=JOB_UID, rank=0, size=8),
    ),
    (
        "a NonIndexed Job: as many pods as its parallelism",
        api_pod(owners=[job_owner()]),
        {"job": batch_job(3, 10, indexed=False)},
        identity(name="trainer", source="job", run=JOB_UID, size=3),
    ),
    (
        "a Job with fewer completions than parallelism runs only that many",
        api_pod(owners=[job_owner()]),
        {"job": batch_job(5, 2, indexed=False)},
        identity(name="trainer", source="job", run=JOB_UID, size=2),
    ),
    (
        "a Job without parallelism runs one pod",
        api_pod(owners=[job_owner()]),
        {"job": batch_job(None, None, indexed=False)},
        identity(name="trainer", source="job", run=JOB_UID, size=1),
    ),
    (
        "a pod of a ReplicaSet belongs to no job",
        api_pod(
            owners=[{**job_owner("web-7d9f", "r-1"), "apiVersion": "apps/v1", "kind": "ReplicaSet"}]
        ),
        {},
        None,
    ),
    (
        "a Job that is an owner but not the controller makes no job",
        api_pod(owners=[{**job_owner(), "controller": False}]),
        {},
        None,
    ),
    ("a bare pod belongs to no job", api_pod(), {}, None),
]


@pytest.mark.parametrize(
    ("pod", "looked_up", "expected"),
    [case[1:] for case in CONVENTIONS],
    ids=[case[0] for case in CONVENTIONS],
)
def test_each_convention_names_the_job_as_its_project_writes_it(
    pod: dict[str, Any], looked_up: dict[str, Any], expected: JobIdentity | None
) -> None:
    assert jobs.read(pod, **looked_up) == expected


# the conventions, most binding first, as labels/annotations/owners on one pod
LAYERS: list[tuple[str, dict[str, Any]]] = [
    ("hcs", {"labels": {"hcs.io/job": "mine"}}),
    ("kueue", {"labels": KUEUE}),
    ("coscheduling", {"labels": COSCHED}),
    ("volcano", {"annotations": VOLCANO}),
    ("kai", {"annotations": KAI}),
    ("jobset", {"labels": {"jobset.sigs.k8s.io/jobset-name": "llm"}}),
    ("job", {"owners": [job_owner()]}),
]


@pytest.mark.parametrize("first", range(len(LAYERS)), ids=[name for name, _ in LAYERS])
def test_the_most_binding_convention_present_names_the_job(first: int) -> None:
    labels: dict[str, str] = {}
    annotations: dict[str, str] = {}
    owners: list[dict[str, Any]] = []
    for _, layer in LAYERS[first:]:
        labels |= layer.get("labels", {})
        annotations |= layer.get("annotations", {})
        owners += layer.get("owners", [])
    found = jobs.read(api_pod(labels=labels, annotations=annotations, owners=owners))
    assert found is not None and found.source == LAYERS[first][0]


def test_keys_name_the_job_and_its_run() -> None:
    found = jobs.read(job_pod(1))
    assert found is not None
    assert found.key == "ml/trainer"
    assert found.run_key == f"ml/trainer/{JOB_UID}"


def test_a_pod_without_a_namespace_yet_takes_the_one_given() -> None:
    pod = api_pod(labels={"hcs.io/job": "llama"})
    del pod["metadata"]["namespace"]
    found = jobs.read(pod, namespace="team-a")
    assert found is not None and found.key == "team-a/llama"


# pod, what the caller looked up, the words the refusal must carry
CONFLICTS: list[tuple[str, dict[str, Any], dict[str, Any], list[str]]] = [
    (
        "hcs.io/job-size against the Kueue group's total count",
        api_pod(
            labels={"hcs.io/job": "llama", **KUEUE},
            annotations={"hcs.io/job-size": "8", **KUEUE_COUNT},
        ),
        {},
        ["hcs.io/job-size says 8", "kueue.x-k8s.io/pod-group-total-count says 4"],
    ),
    (
        "hcs.io/job-size against the owning Job's parallelism",
        job_pod(0, notes={"hcs.io/job-size": "6"}),
        {"job": batch_job(4, 4, indexed=True)},
        ["hcs.io/job-size says 6", "Job trainer parallelism/completions says 4"],
    ),
    (
        "hcs.io/job-min against the PodGroup's minMember",
        api_pod(annotations={**VOLCANO, "hcs.io/job-min": "2"}),
        {"pod_group": pod_group("scheduling.volcano.sh/v1beta1", "podgroup-6c1f", 3)},
        ["hcs.io/job-min says 2", "volcano PodGroup podgroup-6c1f minMember says 3"],
    ),
    (
        "a least size above the size",
        api_pod(labels=KUEUE, annotations={**KUEUE_COUNT, "hcs.io/job-min": "6"}),
        {},
        ["least size 6", "more than its size 4"],
    ),
    (
        "a size above the most size",
        api_pod(
            labels={"hcs.io/job": "x"}, annotations={"hcs.io/job-size": "9", "hcs.io/job-max": "8"}
        ),
        {},
        ["size 9", "most size 8"],
    ),
    (
        "a size that is no number",
        api_pod(labels={"hcs.io/job": "x"}, annotations={"hcs.io/job-size": "eight"}),
        {},
        ["hcs.io/job-size", "'eight'"],
    ),
    (
        "a Kueue total count of zero",
        api_pod(labels=KUEUE, annotations={"kueue.x-k8s.io/pod-group-total-count": "0"}),
        {},
        ["kueue.x-k8s.io/pod-group-total-count", "'0'"],
    ),
    (
        "a size on a pod of no job",
        api_pod(annotations={"hcs.io/job-size": "4"}),
        {},
        ["hcs.io/job-size is set", "no job"],
    ),
    (
        "a PodGroup that is not the pod's",
        api_pod(labels=COSCHED),
        {"pod_group": pod_group("scheduling.x-k8s.io/v1alpha1", "other", 3)},
        ["'other'", "'nginx-gang'"],
    ),
    (
        "a Job that is not the pod's owner",
        job_pod(0),
        {"job": {**batch_job(2, 2, indexed=True), "metadata": {"name": "other", "uid": "u-9"}}},
        ["'other'", "'trainer'"],
    ),
]


@pytest.mark.parametrize(
    ("pod", "looked_up", "words"),
    [case[1:] for case in CONFLICTS],
    ids=[case[0] for case in CONFLICTS],
)
def test_disagreeing_or_unreadable_sizes_are_refused_naming_both_values(
    pod: dict[str, Any], looked_up: dict[str, Any], words: list[str]
) -> None:
    with pytest.raises(JobError) as caught:
        jobs.read(pod, **looked_up)
    for word in words:
        assert word in str(caught.value)
    lenient = jobs.read(pod, lenient=True, **looked_up)
    assert lenient is None or (lenient.size, lenient.min_size, lenient.max_size) == (None,) * 3


def test_admission_and_the_scheduler_refuse_the_same_disagreeing_pod() -> None:
    pod = CONFLICTS[0][1]
    for read in (demands.read, scheduler_pods.pod_info_from_dict):
        with pytest.raises(DemandError, match=r"hcs\.io/job-size says 8.*total-count says 4"):
            read(copy.deepcopy(pod))


def bound_to_a_device(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as it reads once HCS bound it to one device of node gpu-1."""
    bound = copy.deepcopy(pod)
    bound["spec"]["nodeName"] = "gpu-1"
    bound["status"]["phase"] = "Running"
    notes = bound["metadata"].setdefault("annotations", {})
    notes |= {"hcs.io/devices": "GPU-8c1e4f2a", "hcs.io/vram-quota": "0:81920Mi"}
    return bound


@pytest.mark.parametrize(
    ("pod", "name"),
    [
        (api_pod(labels={"hcs.io/job": "llama"}), "llama"),
        (job_pod(3), "trainer"),
        (jobset_pod(), "llm"),
        (api_pod(labels=KUEUE, annotations=KUEUE_COUNT), "sweep-7"),
        (api_pod(), None),
    ],
    ids=["hcs.io/job", "owning Job", "JobSet", "Kueue group", "no job"],
)
def test_every_part_calls_the_job_by_the_same_name(pod: dict[str, Any], name: str | None) -> None:
    demand = demands.read(pod)
    assert demand is not None and demand.policy.job == name
    info = scheduler_pods.pod_info_from_dict(pod)
    assert info.job == name and info.policy.job == name
    claim = audit_rules.claim_of(bound_to_a_device(pod))
    assert claim is not None and claim.job == name


def test_a_placed_pod_keeps_its_job_even_when_its_sizes_disagree() -> None:
    claim = audit_rules.claim_of(bound_to_a_device(CONFLICTS[0][1]))
    assert claim is not None and claim.job == "llama"


# ---------------------------------------------------------------- properties --

KEYS = [
    "hcs.io/job",
    "hcs.io/job-size",
    "hcs.io/job-min",
    "hcs.io/job-max",
    "kueue.x-k8s.io/pod-group-name",
    "kueue.x-k8s.io/pod-group-total-count",
    "scheduling.x-k8s.io/pod-group",
    "scheduling.k8s.io/group-name",
    "pod-group-name",
    "jobset.sigs.k8s.io/jobset-name",
    "jobset.sigs.k8s.io/jobset-uid",
    "jobset.sigs.k8s.io/replicatedjob-name",
    "batch.kubernetes.io/job-completion-index",
]
values = st.one_of(
    st.text(max_size=12),
    st.integers(min_value=-3, max_value=10**12).map(str),
    st.sampled_from(["", " 4 ", "٤", "1e3", "0", "-1", "+2", "00007"]),
)
string_maps = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=8)
odd_values = st.one_of(values, st.none(), st.integers(), st.lists(st.text(), max_size=2))
any_maps = st.one_of(
    string_maps,
    st.dictionaries(st.sampled_from(KEYS), odd_values, max_size=4),
    st.none(),
    st.text(max_size=3),
    st.lists(st.text(), max_size=2),
)
owners = st.lists(
    st.fixed_dictionaries(
        {
            "apiVersion": st.sampled_from(["batch/v1", "apps/v1"]),
            "kind": st.sampled_from(["Job", "ReplicaSet"]),
        },
        optional={
            "name": st.one_of(st.text(max_size=6), st.none()),
            "uid": st.one_of(st.text(max_size=6), st.integers()),
            "controller": st.one_of(st.booleans(), st.none()),
        },
    ),
    max_size=2,
)


@settings(max_examples=400, deadline=None)
@given(labels=any_maps, annotations=any_maps, refs=owners)
def test_any_labels_and_annotations_give_a_job_no_job_or_a_job_error(
    labels: Any, annotations: Any, refs: list[dict[str, Any]]
) -> None:
    pod = {"metadata": {"namespace": "ml", "labels": labels, "annotations": annotations}}
    pod["metadata"]["ownerReferences"] = refs
    try:
        found = jobs.read(pod)
    except JobError as exc:
        assert str(exc)
    else:
        assert found is None or (found.name and found.namespace == "ml")
        for value in (found.size, found.min_size, found.max_size) if found else ():
            assert value is None or value >= 1
    lenient = jobs.read(pod, lenient=True)  # never raises
    assert lenient is None or lenient.name


@settings(max_examples=300, deadline=None)
@given(labels=string_maps, annotations=string_maps, name=st.text(min_size=1, max_size=12))
def test_a_non_empty_hcs_io_job_label_always_names_the_job(
    labels: dict[str, str], annotations: dict[str, str], name: str
) -> None:
    pod = {"metadata": {"labels": {**labels, "hcs.io/job": name}, "annotations": annotations}}
    found = jobs.read(pod, lenient=True)
    assert found is not None and (found.name, found.source) == (name, "hcs")


# ------------------------------------------------------------------- healer --


async def test_a_job_name_no_subject_can_carry_fails_its_checkpoint_not_the_others(
    bus: Bus,
) -> None:
    """Job names from other conventions may hold a dot (a Job or PodGroup name
    is a DNS subdomain); such a job cannot be asked to checkpoint over NATS,
    and the others on the node still are."""
    asked: asyncio.Queue[str] = asyncio.Queue()

    async def on_request(msg: Any) -> None:
        await asked.put(msg.subject)

    sub = await bus.nc.subscribe(subjects.ckpt_request("ml", "ok"), cb=on_request)
    asker = CheckpointAsker(bus, wait_s=0.3, poll_s=0.05)
    victims = [
        Binding("ml", "a-0", "u-a", "gpu-1", frozenset({0}), "train.v2"),
        Binding("ml", "b-0", "u-b", "gpu-1", frozenset({1}), "ok"),
    ]
    result = await asyncio.wait_for(asker.checkpoint_all(victims, reason="test"), timeout=10)
    assert result == {"ml/ok": False, "ml/train.v2": False}
    assert await asyncio.wait_for(asked.get(), timeout=5) == subjects.ckpt_request("ml", "ok")
    await sub.unsubscribe()
