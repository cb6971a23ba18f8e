"""A failed device is out of filter, prioritize, bind and plans; the node's
healthy devices stay placeable (docs/architecture.md#health: isolate the device, not the node)."""

from __future__ import annotations

import pytest

from hcs_bus.messages import Plan, PlanRequest, Policy, Requests
from scheduler.extender import rules as placing
from scheduler.plan import rules as planning
from scheduler.plan.pods import PlanAnnotation
from scheduler.view.state import ClusterState, booked
from tests.scheduler.helpers import DB, node_fp, state_of
from tests.view.factories import verdict


def whole(n: int) -> PlanAnnotation:
    return PlanAnnotation(
        vendor="nvidia",
        model="A100-80G",
        devices=n,
        vram_mib_per_device=81920,
        whole_device=True,
        acu_per_device=100.0,
    )


def one_device_out(*, node_verdict: str = "degraded") -> ClusterState:
    """An 8 × A100 node whose device 2 failed, as the healer now says it: the
    device failed, the node as a whole ``node_verdict``."""
    state = state_of(node_fp("a100-1"))
    state.apply_health(verdict("a100-1", 2, "failed", score=0))
    state.apply_health(verdict("a100-1", None, node_verdict))
    return state


def test_seven_devices_still_fit_beside_the_failed_one_and_eight_do_not() -> None:
    node = one_device_out().nodes["a100-1"]
    assert node.schedulable
    seven = placing.check_node(node, whole(7))
    assert seven.ok, seven.reason
    chosen = placing.choose_devices(seven, whole(7))
    assert sorted(d.index for d in chosen) == [0, 1, 3, 4, 5, 6, 7]
    eight = placing.check_node(node, whole(8))
    assert not eight.ok and eight.unresolvable  # preemption cannot bring it back
    assert "7 usable nvidia/A100-80G devices of 8" in eight.reason


def test_a_bind_on_the_booked_copy_never_picks_the_failed_device() -> None:
    state = one_device_out()
    view = booked(state.nodes["a100-1"], state.reservations_of("a100-1"))
    for n in range(1, 8):
        fit = placing.check_node(view, whole(n))
        assert fit.ok, fit.reason
        assert 2 not in {d.index for d in placing.choose_devices(fit, whole(n))}


def test_the_failed_device_is_left_out_of_the_scores() -> None:
    state = one_device_out()
    node = state.nodes["a100-1"]
    fit = placing.check_node(node, whole(7))
    parts = placing.components(node, fit, whole(7))
    assert parts.health == pytest.approx(1.0)  # the failed device (score 0) is not chosen


def plan(state: ClusterState, devices: int) -> Plan:
    request = PlanRequest(
        namespace="ml",
        requests=Requests(devices=devices),
        policy=Policy(models=("A100-80G",)),
    )
    summary = planning.summarise(state.nodes.values())
    return planning.plan(request, summary=summary, profiles=DB)


def test_plans_count_only_the_devices_left_in_service() -> None:
    state = one_device_out()
    stats = planning.summarise(state.nodes.values()).classes["nvidia/A100-80G"]
    assert stats.max_usable_per_node == 7 and stats.idle_devices == 7
    seven = plan(state, 7)
    assert seven.ok and (seven.model, seven.devices) == ("A100-80G", 7), seven.reason
    eight = plan(state, 8)
    assert not eight.ok


def test_a_node_isolated_as_a_whole_takes_no_pod() -> None:
    node = one_device_out(node_verdict="failed").nodes["a100-1"]
    assert not node.schedulable
    fit = placing.check_node(node, whole(1))
    assert not fit.ok and "isolated" in fit.reason
    assert "nvidia/A100-80G" not in planning.summarise([node]).classes


def test_the_device_is_back_in_service_when_it_recovers() -> None:
    state = one_device_out()
    state.apply_health(verdict("a100-1", 2, "healthy", score=100))
    state.apply_health(verdict("a100-1", None, "healthy"))
    assert placing.check_node(state.nodes["a100-1"], whole(8)).ok
