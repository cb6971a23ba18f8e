"""The owning Job sizes a gang at admission: an Indexed Job's ranks are one
gang of its parallelism without any HCS annotation."""

from __future__ import annotations

from typing import Any

from hcs_bus.errors import BusUnavailable, KubeNotFound
from injector.admitting import gang_of
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
    assert gangs == {(f"ml/train/{UID}", 12)}
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
