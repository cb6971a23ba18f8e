"""The owning Job sizes a gang at admission: an Indexed Job's ranks are one
gang of its parallelism without any HCS annotation."""

from __future__ import annotations

from typing import Any

from hcs_bus.errors import BusUnavailable, KubeNotFound
from injector.admitting import GangOf, gang_of
from injector.owning import Owners, owning_job

UID = "0f6c-4e"


def _pod(index: int, *, owner_uid: str = UID) -> dict[str, Any]:
    return {
        "metadata": {
            "generateName": "train-",
            "annotations": {"batch.kubernetes.io/job-completion-index": str(index)},
            "labels": {"batch.kubernetes.io/job-name": "train"},
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": "train",
                    "uid": owner_uid,
                    "controller": True,
                }
            ],
        }
    }


def _job(*, parallelism: int, uid: str = UID) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "train", "namespace": "ml", "uid": uid},
        "spec": {
            "parallelism": parallelism,
            "completions": parallelism,
            "completionMode": "Indexed",
        },
    }


async def test_the_ranks_of_an_indexed_job_are_one_gang_of_its_parallelism_read_once() -> None:
    asked: list[tuple[str, str]] = []

    async def get_job(namespace: str, name: str) -> dict[str, Any]:
        asked.append((namespace, name))
        return _job(parallelism=12)

    owners = Owners(get_job, clock=lambda: 100.0)
    gangs = set()
    for i in range(12):
        job = await owners.job_of("ml", _pod(i))
        gangs.add(gang_of(_pod(i), namespace="ml", job=job))
    assert gangs == {GangOf(f"ml/train/{UID}", 12)}  # a fixed gang: no least size
    assert asked == [("ml", "train")]  # one GET for the twelve ranks
    assert gang_of(_pod(0), namespace="ml") is None  # unsized without the Job: no gang


async def test_a_job_gone_replaced_or_unreadable_sizes_nothing() -> None:
    answers: list[Any] = [
        KubeNotFound("gone"),
        _job(parallelism=4, uid="other"),
        BusUnavailable("down"),
    ]

    async def get_job(namespace: str, name: str) -> dict[str, Any]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return dict(answer)

    for uid in ("u1", "u2", "u3"):
        owners = Owners(get_job, clock=lambda: 0.0)
        assert await owners.job_of("ml", _pod(0, owner_uid=uid)) is None
    assert owning_job({"metadata": {"ownerReferences": [{"kind": "ReplicaSet"}]}}) is None


def _grouped(**where: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": "w-0", **where}}


async def test_a_pod_group_of_coscheduling_volcano_or_kai_is_a_gang_of_its_min_member() -> None:
    asked: list[tuple[str, str, str, str]] = []

    async def get_pod_group(group: str, version: str, namespace: str, name: str) -> dict[str, Any]:
        asked.append((group, version, namespace, name))
        return {
            "apiVersion": f"{group}/{version}",
            "kind": "PodGroup",
            "metadata": {"name": name, "namespace": namespace, "uid": f"pg-{group}"},
            "spec": {"minMember": 6},
        }

    async def no_job(namespace: str, name: str) -> dict[str, Any]:
        raise AssertionError("no Job owns these pods")

    owners = Owners(no_job, get_pod_group=get_pod_group, clock=lambda: 0.0)
    pods = {
        "scheduling.x-k8s.io": _grouped(labels={"scheduling.x-k8s.io/pod-group": "w"}),
        "scheduling.volcano.sh": _grouped(annotations={"scheduling.k8s.io/group-name": "w"}),
        "scheduling.run.ai": _grouped(annotations={"pod-group-name": "w"}),
    }
    for group, pod in pods.items():
        found = await owners.pod_group_of("ml", pod)
        assert found is not None and found["apiVersion"].startswith(group)
        gang = gang_of(pod, namespace="ml", pod_group=found)
        assert gang is not None and gang[1] == 6, (group, gang)
    assert [a[0] for a in asked] == list(pods)
    await owners.pod_group_of("ml", pods["scheduling.run.ai"])  # kept: no second GET
    assert len(asked) == 3
    kueue = _grouped(labels={"kueue.x-k8s.io/pod-group-name": "w"})
    assert await owners.pod_group_of("ml", kueue) is None  # sized on the pod itself


def test_a_job_of_twelve_whose_pods_say_a_least_size_of_four_is_an_elastic_gang() -> None:
    pod = _pod(3)
    pod["metadata"]["annotations"]["hcs.io/job-min"] = "4"
    assert gang_of(pod, namespace="ml", job=_job(parallelism=12)) == GangOf(
        f"ml/train/{UID}", 12, 4
    )
    pod["metadata"]["annotations"]["hcs.io/job-min"] = "12"  # least == size: a fixed gang
    assert gang_of(pod, namespace="ml", job=_job(parallelism=12)) == GangOf(f"ml/train/{UID}", 12)
