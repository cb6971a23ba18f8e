"""Outages and stranded pods on a real cluster.

- The HCS scheduler down for 5 s while kube-scheduler works through a burst:
  every filter call fails, kube-scheduler parks each pod in its unschedulable
  queue (a 5-minute flush in v1.26); once the scheduler is back and replayed
  it wakes them (``hcs.io/wake``), so every pod is bound within 30 s.
- A ReplicaSet's pod pledged at admission to a class that others fill before
  it is placed: the scheduler re-plans it (evicts it, its ReplicaSet makes a
  new one, admitted afresh) and it ends Running on another class.
- The same for a bare pod with ``hcs.io/replan: recreate``: the scheduler
  deletes it and creates it again from the injector's copy of it as
  submitted; the copy is admitted afresh and ends Running on another class.

kube-scheduler is held while the pods are admitted, and the L40S node is
tainted for all but the fillers until they run, so the order in which the
pods are placed is the test's, not chance's."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.e2e.api import wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.processes import tail
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, fleet_labelled, pod_spec

pytestmark = pytest.mark.faults

BURST = 24
OUTAGE_S = 5.0
BOUND_WITHIN_S = 30.0
SLICE = {"ai.compute/vram": "16Gi"}
WHOLE = {"ai.compute/devices": "1"}
L40S = "L40S"
L40S_NODE, L40S_DEVICES = "gpu-l40s-0", 4  # tests/e2e/fleet.yaml
HOLD = {"key": "hcs-e2e/hold", "value": "fillers-first", "effect": "NoSchedule"}


def _scheduled_false(pod: dict[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c["type"] == "PodScheduled" and c["status"] == "False" for c in conditions)


def _restart_hcs_scheduler(stack: Stack, argv: list[str]) -> None:
    restarted = stack.start_part("scheduler", argv)
    restarted.wait_until(stack._extender_ready, what="ready again", timeout_s=60)


def test_every_pod_parked_during_a_five_second_scheduler_outage_is_bound_within_30_s_of_its_return(
    stack: Stack, work: Workloads, record_property: Any
) -> None:
    fleet_labelled(work, FLEET)
    cluster = stack.cluster
    assert cluster.scheduler is not None
    cluster.scheduler.stop()  # hold kube-scheduler while the burst is admitted
    for i in range(BURST):
        work.pod(f"burst-{i}", SLICE)
    scheduler = stack.parts["scheduler"]
    scheduler.stop()
    down_at = time.monotonic()
    cluster.restart_scheduler()  # now it meets every pod with the extender down
    wait_for(
        lambda: len([p for p in work.pods() if _scheduled_false(p)]) == BURST,
        what=f"kube-scheduler failing all {BURST} pods while the extender is down",
        timeout_s=60,
        explain=lambda: work.explain("burst-0"),
    )
    assert not [p for p in work.pods() if p["spec"].get("nodeName")]
    time.sleep(max(0.0, OUTAGE_S - (time.monotonic() - down_at)))  # the outage itself

    _restart_hcs_scheduler(stack, scheduler.argv)
    back_at = time.monotonic()
    wait_for(
        lambda: all(p["spec"].get("nodeName") for p in work.pods()),
        what=f"all {BURST} pods bound within {BOUND_WITHIN_S:.0f} s of the scheduler's return",
        timeout_s=BOUND_WITHIN_S,
        explain=lambda: work.explain(
            next(p["metadata"]["name"] for p in work.pods() if not p["spec"].get("nodeName"))
        ),
    )
    took_s = time.monotonic() - back_at
    record_property("bound_after_return_s", round(took_s, 2))
    print(f"\nhcs e2e: {BURST} parked pods all bound {took_s:.1f} s after the scheduler's return")
    woken = [p for p in work.pods() if "hcs.io/wake" in p["metadata"].get("annotations", {})]
    assert len(woken) == BURST


def _replica_set(name: str, *, annotations: dict[str, str]) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "ReplicaSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels, "annotations": annotations},
                "spec": pod_spec(WHOLE),
            },
        },
    }


def _hold(work: Workloads, node: str, *, held: bool) -> None:
    """Add or remove the HOLD taint, keeping every other taint (read, modify,
    write guarded by the resourceVersion)."""
    current = work.node(node)
    taints = [t for t in current["spec"].get("taints") or [] if t["key"] != HOLD["key"]]
    body = {
        "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
        "spec": {"taints": [*taints, HOLD] if held else taints},
    }
    work.api.patch(f"/api/v1/nodes/{node}", body)


def _plan_model(pod: dict[str, Any]) -> str | None:
    import json

    note = pod["metadata"].get("annotations", {}).get("hcs.io/plan")
    return json.loads(note)["model"] if note else None


def _why_not_l40s(stack: Stack, work: Workloads, pod: dict[str, Any]) -> str:
    """For a failure message: the L40S Node's taints and cordon, the pod's
    notes, and what the HCS parts say."""
    spec = work.node(L40S_NODE).get("spec", {})
    notes = {k: v for k, v in pod["metadata"].get("annotations", {}).items() if "plan" in k}
    said = [
        line
        for line in tail(stack.parts["scheduler"].log, 400).splitlines()
        if L40S_NODE in line or "L40S" in line
    ][-8:]
    return (
        f"{L40S_NODE}: taints {spec.get('taints')}, unschedulable {spec.get('unschedulable')}; "
        f"pod notes {notes}; the scheduler on L40S: {said}; {stack.why()}"
    )


def _fill_l40s_before_it_is_placed(stack: Stack, work: Workloads) -> None:
    """With kube-scheduler held since the pod was admitted: fill every L40S
    device with pods placed before it, then let kube-scheduler go."""
    cluster = stack.cluster
    assert cluster.scheduler is not None
    _hold(work, L40S_NODE, held=True)  # only pods that tolerate the hold go there now
    # a device an earlier test failed may still be out (its healer's history
    # went with a killed leader): fill the devices in service
    status = work.api.get(f"/apis/hcs.io/v1alpha1/computenodes/{L40S_NODE}").get("status", {})
    in_service = L40S_DEVICES - len(status.get("devicesOut") or [])
    try:
        for i in range(in_service):  # these take every L40S device before it is placed
            work.pod(
                f"filler-{i}",
                WHOLE,
                annotations={"hcs.io/models": L40S, "hcs.io/substitution": "deny"},
                tolerations=[{"key": HOLD["key"], "operator": "Exists", "effect": "NoSchedule"}],
            )
        cluster.restart_scheduler()
        for i in range(in_service):
            work.running(f"filler-{i}", timeout_s=60)
    finally:
        _hold(work, L40S_NODE, held=False)


def test_a_replica_set_pod_stranded_on_a_full_class_is_replanned_and_runs_on_another(
    stack: Stack, work: Workloads, record_property: Any
) -> None:
    fleet_labelled(work, FLEET)
    cluster = stack.cluster
    assert cluster.scheduler is not None
    cluster.scheduler.stop()  # the pod is admitted (and pledged) while L40S has room
    work.api.create(
        _replica_set("web", annotations={"hcs.io/models": L40S, "hcs.io/substitution": "allow"}),
        namespace=work.namespace,
    )
    first = wait_for(
        lambda: next(iter(work.pods("app=web")), None),
        what="the ReplicaSet's pod admitted",
        timeout_s=30,
    )
    assert _plan_model(first) == L40S, _why_not_l40s(stack, work, first)
    _fill_l40s_before_it_is_placed(stack, work)
    stranded_at = time.monotonic()

    def replacement() -> dict[str, Any] | None:
        for pod in work.pods("app=web"):
            fresh = pod["metadata"]["uid"] != first["metadata"]["uid"]
            if fresh and pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    moved = wait_for(
        replacement,
        what="the ReplicaSet's pod re-planned and Running on another class",
        timeout_s=120,
        explain=lambda: work.explain(first["metadata"]["name"]),
    )
    took_s = time.monotonic() - stranded_at
    record_property("replanned_running_after_s", round(took_s, 2))
    print(f"\nhcs e2e: stranded pod re-planned and Running {took_s:.1f} s after L40S filled")
    assert _plan_model(moved) != L40S
    node = work.node(moved["spec"]["nodeName"])
    assert node["metadata"]["labels"]["hcs.io/model"] != L40S
    events = work.api.items(
        f"/api/v1/namespaces/{work.namespace}/events"
        f"?fieldSelector=involvedObject.name={first['metadata']['name']}"
    )
    assert any(e.get("reason") == "HCSStranded" for e in events), events


def test_a_bare_pod_asking_for_it_stranded_on_a_full_class_is_recreated_and_runs_on_another(
    stack: Stack, work: Workloads, record_property: Any
) -> None:
    fleet_labelled(work, FLEET)
    notes = {"hcs.io/models": L40S, "hcs.io/substitution": "allow", "team": "vision"}
    # the previous test's pods and pledges on L40S may still be going away
    wait_for(
        lambda: work.dry_run_class(WHOLE, annotations=notes) == f"nvidia/{L40S}",
        what="dry-run plans into L40S (its room back from earlier tests)",
        timeout_s=60,
        explain=lambda: f"planned into {work.dry_run_class(WHOLE, annotations=notes)}",
    )
    assert stack.cluster.scheduler is not None
    stack.cluster.scheduler.stop()  # the pod is admitted (and pledged) while L40S has room
    first = work.pod(
        "solo", WHOLE, labels={"app": "solo"}, annotations={**notes, "hcs.io/replan": "recreate"}
    )
    assert _plan_model(first) == L40S, _why_not_l40s(stack, work, first)
    assert "hcs.io/submitted" in first["metadata"]["annotations"]
    _fill_l40s_before_it_is_placed(stack, work)
    stranded_at = time.monotonic()

    def recreated() -> dict[str, Any] | None:
        for pod in work.pods("app=solo"):
            fresh = pod["metadata"]["uid"] != first["metadata"]["uid"]
            if fresh and pod.get("status", {}).get("phase") == "Running":
                return pod
        return None

    moved = wait_for(
        recreated,
        what="the bare pod re-created and Running on another class",
        timeout_s=90,
        explain=lambda: work.explain("solo"),
    )
    took_s = time.monotonic() - stranded_at
    record_property("recreated_running_after_s", round(took_s, 2))
    print(f"\nhcs e2e: stranded bare pod re-created and Running {took_s:.1f} s after L40S filled")
    assert moved["metadata"]["name"] == "solo" and moved["metadata"]["labels"] == {"app": "solo"}
    assert _plan_model(moved) != L40S
    node = work.node(moved["spec"]["nodeName"])
    assert node["metadata"]["labels"]["hcs.io/model"] != L40S
    kept = moved["metadata"]["annotations"]
    assert {k: kept.get(k) for k in notes} == notes and kept["hcs.io/replan"] == "recreate"
    events = work.api.items(
        f"/api/v1/namespaces/{work.namespace}/events"
        f"?fieldSelector=involvedObject.uid={first['metadata']['uid']}"
    )
    assert any(e.get("reason") == "HCSStranded" for e in events), events
