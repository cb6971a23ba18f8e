"""The planner's cluster summary: rebuilt on a change at most every
``max_age_s``, except while the one it holds has no class (a replica just
started: its fleet's first fingerprints must not meet a 403)."""

from __future__ import annotations

from hcs_bus.messages import PlanRequest, Requests
from scheduler.plan.service import Planner
from scheduler.quota.source import QuotaSource
from scheduler.replica import profile_db
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import node_fp

A_SLICE = PlanRequest(namespace="ml", requests=Requests(vram_mib=16 * 1024))


def _planner(state: ClusterState) -> Planner:
    quotas = QuotaSource(kube=None, file=None)
    return Planner(state, profiles=profile_db(), quotas=quotas, max_age_s=3600.0)


async def test_an_empty_summary_is_rebuilt_at_the_first_change_not_after_max_age() -> None:
    state = ClusterState()
    planner = _planner(state)
    assert planner.summary().classes == {}  # a replica that just started
    refused = await planner.plan(A_SLICE)
    assert not refused.ok and "holds no devices" in refused.reason
    state.apply_fingerprint(node_fp("gpu-a"), now=0.0)
    planner.changed("gpu-a")
    assert set(planner.summary().classes) == {"nvidia/A100-80G"}
    assert (await planner.plan(A_SLICE)).ok


async def test_a_summary_with_classes_waits_max_age_before_a_change_shows() -> None:
    state = ClusterState()
    state.apply_fingerprint(node_fp("gpu-a"), now=0.0)
    planner = _planner(state)
    held = planner.summary()
    state.apply_fingerprint(node_fp("npu-b", "huawei/Ascend910B2"), now=0.0)
    planner.changed("npu-b")
    assert planner.summary() is held  # plans stay O(classes) under a stream of changes
    planner.max_age_s = 0.0
    assert set(planner.summary().classes) == {"nvidia/A100-80G", "huawei/Ascend910B2"}
