"""The shared pool on a real control plane: two namespaces each guaranteed
half of the A100s (ComputeQuota ``spec.guaranteed``). While the lender is
idle the borrower fills every A100 with gangs; once the lender submits a
gang, the borrower's newest gangs are evicted (``Reclaimed`` Events) until
the lender's gang runs, and nothing of the borrower within its guarantee is
touched."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.api import wait_for
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import FLEET, clean_namespace
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, fleet_labelled, pod_spec

ONE_DEVICE = {"ai.compute/devices": "1"}
OTHERS = {"L40S": 4, "Ascend910B2": 8, "K100": 8, "MLU370-X8": 8}  # the fleet's other classes
A100S = 24  # three nodes of eight (tests/e2e/fleet.yaml)
RANKS = 4
HALF = {"acu": 1200, "vram": "960Gi"}  # 12 A100s: half of them


def _quota(work: Workloads) -> None:
    body = {
        "apiVersion": "hcs.io/v1alpha1",
        "kind": "ComputeQuota",
        "metadata": {"name": "pool"},
        "spec": {"guaranteed": dict(HALF)},
    }
    work.api.create(body, namespace=work.namespace)


def _job(work: Workloads, name: str) -> None:
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": RANKS,
            "parallelism": RANKS,
            "completionMode": "Indexed",
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": {"hcs.io/models": "A100-80G"}},
                "spec": pod_spec(ONE_DEVICE, restartPolicy="Never"),
            },
        },
    }
    work.api.create(body, namespace=work.namespace)


def _members(work: Workloads, job: str) -> list[dict[str, Any]]:
    return work.pods(f"job-name={job}")


def _running(work: Workloads, job: str) -> list[dict[str, Any]] | None:
    pods = [
        p
        for p in _members(work, job)
        if p["spec"].get("nodeName") and not p["metadata"].get("deletionTimestamp")
    ]
    return pods if len(pods) == RANKS else None


def _events(work: Workloads, reason: str) -> set[str]:
    found = work.api.items(f"/api/v1/namespaces/{work.namespace}/events")
    return {e["involvedObject"]["name"] for e in found if e.get("reason") == reason}


@pytest.fixture
def borrower(stack: Stack, cluster: Cluster) -> Iterator[Workloads]:
    """A second namespace, cleaned up as the ``namespace`` fixture does."""
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    cluster.namespace(name)
    yield Workloads(stack, namespace=name)
    clean_namespace(cluster, stack, name)


def test_an_idle_namespace_gets_its_guarantee_back_from_the_newest_borrowed_gangs(
    stack: Stack, work: Workloads, borrower: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    _quota(work)
    _quota(borrower)
    for model, count in OTHERS.items():  # every other class held (not gangs: never reclaimed)
        name = f"hold-{model.lower()}"
        wait_for(  # refused until the scheduler's view has the class
            lambda name=name, model=model, count=count: borrower.pod(
                name, {"ai.compute/devices": str(count)}, annotations={"hcs.io/models": model}
            ),
            what=f"pod {name} admitted on {model}",
            timeout_s=60,
        )
        borrower.running(name)
    gangs = [f"b{i}" for i in range(A100S // RANKS)]  # every A100, half of them borrowed
    for job in gangs:  # one at a time: each pledged after the last (newest last)
        _job(borrower, job)
        wait_for(
            lambda job=job: _running(borrower, job),
            what=f"the {RANKS} ranks of the borrower's gang {job} running",
            timeout_s=60,
            explain=lambda job=job: borrower.explain(
                _members(borrower, job)[0]["metadata"]["name"]
            ),
        )
    before = {job: {p["metadata"]["uid"] for p in _running(borrower, job) or []} for job in gangs}

    started = time.monotonic()
    _job(work, "a")
    wait_for(
        lambda: _running(work, "a"),
        what="the lender's gang running on room taken back",
        timeout_s=60,
        explain=lambda: work.explain(_members(work, "a")[0]["metadata"]["name"]),
    )
    assert time.monotonic() - started < 60
    taken = [job for job in gangs if not _running(borrower, job)]
    assert taken == gangs[-len(taken) :] and 1 <= len(taken) <= 2, taken  # the newest only
    for job in gangs[: -len(taken)]:  # within its guarantee and older: untouched
        kept = _running(borrower, job) or []
        assert {p["metadata"]["uid"] for p in kept} == before[job], job
    reclaimed = _events(borrower, "Reclaimed")
    assert reclaimed and all(name.startswith(tuple(f"{j}-" for j in taken)) for name in reclaimed)
    assert {p["metadata"]["name"] for p in _members(work, "a")} <= _events(work, "ReclaimedFor")
