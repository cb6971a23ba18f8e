"""Nodes that take no new pods (cordoned, or tainted by the node lifecycle):
their room is not room. Read from real Node objects' shapes; the plan, the
class summary and the filter all leave such a node out, and take it back
once its Node takes pods again."""

from __future__ import annotations

from typing import Any

import pytest

from hcs_bus.messages import PlanRequest, Policy, Requests
from hcs_bus.settings import SchedulerSettings
from scheduler.ledger.release_loop import node_block, on_node_event
from scheduler.plan import rules as planning
from scheduler.view.follow_loop import ClusterView
from tests.scheduler.helpers import DB, node_fp, state_of


def _node(name: str, *, unschedulable: bool = False, taints: list[dict[str, str]] | None = None):
    spec: dict[str, Any] = {"podCIDR": "10.0.0.0/24"}
    if unschedulable:
        spec["unschedulable"] = True
    if taints is not None:
        spec["taints"] = taints
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
    }


UNREACHABLE = {
    "key": "node.kubernetes.io/unreachable",
    "effect": "NoSchedule",
    "timeAdded": "2026-11-26T21:50:00Z",
}


@pytest.mark.parametrize(
    ("node", "why"),
    [
        (_node("n", unschedulable=True), "cordoned (spec.unschedulable)"),
        (_node("n", taints=[UNREACHABLE]), "taint node.kubernetes.io/unreachable:NoSchedule"),
        (
            _node("n", taints=[{"key": "node.kubernetes.io/not-ready", "effect": "NoExecute"}]),
            "taint node.kubernetes.io/not-ready:NoExecute",
        ),
        (_node("n"), None),
        (_node("n", taints=[{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]), None),
        (
            _node("n", taints=[{"key": "node.kubernetes.io/out-of-service", "effect": "Other"}]),
            None,
        ),
        (
            _node(
                "n",
                taints=[
                    {"key": "node.kubernetes.io/memory-pressure", "effect": "PreferNoSchedule"}
                ],
            ),
            None,
        ),
        ({"metadata": {"name": "n"}}, None),
    ],
    ids=[
        "cordoned",
        "unreachable",
        "not-ready",
        "plain",
        "user-taint",
        "odd-effect",
        "prefer",
        "no-spec",
    ],
)
def test_a_node_is_blocked_when_cordoned_or_tainted_by_the_node_lifecycle(
    node: dict[str, Any], why: str | None
) -> None:
    assert node_block(node) == why


def _summary_classes(view: ClusterView) -> dict[str, int]:
    summary = planning.summarise(view.state.nodes.values())
    return {key: stats.free_mib for key, stats in summary.classes.items()}


def test_a_blocked_node_leaves_the_plan_and_comes_back_when_its_node_takes_pods_again() -> None:
    view = ClusterView(None, settings=SchedulerSettings())  # type: ignore[arg-type]
    for fp in (node_fp("a100-1", "nvidia/A100-80G"), node_fp("h200-1", "nvidia/H200")):
        view.state.apply_fingerprint(fp, now=0.0)
    heard: list[str] = []
    view.listeners.append(heard.append)
    request = PlanRequest(namespace="ml", requests=Requests(vram_mib=16384), policy=Policy())

    def planned() -> str:
        summary = planning.summarise(view.state.nodes.values())
        plan = planning.plan(request, summary=summary, profiles=DB)
        assert plan.ok, plan.reason
        return plan.model

    first = planned()
    blocked = "a100-1" if first == "A100-80G" else "h200-1"
    assert on_node_event(view, "MODIFIED", _node(blocked, taints=[UNREACHABLE]))
    assert heard == [blocked]
    assert not view.state.nodes[blocked].schedulable
    assert view.state.nodes[blocked].blocked == "taint node.kubernetes.io/unreachable:NoSchedule"
    assert blocked not in {n.name for n in view.state.schedulable()}
    assert planned() != first  # the other class, the only room left
    assert all(not key.endswith(first) for key in _summary_classes(view))

    assert not on_node_event(view, "MODIFIED", _node(blocked, taints=[UNREACHABLE]))  # same
    assert on_node_event(view, "MODIFIED", _node(blocked))
    assert view.state.nodes[blocked].schedulable
    assert planned() == first


def test_a_block_seen_before_the_fingerprint_holds_when_it_arrives_and_a_deleted_node_drops_it():
    state = state_of()
    assert state.apply_node("a", {}, blocked="cordoned (spec.unschedulable)")
    state.apply_fingerprint(node_fp("a"), now=0.0)
    assert not state.nodes["a"].schedulable
    assert state.apply_node("a", None)  # the Node was deleted: nothing blocks it any more
    assert state.nodes["a"].schedulable
    assert not state.apply_node("a", None)
