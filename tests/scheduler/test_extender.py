"""The extender over HTTP against the extender wire documents in tests/scheduler/wire."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import AllocationEvent, CheckpointEvent, NodeReservations
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import (
    A100_TWO,
    FakeKube,
    k8s_doc,
    node_fp,
    pod,
    publish_fleet,
    until,
)
from tests.view.factories import reservation

NAMES = ["gpu-node-a", "gpu-node-b", "gpu-node-c"]


HELD = tuple(reservation("batch", f"low-{i}", [(i, 81920, True)]) for i in range(7))


async def _fleet(bus: Bus) -> None:
    await publish_fleet(bus, *(node_fp(n, labels={"hcs.io/rdma-fabric": "f1"}) for n in NAMES))
    kv = await bus.js.key_value(streams.KV_ALLOC)
    doc = NodeReservations(node="gpu-node-b", reservations=HELD)
    await kv.put(subjects.alloc_key("gpu-node-b"), messages.encode(doc))


def _held_pods(add: Callable[..., Any]) -> None:
    """Give the cluster the pods of the fleet's reservations, bound on
    gpu-node-b: a replica's first reconcile frees a reservation whose pod is gone."""
    for r in HELD:
        add(r.pod.namespace, r.pod.name, node="gpu-node-b", uid=r.pod.uid)


async def _post(port: int, verb: str, body: Any) -> tuple[int, Any]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as session:
        async with session.post(f"http://127.0.0.1:{port}/{verb}", data=data) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text)
            except ValueError:
                return resp.status, text


def _args(doc: str, **pod_kw: Any) -> dict[str, Any]:
    args = k8s_doc(doc)
    args["Pod"] = pod(
        "trainer-7c9d6b5f4-x2kqp", uid="5f0c9a57-2b1e-4c5e-9d7a-3c1b8e4f6a21", **pod_kw
    )
    return args


async def _ready(bus: Bus, start: Start, kube: Any = None, apiserver: Any = None) -> Any:
    await _fleet(bus)
    if isinstance(kube, FakeKube):
        _held_pods(kube.add_pod)
    elif apiserver is not None:
        _held_pods(apiserver.add_pod)
    sched = await start(bus, kube)
    await until(
        lambda: (
            len(sched.view.state.nodes) == 3
            and len(sched.view.state.nodes["gpu-node-b"].reservations) == 7
        )
    )
    return sched


async def test_filter_with_node_names_keeps_nodes_with_room_and_says_why_not(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    status, out = await _post(
        sched.port, "filter", _args("extender-filter-args-nodecache.json", plan=A100_TWO)
    )
    assert status == 200
    expected = k8s_doc("extender-filter-result-nodecache.json")
    assert set(out) == set(expected)
    assert out["Nodes"] is None and out["Error"] == ""
    assert out["NodeNames"] == ["gpu-node-a", "gpu-node-c"]
    assert "preemption may help" in out["FailedNodes"]["gpu-node-b"]
    assert out["FailedAndUnresolvableNodes"] == {}


async def test_filter_with_full_node_objects_returns_those_objects(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = _args("extender-filter-args-gpu-pod-3-nodes.json", plan=A100_TWO)
    status, out = await _post(sched.port, "filter", args)
    assert status == 200 and out["NodeNames"] is None
    assert out["Nodes"]["items"] == [args["Nodes"]["items"][0], args["Nodes"]["items"][2]]
    assert list(out["FailedNodes"]) == ["gpu-node-b"]


async def test_pods_without_compute_requests_pass_unchanged_and_unknown_nodes_fail(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    plain = k8s_doc("extender-filter-args-nodecache.json")
    plain["NodeNames"].append("not-a-gpu-node")
    status, out = await _post(sched.port, "filter", plain)
    assert status == 200 and out["NodeNames"] == plain["NodeNames"]
    assert not out["FailedNodes"] and not out["FailedAndUnresolvableNodes"]
    args = _args("extender-filter-args-nodecache.json", plan=A100_TWO)
    args["NodeNames"] = ["ghost", "gpu-node-a"]
    status, out = await _post(sched.port, "filter", args)
    assert out["NodeNames"] == ["gpu-node-a"]
    assert "unknown to HCS" in out["FailedAndUnresolvableNodes"]["ghost"]


async def test_a_pod_with_requests_but_no_plan_annotation_gets_a_computed_plan(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = _args(
        "extender-filter-args-nodecache.json",
        requests={"ai.compute/vram": "16Gi", "ai.compute/acu": "20"},
    )
    status, out = await _post(sched.port, "filter", args)
    assert status == 200 and out["NodeNames"] == NAMES


async def test_malformed_arguments_get_400_with_the_reason(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    good = _args("extender-filter-args-nodecache.json", plan=A100_TWO)
    for verb, body in [
        ("filter", b"{not json"),
        ("filter", {"Pod": 3, "NodeNames": []}),
        ("filter", {**good, "NodeNames": "gpu-node-a"}),
        ("filter", b'{"Pod": {"metadata": {"name": "\xff"}}, "NodeNames": []}'),
        ("prioritize", {"NodeNames": ["a"]}),
        ("bind", {"PodName": "x"}),
        ("preempt", {"Pod": good["Pod"], "NodeNameToMetaVictims": {"a": {"Pods": 1}}}),
    ]:
        status, text = await _post(sched.port, verb, body)
        assert status == 400, (verb, body)
        assert f"bad {verb} arguments" in text


async def test_prioritize_scores_every_node_from_zero_to_ten(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    slice_plan = {**A100_TWO, "devices": 1, "vram_mib_per_device": 8192, "whole_device": False}
    status, out = await _post(
        sched.port, "prioritize", _args("extender-filter-args-nodecache.json", plan=slice_plan)
    )
    assert status == 200
    assert [h["Host"] for h in out] == NAMES
    scores = {h["Host"]: h["Score"] for h in out}
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores["gpu-node-b"] > scores["gpu-node-a"]  # bin-packing: the used node first


async def test_bind_books_devices_posts_the_binding_and_announces_it(
    bus: Bus, start_scheduler: Start
) -> None:
    kube = FakeKube()
    sched = await _ready(bus, start_scheduler, kube)
    ckpt = await bus.js.key_value(streams.KV_CKPT)
    cp = CheckpointEvent(
        namespace="ml-team", job="llm", uri="s3://ckpt/llm/100", step=100, time_s=1.0
    )
    await ckpt.put(subjects.ckpt_key("ml-team", "llm"), messages.encode(cp))
    sub = await bus.nc.subscribe(subjects.alloc("gpu-node-c"))
    args = _args("extender-filter-args-nodecache.json", plan=A100_TWO, labels={"hcs.io/job": "llm"})
    await _post(sched.port, "filter", args)
    status, out = await _post(sched.port, "bind", k8s_doc("extender-binding-args.json"))
    assert status == 200 and out == k8s_doc("extender-binding-result.json")
    [binding] = kube.bindings
    assert binding["node"] == "gpu-node-c"
    notes = binding["annotations"]
    assert notes["hcs.io/devices"] == "GPU-A100-80G-0,GPU-A100-80G-1"
    assert notes["hcs.io/vram-quota"] == "0:81920Mi,1:81920Mi"
    assert notes["hcs.io/resume-from"] == "s3://ckpt/llm/100"
    event = messages.decode((await sub.next_msg(timeout=5)).data, AllocationEvent)
    assert event.state == "bound" and event.job == "llm" and len(event.devices) == 2
    assert event.annotations == notes  # the audit on hcs.alloc.* says what the pod was given
    await sched.booker.settle()  # the mark rides the node's next write, or comes a second later
    doc = await sched.booker.read("gpu-node-c")
    assert doc.doc is not None and [r.state for r in doc.doc.reservations] == ["bound"]
    await sub.unsubscribe()


async def test_bind_never_resumes_from_a_checkpoint_whose_body_names_another_namespace(
    bus: Bus, start_scheduler: Start
) -> None:
    kube = FakeKube()
    sched = await _ready(bus, start_scheduler, kube)
    ckpt = await bus.js.key_value(streams.KV_CKPT)
    foreign = CheckpointEvent(namespace="other", job="llm", uri="s3://other/llm", step=9, time_s=1)
    await ckpt.put(subjects.ckpt_key("ml-team", "llm"), messages.encode(foreign))
    args = _args("extender-filter-args-nodecache.json", plan=A100_TWO, labels={"hcs.io/job": "llm"})
    await _post(sched.port, "filter", args)
    status, out = await _post(sched.port, "bind", k8s_doc("extender-binding-args.json"))
    assert status == 200 and out == k8s_doc("extender-binding-result.json")
    [binding] = kube.bindings
    assert binding["annotations"]["hcs.io/devices"]  # bound, but without a resume point
    assert "hcs.io/resume-from" not in binding["annotations"]


async def test_bind_through_the_api_server_sets_the_annotations_on_the_pod(
    bus: Bus, start_scheduler: Start, apiserver: Any, kube: Any
) -> None:
    sched = await _ready(bus, start_scheduler, kube, apiserver)
    apiserver.add_pod(
        "ml-team",
        "trainer",
        annotations={"hcs.io/plan": json.dumps(A100_TWO)},
        scheduler_name="hcs-scheduler",
        phase="Pending",
    )
    uid = apiserver.pods[("ml-team", "trainer")]["metadata"]["uid"]
    args = {"PodName": "trainer", "PodNamespace": "ml-team", "PodUID": uid, "Node": "gpu-node-a"}
    status, out = await _post(sched.port, "bind", args)
    assert status == 200 and out == {"Error": ""}
    bound = apiserver.pods[("ml-team", "trainer")]
    assert bound["spec"]["nodeName"] == "gpu-node-a"
    assert bound["metadata"]["annotations"]["hcs.io/vram-quota"] == "0:81920Mi,1:81920Mi"


async def test_bind_without_a_cluster_records_and_says_so_in_the_event(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    sub = await bus.nc.subscribe(subjects.alloc("gpu-node-c"))
    await _post(sched.port, "filter", _args("extender-filter-args-nodecache.json", plan=A100_TWO))
    _status, out = await _post(sched.port, "bind", k8s_doc("extender-binding-args.json"))
    assert out == {"Error": ""}
    event = messages.decode((await sub.next_msg(timeout=5)).data, AllocationEvent)
    assert event.reason == "no cluster: Binding not posted"
    assert event.annotations["hcs.io/vram-quota"] == "0:81920Mi,1:81920Mi"
    await sub.unsubscribe()


async def test_preempt_proposes_lower_priority_victims_only_where_it_helps(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = k8s_doc("extender-preempt-args-nodecache.json")
    args["Pod"] = pod("trainer", plan=A100_TWO, priority=100)
    args["NodeNameToMetaVictims"]["ghost"] = {"Pods": [], "NumPDBViolations": 0}
    status, out = await _post(sched.port, "preempt", args)
    assert status == 200 and set(out) == {"NodeNameToMetaVictims"}
    victims = out["NodeNameToMetaVictims"]
    assert set(victims) == {"gpu-node-a", "gpu-node-b"}
    uids_b = [p["UID"] for p in victims["gpu-node-b"]["Pods"]]
    assert uids_b[0] == "7a1b2c3d-4e5f-4a6b-8c7d-9e0f1a2b3c4d" and len(uids_b) == 2
    assert victims["gpu-node-a"] == args["NodeNameToMetaVictims"]["gpu-node-a"]
    args["Pod"] = pod("trainer", plan=A100_TWO, priority=0)
    status, out = await _post(sched.port, "preempt", args)
    assert "gpu-node-b" not in out["NodeNameToMetaVictims"]


async def test_readyz_answers_503_until_the_view_has_replayed(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    async with aiohttp.ClientSession() as session:
        base = f"http://127.0.0.1:{sched.port}"
        sched.view.ready.clear()
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 503
        _status, out = await _post(
            sched.port, "filter", _args("extender-filter-args-nodecache.json", plan=A100_TWO)
        )
        assert "not replayed" in out["Error"]
        sched.view.ready.set()
        async with session.get(f"{base}/readyz") as resp:
            assert resp.status == 200
        async with session.get(f"{base}/healthz") as resp:
            assert resp.status == 200
        async with session.get(f"{base}/metrics") as resp:
            assert "hcs_scheduler_fragmentation_ratio" in await resp.text()
    await asyncio.sleep(0)


async def test_an_internal_failure_is_answered_with_its_reason_never_a_bare_500(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)

    async def broken(*_args: Any, **_kw: Any) -> str:
        raise RuntimeError("reservation store exploded")

    sched.extender.booker.bind = broken
    await _post(sched.port, "filter", _args("extender-filter-args-nodecache.json", plan=A100_TWO))
    status, out = await _post(sched.port, "bind", k8s_doc("extender-binding-args.json"))
    assert status == 200 and "reservation store exploded" in out["Error"]
    sched.extender.planner.demand = broken
    args = _args("extender-filter-args-nodecache.json", requests={"ai.compute/vram": "16Gi"})
    status, out = await _post(sched.port, "filter", args)
    assert status == 200 and out["NodeNames"] is None and "exploded" in out["Error"]
    status, text = await _post(sched.port, "prioritize", args)
    assert status == 503 and "exploded" in text


def _unresolvable_everywhere(out: dict[str, Any], *, names: list[str], words: str) -> None:
    assert out["Error"] == "" and not out["FailedNodes"]
    assert out["NodeNames"] == [] and out["Nodes"] is None
    assert set(out["FailedAndUnresolvableNodes"]) == set(names)
    assert all(words in why for why in out["FailedAndUnresolvableNodes"].values()), out


async def test_a_pod_no_node_could_ever_hold_is_unresolvable_on_every_node_not_an_error(
    bus: Bus, start_scheduler: Start, apiserver: Any, kube: Any
) -> None:
    apiserver.add_quota("tiny", "gpu", {"hard": {"ai.compute/vram": "1Gi"}})
    sched = await _ready(bus, start_scheduler, kube, apiserver)
    nine = {**A100_TWO, "devices": 9}
    absent = {**A100_TWO, "model": "B300"}
    cases = [
        (_args("extender-filter-args-nodecache.json", plan=nine), "pod needs 9"),
        (_args("extender-filter-args-nodecache.json", plan=absent), "no nvidia/B300 devices"),
        (  # a plan refused: no class can hold 5,000 ACU on one node
            _args("extender-filter-args-nodecache.json", requests={"ai.compute/acu": "5000"}),
            "largest",
        ),
        (  # a plan refused: the namespace's quota
            _args("extender-filter-args-nodecache.json", requests={"ai.compute/vram": "16Gi"}),
            "quota",
        ),
        (  # a pod HCS cannot read
            _args("extender-filter-args-nodecache.json", requests={"ai.compute/acu": "1.5"}),
            "whole number",
        ),
    ]
    cases[3][0]["Pod"]["metadata"]["namespace"] = "tiny"
    for args, words in cases:
        status, out = await _post(sched.port, "filter", args)
        assert status == 200
        _unresolvable_everywhere(out, names=NAMES, words=words)
    bad_plan = _args("extender-filter-args-nodecache.json")
    bad_plan["Pod"]["metadata"]["annotations"]["hcs.io/plan"] = '{"vendor": 1}'
    status, out = await _post(sched.port, "filter", bad_plan)
    _unresolvable_everywhere(out, names=NAMES, words="hcs.io/plan")


async def test_an_unresolvable_answer_with_full_node_objects_returns_an_empty_list(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    args = _args("extender-filter-args-gpu-pod-3-nodes.json", plan={**A100_TWO, "devices": 9})
    status, out = await _post(sched.port, "filter", args)
    assert status == 200 and out["Error"] == "" and out["NodeNames"] is None
    assert out["Nodes"]["items"] == [] and set(out["FailedAndUnresolvableNodes"]) == set(NAMES)


async def test_a_pod_that_fits_after_preemption_fails_resolvably_only_where_room_is_held(
    bus: Bus, start_scheduler: Start
) -> None:
    sched = await _ready(bus, start_scheduler)
    two = {**A100_TWO}  # gpu-node-b holds 7 of its 8 devices: preemption could free two
    status, out = await _post(
        sched.port, "filter", _args("extender-filter-args-nodecache.json", plan=two)
    )
    assert status == 200 and out["Error"] == ""
    assert set(out["FailedNodes"]) == {"gpu-node-b"} and out["FailedAndUnresolvableNodes"] == {}


async def test_a_pod_without_soft_preferences_is_filtered_to_the_node_prioritize_ranks_first(
    bus: Bus, start_scheduler: Start
) -> None:
    """A single node passes: kube-scheduler then binds it without scoring and
    never calls prioritize. Only a pod kube-scheduler's scoring has nothing
    to say about is answered so (a ReplicaSet's pod keeps every node)."""
    sched = await _ready(bus, start_scheduler)
    slice_plan = {**A100_TWO, "devices": 1, "vram_mib_per_device": 8192, "whole_device": False}
    args = _args("extender-filter-args-nodecache.json", plan=slice_plan)
    del args["Pod"]["metadata"]["ownerReferences"]  # a bare pod
    _, ranked = await _post(sched.port, "prioritize", args)
    scores = {h["Host"]: h["Score"] for h in ranked}
    status, out = await _post(sched.port, "filter", args)
    assert status == 200 and out["NodeNames"] == [max(NAMES, key=lambda n: scores[n])]
    assert out["NodeNames"] == ["gpu-node-b"]  # bin-packing: the used node
    assert out["FailedNodes"] == {} and out["FailedAndUnresolvableNodes"] == {}
    owned = _args("extender-filter-args-nodecache.json", plan=slice_plan)
    _, out = await _post(sched.port, "filter", owned)
    assert out["NodeNames"] == NAMES


async def test_picking_in_filter_can_be_turned_off(bus: Bus, start_scheduler: Start) -> None:
    await _fleet(bus)
    sched = await start_scheduler(bus, None, pick_in_filter=False)
    await until(lambda: len(sched.view.state.nodes) == 3)
    slice_plan = {**A100_TWO, "devices": 1, "vram_mib_per_device": 8192, "whole_device": False}
    args = _args("extender-filter-args-nodecache.json", plan=slice_plan)
    del args["Pod"]["metadata"]["ownerReferences"]
    _, out = await _post(sched.port, "filter", args)
    assert out["NodeNames"] == NAMES


def _bare(name: str, plan: dict[str, Any]) -> dict[str, Any]:
    """Filter args of a bare pod ``name``: filter answers it with one node."""
    args = k8s_doc("extender-filter-args-nodecache.json")
    args["Pod"] = pod(name, plan=plan)
    args["Pod"]["metadata"].pop("ownerReferences", None)
    return args


@pytest.mark.parametrize("placement", ["spread", "pack"])
async def test_under_spread_a_burst_picked_before_any_bind_takes_the_emptiest_nodes_in_turn(
    bus: Bus, start_scheduler: Start, placement: str
) -> None:
    """kube-scheduler binds in the background and hands each pod the nodes in
    the same order: the empty gpu-node-a and gpu-node-c tie, and a burst that
    did not count the pods picked for them would fill gpu-node-a first (as
    pack does, which keeps to gpu-node-b: the fullest)."""
    kube = FakeKube()
    await _fleet(bus)
    _held_pods(kube.add_pod)
    sched = await start_scheduler(bus, kube, placement=placement)
    await until(lambda: len(sched.view.state.nodes["gpu-node-b"].reservations) == 7)
    await until(lambda: len(sched.view.state.nodes) == 3)
    slice_plan = {**A100_TWO, "devices": 1, "vram_mib_per_device": 8192, "whole_device": False}
    picked: list[str] = []
    for i in range(6):
        status, out = await _post(sched.port, "filter", _bare(f"s{i}", slice_plan))
        assert status == 200 and len(out["NodeNames"]) == 1
        picked += out["NodeNames"]
    if placement == "pack":
        assert picked == ["gpu-node-b"] * 6
    else:
        assert picked == ["gpu-node-a", "gpu-node-c"] * 3


async def test_pods_picked_for_a_node_and_not_yet_bound_there_leave_room_for_the_next_ones(
    bus: Bus, start_scheduler: Start
) -> None:
    """kube-scheduler binds in the background, so the next pods' filters come
    before the first binds have booked anything. gpu-node-b (the fullest:
    packed first) has room for two 40 GiB slices: the third pod goes
    elsewhere, not to a bind that would refuse it."""
    kube = FakeKube()
    sched = await _ready(bus, start_scheduler, kube)
    half = {**A100_TWO, "devices": 1, "vram_mib_per_device": 40960, "whole_device": False}
    picked = []
    for name in ("p1", "p2", "p3"):
        status, out = await _post(sched.port, "filter", _bare(name, half))
        assert status == 200 and len(out["NodeNames"]) == 1
        picked += out["NodeNames"]
    assert picked[:2] == ["gpu-node-b", "gpu-node-b"] and picked[2] != "gpu-node-b"
    again = await _post(sched.port, "filter", _bare("p3", half))  # its own pick is not in its way
    assert again[1]["NodeNames"] == picked[2:]

    # p1 is booked on gpu-node-b: its pick gives way to its reservation, p2's stays
    bind = {"PodName": "p1", "PodNamespace": "ml-team", "PodUID": "uid-p1", "Node": "gpu-node-b"}
    status, out = await _post(sched.port, "bind", bind)
    assert status == 200 and out["Error"] == ""
    await until(lambda: "ml-team/p1" in sched.view.state.nodes["gpu-node-b"].reservations)
    _, out = await _post(sched.port, "filter", _bare("p4", half))
    assert out["NodeNames"] != ["gpu-node-b"]
    node_b = sched.view.state.nodes["gpu-node-b"]
    held = sched.extender.picks.on(
        "gpu-node-b", besides="", booked=node_b.reservations.__contains__
    )
    assert held == [sched.extender.picks._nodes["gpu-node-b"]["uid-p2"].demand]
    assert len(sched.extender.picks) == 3  # p2, p3, p4
    # a bind refused lets its pick go at once
    bind = {"PodName": "p4", "PodNamespace": "ml-team", "PodUID": "uid-p4", "Node": "nowhere"}
    status, out = await _post(sched.port, "bind", bind)
    assert status == 200 and "unknown to HCS" in out["Error"]
    assert len(sched.extender.picks) == 2
