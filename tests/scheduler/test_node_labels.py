"""Network labels from Node objects (pure parts): the Node's win over the
fingerprint's, a label removed from the Node stops counting, the fingerprint
counts only without a Node; job affinity and the per-node caches follow."""

from __future__ import annotations

import msgspec

from hcs_bus.messages import NodeReservations
from scheduler.extender import rules as placing
from scheduler.extender.caches import NodeCache
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.view.state import ClusterState, booked
from tests.scheduler.helpers import node_fp, pod_info, state_of
from tests.view.factories import reservation

SLICE = PlanAnnotation(
    vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=16384, whole_device=False
)
ONLY_AFFINITY = placing.Weights(binpack=0, health=0, right_size=0, topology=0, job_affinity=1)


def _group(state: ClusterState, node: str) -> str | None:
    return placing.network_group(state.nodes[node])


def test_a_node_label_wins_over_the_fingerprints() -> None:
    state = state_of(node_fp("a", labels={"hcs.io/network-group": "from-agent"}))
    assert _group(state, "a") == "from-agent"

    assert state.apply_node("a", {"hcs.io/network-group": "from-node"})
    assert _group(state, "a") == "from-node"


def test_a_label_removed_from_the_node_stops_counting_even_if_the_fingerprint_has_it() -> None:
    state = state_of(node_fp("a", labels={"hcs.io/rdma-fabric": "ib-old"}))
    state.apply_node("a", {"hcs.io/rdma-fabric": "ib-a", "kubernetes.io/hostname": "a"})
    assert _group(state, "a") == "ib-a"

    assert state.apply_node("a", {"kubernetes.io/hostname": "a"})
    assert _group(state, "a") is None
    assert "hcs.io/rdma-fabric" not in state.nodes["a"].labels


def test_the_rdma_fabric_names_the_group_before_the_network_group() -> None:
    state = state_of(node_fp("a"))
    state.apply_node("a", {"hcs.io/network-group": "ng-a", "hcs.io/rdma-fabric": "ib-a"})
    assert _group(state, "a") == "ib-a"


def test_a_deleted_node_leaves_the_fingerprint_labels_in_force() -> None:
    state = state_of(node_fp("a", labels={"hcs.io/network-group": "ng-fp"}))
    state.apply_node("a", {"hcs.io/network-group": "ng-node"})
    assert state.apply_node("a", None)
    assert _group(state, "a") == "ng-fp"
    assert not state.apply_node("a", None)  # nothing held: no change


def test_node_labels_outlive_a_new_fingerprint_and_arrive_before_the_first() -> None:
    state = ClusterState()
    assert state.apply_node("a", {"hcs.io/network-group": "ng-a"})
    state.apply_fingerprint(node_fp("a", seq=1), now=0.0)
    assert _group(state, "a") == "ng-a"
    state.apply_fingerprint(node_fp("a", seq=2), now=1.0)
    assert _group(state, "a") == "ng-a"


def test_the_same_labels_again_are_no_change() -> None:
    state = state_of(node_fp("a"))
    assert state.apply_node("a", {"x": "1"})
    assert not state.apply_node("a", {"x": "1"})
    assert state.apply_node("a", {"x": "2"})


def test_other_fingerprint_labels_stay_beside_the_nodes() -> None:
    state = state_of(node_fp("a", labels={"hcs.io/model": "A100-80G", "x": "fp"}))
    state.apply_node("a", {"x": "node"})
    assert state.nodes["a"].labels == {"hcs.io/model": "A100-80G", "x": "node"}


def test_a_booked_copy_keeps_the_node_labels() -> None:
    state = state_of(node_fp("a"))
    state.apply_node("a", {"hcs.io/rdma-fabric": "ib-a"})
    copy = booked(state.nodes["a"], NodeReservations(node="a"))
    assert placing.network_group(copy) == "ib-a"


def _job_pod(name: str) -> PodInfo:
    return pod_info(name, uid=f"u-{name}", job="train")


def _cache_with_job_on(state: ClusterState, node: str) -> NodeCache:
    held = msgspec.structs.replace(reservation("ml", "train-0", [(0, 16384, False)]), job="train")
    state.apply_reservations(node, NodeReservations(node=node, reservations=(held,)))
    cache = NodeCache(state, weights=ONLY_AFFINITY)
    for name in state.nodes:
        cache.changed(name)
    return cache


def test_job_groups_and_affinity_come_from_node_labels() -> None:
    state = state_of(node_fp("a"), node_fp("b"), node_fp("c"))
    for name, group in (("a", "ng-1"), ("b", "ng-1"), ("c", "ng-2")):
        state.apply_node(name, {"hcs.io/network-group": group})
    cache = _cache_with_job_on(state, "a")
    groups = cache.job_groups(_job_pod("train-1"))
    assert groups == {"ng-1"}
    scores = cache.of(SLICE).scores(["b", "c"], job_groups=groups)
    assert [(s.host, s.score) for s in scores] == [("b", 10), ("c", 0)]


def test_a_node_whose_labels_change_is_scored_afresh_once_the_cache_hears_of_it() -> None:
    state = state_of(node_fp("a"), node_fp("b"))
    state.apply_node("a", {"hcs.io/network-group": "ng-1"})
    state.apply_node("b", {"hcs.io/network-group": "ng-2"})
    cache = _cache_with_job_on(state, "a")
    demand = cache.of(SLICE)
    assert demand.scores(["b"], job_groups={"ng-1"})[0].score == 0

    state.apply_node("b", {"hcs.io/network-group": "ng-1"})
    assert demand.scores(["b"], job_groups={"ng-1"})[0].score == 0  # cached until told
    cache.changed("b")
    assert demand.scores(["b"], job_groups={"ng-1"})[0].score == 10
