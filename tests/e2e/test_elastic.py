"""An elastic job on a real control plane: an Indexed Job of 16 ranks whose
pods say ``hcs.io/job-min: 4`` starts with 4 on a busy pool, grows to 16 as
the other work ends, and gives up its 8 highest ranks when a namespace owed
its guarantee submits a gang; the ranks it keeps are never restarted."""

from __future__ import annotations

import time
from typing import Any

from tests.e2e.api import wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.test_gangs import _job as gang_job
from tests.e2e.test_pool import _events, _quota, borrower  # noqa: F401 (a fixture)
from tests.e2e.workloads import Workloads, fleet_labelled

A100 = {"hcs.io/models": "A100-80G"}
LEAST, MOST = 4, 16
NG_B = ("gpu-a100-1", "gpu-a100-2")  # the 16 A100s of network group ng-b


def _job(work: Workloads, name: str, *, ranks: int, least: int | None = None) -> None:
    notes = dict(A100) | ({"hcs.io/job-min": str(least)} if least else {})
    # a rank taken back is made again: no failure of the Job
    gang_job(work, name, ranks=ranks, backoff=100, annotations=notes)


def _live(work: Workloads, job: str) -> list[dict[str, Any]]:
    pods = work.pods(f"job-name={job}")
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def _bound(work: Workloads, job: str) -> list[dict[str, Any]]:
    return [p for p in _live(work, job) if p["spec"].get("nodeName")]


def _index(pod: dict[str, Any]) -> int:
    return int(pod["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"])


def _exactly(work: Workloads, job: str, n: int) -> list[dict[str, Any]] | None:
    found = _bound(work, job)
    return found if len(found) == n else None


def test_an_elastic_job_starts_small_grows_into_idle_devices_and_shrinks_for_a_guarantee(
    stack: Stack,
    work: Workloads,
    borrower: Workloads,  # noqa: F811
) -> None:
    fleet_labelled(work, FLEET)
    _quota(work)  # the lender: guaranteed half the A100s
    holders = {"hold-a": ("gpu-a100-0", 8), "hold-b1": (NG_B[0], 6), "hold-b2": (NG_B[1], 6)}
    for name, (node, count) in holders.items():  # 4 A100s left, all in ng-b
        wait_for(
            lambda name=name, node=node, count=count: borrower.pod(
                name,
                {"ai.compute/devices": str(count)},
                annotations=A100,
                nodeSelector={"kubernetes.io/hostname": node},
            ),
            what=f"pod {name} admitted",
            timeout_s=60,
        )
        borrower.running(name)

    _job(borrower, "el", ranks=MOST, least=LEAST)
    first = wait_for(
        lambda: _exactly(borrower, "el", LEAST),
        what=f"the elastic job started with its least size, {LEAST} ranks",
        timeout_s=60,
    )
    assert {p["spec"]["nodeName"] for p in first} <= set(NG_B)
    gated = [p for p in _live(borrower, "el") if p["spec"].get("schedulingGates")]
    assert len(gated) == MOST - LEAST  # the rest wait behind the gate, holding nothing
    for pod in first + gated:  # every rank learns the world size torchrun meets at
        env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
        assert env["PET_NNODES"] == f"{LEAST}:{MOST}", env
        assert (env["HCS_JOB_MIN_SIZE"], env["HCS_JOB_MAX_SIZE"]) == (str(LEAST), str(MOST))

    for name in ("hold-b1", "hold-b2"):
        borrower.api.delete(f"{borrower.pods_path}/{name}")
    grown = wait_for(
        lambda: _exactly(borrower, "el", MOST),
        what=f"the elastic job grown to {MOST} ranks as the devices came free",
        timeout_s=90,
        explain=lambda: str(sorted(p["metadata"]["name"] for p in _bound(borrower, "el"))),
    )
    assert {p["spec"]["nodeName"] for p in grown} == set(NG_B)  # one network group
    kept_before = {p["metadata"]["uid"] for p in grown if _index(p) < MOST // 2}
    assert "GangGrown" in {e.get("reason") for e in _reasons(borrower)}

    started = time.monotonic()
    _job(work, "a", ranks=MOST // 2)  # owed its guarantee: room is taken back for it
    wait_for(
        lambda: _exactly(work, "a", MOST // 2),
        what="the lender's gang running on ranks taken back",
        timeout_s=60,
        explain=lambda: work.explain(_live(work, "a")[0]["metadata"]["name"]),
    )
    assert time.monotonic() - started < 60
    left = wait_for(
        lambda: _exactly(borrower, "el", MOST // 2),
        what=f"the elastic job shrunk to {MOST // 2} ranks",
        timeout_s=30,
    )
    assert sorted(_index(p) for p in left) == list(range(MOST // 2))  # highest ranks went
    assert {p["metadata"]["uid"] for p in left} == kept_before  # the rest never restarted
    reclaimed = _events(borrower, "Reclaimed")
    assert reclaimed and all(name.startswith("el-") for name in reclaimed)
    assert not reclaimed & {p["metadata"]["name"] for p in left}


def _reasons(work: Workloads) -> list[dict[str, Any]]:
    return work.api.items(f"/api/v1/namespaces/{work.namespace}/events")
