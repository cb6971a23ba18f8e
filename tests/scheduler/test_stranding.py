"""The stranded-pod loop of a running replica, against the API double and a
real nats-server: parked pods woken after the replay and when their class
gains room; stranded pods with an owner evicted, bare ones told."""

from __future__ import annotations

import json
from typing import Any

from structlog.testing import capture_logs

from hcs_bus import messages, streams, subjects, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.messages import NodeReservations, PodRef
from scheduler.ledger.pledge_rules import Pledge
from scheduler.plan import gang_records
from scheduler.replan import rules as replanning
from scheduler.replica import Scheduler
from tests.apiserver import ApiServer
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_WHOLE as A100_PLAN
from tests.scheduler.helpers import node_fp, publish_fleet, until
from tests.view.factories import reservation

NS = "ml"
SCHED = "hcs-scheduler"
FAST = {"replan_after_s": 0.3, "stranding_scan_s": 0.05, "wake_min_interval_s": 0.1}


async def _fill_a100(bus: Bus, api: ApiServer) -> None:
    """Every device of node a100-1 held by a bound pod of another namespace."""
    api.add_pod("other", "hog", node="a100-1", uid="uid-hog")
    hog = reservation("other", "hog", [(i, 81920, True) for i in range(8)])
    kv = await bus.js.key_value(streams.KV_ALLOC)
    doc = NodeReservations(node="a100-1", reservations=(hog,))
    await kv.put(subjects.alloc_key("a100-1"), messages.encode(doc))


async def _start(bus: Bus, start: Start, kube: Any, **cfg: Any) -> Scheduler:
    await publish_fleet(bus, node_fp("a100-1"), node_fp("ascend-1", "huawei/Ascend910B2"))
    sched = await start(bus, kube, http=False, **{**FAST, **cfg})
    await until(lambda: {"a100-1", "ascend-1"} <= set(sched.view.state.nodes))
    return sched


async def _scans(sched: Scheduler, more: int) -> None:
    """Wait until the stranding loop has scanned ``more`` times again."""
    assert sched.strands is not None
    strands = sched.strands
    start = strands.scans
    await until(lambda: strands.scans > start + more)


def _pending_pod(
    api: ApiServer, name: str, *, substitution: str = "allow", owned: bool = True
) -> str:
    resources = {"limits": {"ai.compute/devices": "1"}, "requests": {"ai.compute/devices": "1"}}
    notes = {
        "hcs.io/plan": json.dumps(A100_PLAN),
        "hcs.io/models": "A100-80G",
        "hcs.io/substitution": substitution,
    }
    api.add_pod(
        NS, name, phase="Pending", scheduler_name=SCHED, annotations=notes, resources=resources
    )
    if owned:
        owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web", "uid": "rs-1"}

        def own(pod: dict[str, Any]) -> None:
            pod["metadata"]["ownerReferences"] = [{**owner, "controller": True}]

        api.update_pod(NS, name, own)
    return str(api.pods[(NS, name)]["metadata"]["uid"])


def _wake(api: ApiServer, name: str) -> str | None:
    pod = api.pods.get((NS, name))
    return None if pod is None else (pod["metadata"].get("annotations") or {}).get(vocabulary.WAKE)


async def test_pending_pods_are_woken_once_the_replica_is_ready(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    _pending_pod(apiserver, "parked", substitution="deny")
    apiserver.add_pod(NS, "other-profile", phase="Pending")
    await _start(bus, start_scheduler, kube)
    await until(lambda: _wake(apiserver, "parked") is not None)
    assert _wake(apiserver, "other-profile") is None
    patches = [r for r in apiserver.requests if r.resource == "pods" and r.verb == "patch"]
    assert patches and patches[0].content_type == "application/merge-patch+json"


async def test_a_gated_pending_pod_is_never_woken(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    """kube-scheduler does not queue a pod behind a scheduling gate: waking
    it would only be a patch (the gang loop lifts HCS's gate)."""
    _pending_pod(apiserver, "parked", substitution="deny")
    _pending_pod(apiserver, "gated", substitution="deny")

    def gate(pod: dict[str, Any]) -> None:
        pod["spec"]["schedulingGates"] = [{"name": "hcs.io/gang"}]

    apiserver.update_pod(NS, "gated", gate)
    await _start(bus, start_scheduler, kube)
    await until(lambda: _wake(apiserver, "parked") is not None)
    assert _wake(apiserver, "gated") is None


async def test_a_class_that_gains_room_wakes_its_pending_pods_again(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    _pending_pod(apiserver, "waiting", substitution="deny")  # may not move: waits for A100
    sched = await _start(bus, start_scheduler, kube, wake_min_interval_s=0.0)
    await until(lambda: _wake(apiserver, "waiting") is not None)
    first = _wake(apiserver, "waiting")
    await until(lambda: sched.view.ready.is_set())
    assert (NS, "waiting") in apiserver.pods  # not stranded: its policy allows no other class
    await sched.booker.release(PodRef(namespace="other", name="hog", uid="uid-hog"), reason="done")
    await until(lambda: _wake(apiserver, "waiting") not in (None, first))


async def test_a_released_gang_pledge_wakes_the_pods_of_its_class_though_no_device_was_freed(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    """A pod the extender refused because a pledged gang planned the room
    must be tried again once that gang's record goes: kube-scheduler sees no
    pod or node change then, only the wake."""
    await _fill_a100(bus, apiserver)
    _pending_pod(apiserver, "waiting", substitution="deny")
    sched = await _start(bus, start_scheduler, kube, wake_min_interval_s=0.0)
    await until(lambda: _wake(apiserver, "waiting") is not None)
    assert sched.planner.pledger is not None
    gangs = sched.planner.pledger.gangs
    pledge = Pledge(
        id="g-0", vendor="nvidia", model="A100-80G", devices=8, vram_mib_per_device=81920
    )
    record = gang_records.GangRecord(
        namespace="other",
        job="train",
        run="r1",
        size=1,
        vendor="nvidia",
        model="A100-80G",
        state="pledged",
        ranks=(gang_records.RankPledge(pod="train-0", node="a100-1", pledge=pledge),),
    )
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(record.key, gang_records.ENCODER.encode(record))
    await until(lambda: gangs.get(record.key) is not None)
    await _scans(sched, 2)  # the planned room seen; nothing freed: no wake since
    before = _wake(apiserver, "waiting")
    await _scans(sched, 2)
    assert _wake(apiserver, "waiting") == before
    await kv.delete(record.key)
    await until(lambda: _wake(apiserver, "waiting") != before)


async def test_an_owned_pod_stranded_past_the_deadline_is_evicted_for_its_owner(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    uid = _pending_pod(apiserver, "web-1")
    await _start(bus, start_scheduler, kube)
    await until(lambda: (NS, "web-1") not in apiserver.pods)
    evictions = [r for r in apiserver.requests if r.resource == "pods/eviction"]
    assert len(evictions) == 1
    assert evictions[0].body["deleteOptions"]["preconditions"] == {"uid": uid}
    (event,) = apiserver.events.values()
    assert event["reason"] == replanning.EVENT_REASON and event["type"] == "Warning"
    assert "huawei/Ascend910B2 has room" in event["message"]
    assert "ReplicaSet/web" in event["message"]


async def test_a_bare_stranded_pod_gets_an_event_and_a_condition_and_stays(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    _pending_pod(apiserver, "lonely", owned=False)
    await _start(bus, start_scheduler, kube)

    def stranded() -> list[dict[str, Any]]:
        conditions = apiserver.pods[(NS, "lonely")]["status"].get("conditions") or []
        return [c for c in conditions if c["type"] == replanning.CONDITION]

    await until(lambda: stranded() and apiserver.events)
    assert stranded()[0]["status"] == "True" and "Ascend910B2" in stranded()[0]["message"]
    assert not [r for r in apiserver.requests if r.resource == "pods/eviction"]
    condition_patches = [r for r in apiserver.requests if r.resource == "pods/status"]
    assert len(condition_patches) == 1  # told once, not at every scan


async def test_a_pod_whose_class_has_room_is_left_to_kube_scheduler(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    _pending_pod(apiserver, "fine")
    sched = await _start(bus, start_scheduler, kube)
    await until(lambda: _wake(apiserver, "fine") is not None)
    strands = [t for t in sched.tasks if t.get_name() == "stranding"]
    assert strands and not strands[0].done()
    await _scans(sched, 10)  # well past the 0.3 s deadline
    assert (NS, "fine") in apiserver.pods
    assert not apiserver.events


SUBMITTED_SPEC = {
    "schedulerName": "default-scheduler",
    "containers": [{"name": "main", "image": "trainer:1", "resources": {"limits": {"x": "1"}}}],
}


def _recreatable_pod(api: ApiServer, name: str) -> dict[str, Any]:
    """A bare pending pod with ``hcs.io/replan: recreate`` and the injector's copy."""
    _pending_pod(api, name, owned=False)
    copy = {"v": 1, "annotations": {"hcs.io/replan": "recreate"}, "spec": SUBMITTED_SPEC}

    def ask(pod: dict[str, Any]) -> None:
        pod["metadata"]["labels"] = {"app": "train"}
        pod["metadata"]["annotations"] |= {
            vocabulary.REPLAN: vocabulary.REPLAN_RECREATE,
            vocabulary.SUBMITTED: json.dumps(copy),
            "team": "vision",
        }

    return api.update_pod(NS, name, ask)


def _events(api: ApiServer, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.events.values() if e["reason"] == reason]


async def test_a_bare_pod_asking_for_it_is_deleted_and_created_again_as_submitted(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    old = _recreatable_pod(apiserver, "solo")
    await _start(bus, start_scheduler, kube)

    def recreated() -> dict[str, Any] | None:
        pod = apiserver.pods.get((NS, "solo"))
        fresh = pod is not None and pod["metadata"]["uid"] != old["metadata"]["uid"]
        return pod if fresh else None

    await until(recreated)
    new = recreated()
    assert new is not None and new["spec"] == SUBMITTED_SPEC
    assert new["metadata"]["labels"] == {"app": "train"}
    assert new["metadata"]["annotations"] == {"team": "vision", "hcs.io/replan": "recreate"}
    (delete,) = [r for r in apiserver.requests if r.verb == "delete" and r.resource == "pods"]
    creates = [r for r in apiserver.requests if r.verb == "create" and r.resource == "pods"]
    assert len(creates) == 1 and not [r for r in apiserver.requests if r.resource == "pods/status"]
    (event,) = _events(apiserver, replanning.EVENT_REASON)
    assert event["involvedObject"]["uid"] == old["metadata"]["uid"]
    assert "created again as submitted" in event["message"]
    assert not _events(apiserver, replanning.FAILED_REASON)
    assert delete.path.endswith(f"/namespaces/{NS}/pods/solo")


async def test_a_pod_bound_after_it_was_read_is_not_deleted(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    old = _recreatable_pod(apiserver, "solo")

    def bind() -> None:  # kube-scheduler, between the scheduler's read and its delete
        apiserver.update_pod(NS, "solo", lambda p: p["spec"].update(nodeName="a100-1"))

    apiserver.before("delete", "pods", bind)
    sched = await _start(bus, start_scheduler, kube)
    await until(lambda: _events(apiserver, replanning.EVENT_REASON))
    await until(lambda: [r for r in apiserver.requests if r.verb == "delete"])
    await _scans(sched, 3)
    pod = apiserver.pods[(NS, "solo")]  # the precondition (resourceVersion) refused it
    assert pod["metadata"]["uid"] == old["metadata"]["uid"]
    (delete,) = [r for r in apiserver.requests if r.verb == "delete"]
    preconditions = delete.body["preconditions"]
    assert preconditions["uid"] == old["metadata"]["uid"]
    assert preconditions["resourceVersion"]  # as read, before the bind
    assert preconditions["resourceVersion"] != pod["metadata"]["resourceVersion"]
    assert not [r for r in apiserver.requests if r.verb == "create" and r.resource == "pods"]


async def test_a_copy_the_api_server_refuses_is_told_in_an_event_and_logged(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    _recreatable_pod(apiserver, "solo")
    apiserver.fail("create", "pods", code=503)  # transient: tried again
    apiserver.fail("create", "pods", code=403)  # denied for good (a webhook, a policy)
    with capture_logs() as logs:
        await _start(bus, start_scheduler, kube)
        await until(lambda: _events(apiserver, replanning.FAILED_REASON))
    (event,) = _events(apiserver, replanning.FAILED_REASON)
    assert "injected 403" in event["message"]
    creates = [r for r in apiserver.requests if r.verb == "create" and r.resource == "pods"]
    assert len(creates) == 2 and (NS, "solo") not in apiserver.pods
    (failed,) = [e for e in logs if e["event"] == "pod_recreate_failed"]
    assert failed["body"]["spec"] == SUBMITTED_SPEC  # the pod as submitted is not lost


def _scan_lists(api: ApiServer) -> int:
    """The stranding scan's own pod lists (pending HCS pods, not yet bound)."""
    return len(
        [
            r
            for r in api.requests
            if r.verb == "list"
            and r.resource == "pods"
            and "spec.nodeName=" in r.query.get("fieldSelector", "")
        ]
    )


async def test_once_the_pod_watch_has_its_list_the_scan_reads_it_and_lists_no_pods(
    bus: Bus, apiserver: ApiServer, kube: Any, start_scheduler: Start
) -> None:
    await _fill_a100(bus, apiserver)
    sched = await _start(bus, start_scheduler, kube)
    assert sched.strands is not None and sched.strands.pending_pods is not None
    await until(sched.strands.pending_pods.synced.is_set)
    await _scans(sched, 1)
    before = _scan_lists(apiserver)
    uid = _pending_pod(apiserver, "late")  # seen through the pod watch alone
    await until(lambda: (NS, "late") not in apiserver.pods)
    (eviction,) = [r for r in apiserver.requests if r.resource == "pods/eviction"]
    assert eviction.body["deleteOptions"]["preconditions"] == {"uid": uid}
    await _scans(sched, 5)
    assert _scan_lists(apiserver) == before
    watches = [r for r in apiserver.requests if r.verb == "watch" and r.resource == "pods"]
    assert watches
    assert {r.query.get("fieldSelector") for r in watches} == {f"spec.schedulerName={SCHED}"}
