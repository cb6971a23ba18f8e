"""Gangs on a real control plane (kube-apiserver and kube-scheduler with
``PodSchedulingReadiness``): a job's ranks wait behind the ``hcs.io/gang``
scheduling gate, holding nothing, until the whole gang fits one class in one
network group; then every rank is pledged at once and bound there."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from hcs_bus import checkpoint, vocabulary
from tests.e2e.api import ApiError, wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.test_healing import _fingerprint_index, _xid_79
from tests.e2e.workloads import Workloads, fleet_labelled, pod_spec

A100 = {"hcs.io/models": "A100-80G"}
ONE_DEVICE = {"ai.compute/devices": "1"}
KUEUE_GATE = "kueue.x-k8s.io/admission"


def _job(
    work: Workloads,
    name: str,
    *,
    ranks: int,
    backoff: int = 0,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    template: dict[str, Any] = {"spec": pod_spec(ONE_DEVICE, restartPolicy="Never")}
    if annotations:
        template["metadata"] = {"annotations": annotations}
    body = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completions": ranks,
            "parallelism": ranks,
            "completionMode": "Indexed",
            "backoffLimit": backoff,
            # no hcs.io/job-size: the injector reads the Job's parallelism
            "template": template,
        },
    }
    created: dict[str, Any] = work.api.create(body, namespace=work.namespace)
    return created


def _members(work: Workloads, job: str) -> list[dict[str, Any]]:
    return work.pods(f"job-name={job}")


def _bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


def _told(work: Workloads, pod: str) -> list[str]:
    events = work.api.items(
        f"/api/v1/namespaces/{work.namespace}/events?fieldSelector=involvedObject.name={pod}"
    )
    return [e.get("message", "") for e in events if e.get("reason") == "GangWaiting"]


def _groups(work: Workloads, pods: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The (model, network group) of the nodes the pods are bound to."""
    out = set()
    for p in pods:
        labels = work.node(p["spec"]["nodeName"])["metadata"]["labels"]
        out.add((labels["hcs.io/model"], labels["hcs.io/network-group"]))
    return out


def _waiting_whole(work: Workloads, job: str, *, ranks: int) -> list[dict[str, Any]]:
    """Every rank of ``job`` there and gated, and an Event on a member saying
    the gang needs ``ranks`` devices (the fleet lacks them, not members)."""
    pods = wait_for(
        lambda: (found := _members(work, job)) and len(found) == ranks and found,
        what=f"the {ranks} pods of job {job}",
        timeout_s=60,
    )
    for pod in pods:
        gates = [g["name"] for g in pod["spec"].get("schedulingGates", [])]
        assert vocabulary.GANG_GATE in gates, pod["metadata"]["name"]
        assert pod["metadata"]["annotations"][vocabulary.GANG_SIZE] == str(ranks)
    first = pods[0]["metadata"]["name"]
    wait_for(
        lambda: any(f"needs {ranks} devices" in m for m in _told(work, first)),
        what=f"a GangWaiting event on {first} saying the gang needs {ranks} devices",
        timeout_s=30,
        explain=lambda: work.explain(first),
    )
    return pods


def _all_bound(work: Workloads, job: str, *, ranks: int, timeout_s: float) -> list[dict[str, Any]]:
    return wait_for(
        lambda: len(found := _bound(_members(work, job))) == ranks and found,
        what=f"all {ranks} ranks of job {job} bound",
        timeout_s=timeout_s,
        explain=lambda: work.explain(_members(work, job)[0]["metadata"]["name"]),
    )


def _delete_pods(work: Workloads, names: list[str]) -> None:
    for name in names:
        try:
            work.api.delete(f"{work.pods_path}/{name}", {"gracePeriodSeconds": 0})
        except ApiError as exc:
            if exc.status != 404:  # gone already (the Job's pods, collected)
                raise


def test_a_gang_with_no_room_holds_nothing_then_binds_whole_on_its_class_once_room_frees(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    blockers = [f"blocker-{i}" for i in range(3)]  # every A100 taken
    for name in blockers:
        work.pod(name, {"ai.compute/devices": "8"}, annotations=A100)
    for name in blockers:
        work.running(name)
    _job(work, "train", ranks=12)
    pods = _waiting_whole(work, "train", ranks=12)
    plans = {p["metadata"]["annotations"][vocabulary.PLAN] for p in pods}
    assert len(plans) == 1 and "A100-80G" in plans.pop()  # the class where 12 could fit
    assert _bound(_members(work, "train")) == []
    assert stack.pods_held(work.namespace) == len(blockers)
    started = time.monotonic()
    _delete_pods(work, blockers)
    bound = _all_bound(work, "train", ranks=12, timeout_s=30)
    assert time.monotonic() - started < 30
    groups = _groups(work, bound)
    assert len(groups) == 1 and next(iter(groups))[0] == "A100-80G", groups
    for pod in bound:
        assert pod["metadata"]["annotations"].get(vocabulary.PLEDGE), pod["metadata"]["name"]


def test_of_two_gangs_with_room_for_one_one_runs_the_other_holds_nothing_until_it_ends(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    _job(work, "first", ranks=12)
    _job(work, "second", ranks=12)

    def one_whole() -> str | None:
        counts = {job: len(_bound(_members(work, job))) for job in ("first", "second")}
        whole = [job for job, n in counts.items() if n == 12]
        return whole[0] if len(whole) == 1 else None

    runs = wait_for(one_whole, what="one gang bound whole", timeout_s=60)
    waits = "second" if runs == "first" else "first"
    _waiting_whole(work, waits, ranks=12)
    assert _bound(_members(work, waits)) == []
    assert stack.pods_held(work.namespace) == 12
    work.api.delete(
        f"/apis/batch/v1/namespaces/{work.namespace}/jobs/{runs}",
        {"propagationPolicy": "Background"},
    )
    _delete_pods(work, [p["metadata"]["name"] for p in _members(work, runs)])
    bound = _all_bound(work, waits, ranks=12, timeout_s=60)
    assert len(_groups(work, bound)) == 1


def test_a_gang_held_by_a_foreign_gate_is_planned_only_once_that_gate_is_lifted(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    names = [f"trio-{i}" for i in range(4)]
    for name in names:
        work.pod(
            name,
            ONE_DEVICE,
            labels={vocabulary.JOB: "trio"},
            annotations={vocabulary.JOB_SIZE: "4"},
            schedulingGates=[{"name": KUEUE_GATE}],
        )
    wait_for(
        lambda: any(KUEUE_GATE in m for m in _told(work, names[0])),
        what="a GangWaiting event naming the foreign gate",
        timeout_s=30,
        explain=lambda: work.explain(names[0]),
    )
    assert all(not work.get(n)["spec"].get("nodeName") for n in names)
    assert stack.pods_held(work.namespace) == 0
    for name in names:
        gates = [g["name"] for g in work.get(name)["spec"]["schedulingGates"]]
        at = gates.index(KUEUE_GATE)
        work.api.patch(
            f"{work.pods_path}/{name}",
            [
                {"op": "test", "path": f"/spec/schedulingGates/{at}/name", "value": KUEUE_GATE},
                {"op": "remove", "path": f"/spec/schedulingGates/{at}"},
            ],
            kind="json",
        )

    def all_bound() -> list[dict[str, Any]] | None:
        found = _bound([work.get(n) for n in names])
        return found if len(found) == len(names) else None

    bound = wait_for(
        all_bound,
        what="the 4 members bound",
        timeout_s=30,
        explain=lambda: work.explain(names[0]),
    )
    assert len({group for _, group in _groups(work, bound)}) == 1


@pytest.mark.faults(last=True)  # its restarted gang fills a whole class: after the others
def test_a_fatal_fault_on_one_ranks_device_restarts_every_rank_from_one_checkpoint(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    job = _job(work, "ring", ranks=4, backoff=8)
    old = _all_bound(work, "ring", ranks=4, timeout_s=60)
    old_uids = {p["metadata"]["uid"] for p in old}
    uri = f"s3://ckpt/{work.namespace}/ring/step-500"
    run = job["metadata"]["uid"]  # a Job's run: its UID
    stack.on_bus(
        lambda bus: checkpoint.report(
            bus, namespace=work.namespace, job="ring", run=run, uri=uri, step=500
        )
    )
    victim = old[2]
    node = victim["spec"]["nodeName"]
    device = victim["metadata"]["annotations"]["hcs.io/devices"].split(",")[0]
    _xid_79(stack, node, device=_fingerprint_index(stack, node, device))

    def replaced() -> list[dict[str, Any]] | None:
        pods = [p for p in _members(work, "ring") if p["metadata"]["uid"] not in old_uids]
        bound = _bound([p for p in pods if not p["metadata"].get("deletionTimestamp")])
        return bound if len(bound) == 4 else None

    new = wait_for(
        replaced,
        what="four new ranks bound after the fault",
        timeout_s=120,
        explain=lambda: str([work.explain(p["metadata"]["name"]) for p in _members(work, "ring")]),
    )
    live = [p for p in _members(work, "ring") if not p["metadata"].get("deletionTimestamp")]
    assert not [
        p
        for p in live
        if p["metadata"]["uid"] in old_uids
        and p["status"].get("phase") not in ("Failed", "Succeeded")
    ], "a rank of the old gang kept running"
    points = {p["metadata"]["annotations"].get(vocabulary.RESUME_FROM) for p in new}
    assert points == {uri}, points
    classes = {json.loads(p["metadata"]["annotations"][vocabulary.PLAN])["model"] for p in new}
    assert len(classes) == 1, classes
    # the device reports healthy all along: after the recovery window it is back
    # in service (the tier's later tests count every device of the fleet)
    work.api.delete(f"/apis/batch/v1/namespaces/{work.namespace}/jobs/ring", {})
    wait_for(
        lambda: (
            not work.api.get(f"/apis/hcs.io/v1alpha1/computenodes/{node}")
            .get("status", {})
            .get("devicesOut")
        ),
        what=f"the failed device of {node} back in service after the recovery window",
        timeout_s=150,
        explain=stack.why,
    )


def test_a_16_rank_gang_over_two_nodes_keeps_one_fabric_and_one_set_of_collective_flags(
    stack: Stack, work: Workloads
) -> None:
    """16 ranks of one device: only the two A100 nodes of fabric ib-b hold them
    together, and every rank is told the same collective flags (ranks set up
    differently fail to connect)."""
    fleet_labelled(work, FLEET)
    _job(work, "wide", ranks=16)
    bound = _all_bound(work, "wide", ranks=16, timeout_s=60)
    nodes = {p["spec"]["nodeName"] for p in bound}
    assert nodes == {"gpu-a100-1", "gpu-a100-2"}, nodes
    assert len(_groups(work, bound)) == 1
    flags = {
        tuple(
            sorted(
                (k, v)
                for k, v in p["metadata"]["annotations"].items()
                if k.startswith("hcs.io/collective-")
            )
        )
        for p in bound
    }
    assert len(flags) == 1 and next(iter(flags)), flags
