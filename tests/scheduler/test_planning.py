"""Plans: sizing, substitution, quota, refusals with reasons for every class."""

from __future__ import annotations

import pytest

from hcs_bus.messages import NodeReservations, PlanRequest, Policy, Requests
from scheduler.plan import rules as planning
from scheduler.plan.explanations import render_plan
from tests.scheduler.helpers import DB, node_fp, state_of
from tests.view.factories import reservation

CLUSTER = (
    node_fp("a100-1", "nvidia/A100-80G"),
    node_fp("ascend-1", "huawei/Ascend910B2"),
    node_fp("t4-1", "nvidia/T4", count=4),
    node_fp("h200-1", "nvidia/H200"),
)


def _summary(
    *, a100_full: bool = False, used_by: str | None = None, nodes: tuple = CLUSTER
) -> planning.Summary:
    state = state_of(*nodes)
    if a100_full:
        r = reservation("other", "hog", [(i, 81920, True) for i in range(8)])
        state.apply_reservations("a100-1", NodeReservations(node="a100-1", reservations=(r,)))
    if used_by:
        import msgspec

        r = msgspec.structs.replace(reservation(used_by, "old", [(0, 40960, False)]), acu=50.0)
        state.apply_reservations("h200-1", NodeReservations(node="h200-1", reservations=(r,)))
    return planning.summarise(state.nodes.values())


def _plan(requests: Requests, policy: Policy | None = None, **kw: object) -> object:
    summary = kw.pop("summary", None) or _summary()
    request = PlanRequest(namespace="ml", requests=requests, policy=policy or Policy())
    return planning.plan(request, summary=summary, profiles=DB, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("requests", "model", "devices", "whole", "vram"),
    [
        (Requests(vram_mib=8192), "T4", 1, False, 8192),
        (Requests(vram_mib=16384, acu=10), "T4", 1, True, 16384),
        (Requests(acu=150), "H200", 1, False, 68290),
        (Requests(acu=200, vram_mib=160_000), "A100-80G", 2, True, 81920),
        (Requests(tflops_fp16=1900), "H200", 2, True, 144384),
        (Requests(devices=1, vram_mib=4096), "T4", 1, False, 4096),
        (Requests(devices=2), "T4", 2, True, 16384),
    ],
)
def test_requests_are_sized_as_slices_or_whole_devices_on_the_best_fitting_class(
    requests: Requests, model: str, devices: int, whole: bool, vram: int
) -> None:
    plan = _plan(requests)
    assert plan.ok, plan.reason
    assert (plan.model, plan.devices, plan.whole_device) == (model, devices, whole)
    assert plan.vram_mib_per_device == pytest.approx(vram, abs=50)
    assert plan.runtime_profile == plan.vendor
    assert {f"{r.vendor}/{r.model}" for r in plan.rejected} | {f"{plan.vendor}/{plan.model}"} == {
        "nvidia/A100-80G",
        "huawei/Ascend910B2",
        "nvidia/T4",
        "nvidia/H200",
    }
    assert all(r.reason for r in plan.rejected)


def test_a_request_no_node_can_ever_hold_is_refused_with_a_reason() -> None:
    plan = _plan(Requests(acu=5000))
    assert not plan.ok
    assert len(plan.rejected) == 4
    assert all("largest" in r.reason for r in plan.rejected)


def test_vendor_policy_rejects_other_vendors_by_name() -> None:
    plan = _plan(Requests(vram_mib=8192), Policy(vendors=("huawei",)))
    assert plan.ok and plan.vendor == "huawei"
    assert all("not allowed by policy" in r.reason for r in plan.rejected)


@pytest.mark.parametrize("substitution", ["allow", "ask", "deny"])
def test_an_exhausted_named_model_is_substituted_only_when_allowed(substitution: str) -> None:
    policy = Policy(models=("A100-80G",), substitution=substitution)  # type: ignore[arg-type]
    summary = _summary(a100_full=True, nodes=CLUSTER[:3])
    plan = _plan(Requests(devices=1), policy, summary=summary)
    if substitution == "allow":
        assert plan.ok
        assert (plan.model, plan.devices, plan.whole_device) == ("Ascend910B2", 2, True)
        assert plan.substituted_from == "nvidia/A100-80G"
        assert "VRAM needs 1.25" in plan.reason
    elif substitution == "ask":
        assert not plan.ok
        assert plan.offer is not None and plan.offer.devices == 2
        assert plan.offer.model == "Ascend910B2" and "ACU needs" in plan.offer.arithmetic
    else:
        assert plan.ok and plan.model == "A100-80G"
        assert "waits" in plan.reason
        assert plan.substituted_from is None


def test_a_named_model_with_room_is_used_without_substitution() -> None:
    plan = _plan(Requests(devices=1), Policy(models=("a100-80g",), substitution="allow"))
    assert plan.ok and plan.model == "A100-80G" and plan.substituted_from is None


def test_quota_refusal_names_namespace_limit_used_and_asked() -> None:
    quota = planning.QuotaLimits(vram_mib=65536, acu=100.0)
    plan = planning.plan(
        PlanRequest(namespace="ml", requests=Requests(vram_mib=30000)),
        summary=_summary(used_by="ml"),
        profiles=DB,
        quota=quota,
    )
    assert not plan.ok and not plan.quota.ok
    for words in ("ml", "65536", "40960", "30000"):
        assert words in plan.quota.reason
    assert plan.reason == plan.quota.reason


def test_render_plan_explains_the_choice_and_every_rejection() -> None:
    plan = _plan(Requests(vram_mib=8192))
    text = render_plan(plan)
    assert text.startswith("PLAN  1 × nvidia/T4 (slice)")
    for r in plan.rejected:
        assert r.reason in text


def test_a_plan_carries_what_the_largest_node_of_its_class_advertises_to_its_kubelet() -> None:
    plan = _plan(Requests(vram_mib=16384, acu=10))
    assert plan.model == "T4"  # type: ignore[attr-defined]
    t4 = DB.get("nvidia/T4")
    assert plan.node_capacity == {  # type: ignore[attr-defined]
        "ai.compute/vram": 4 * t4.vram_mib * 2**20,  # the agent's unit: bytes
        "ai.compute/devices": 4,
    }


SPREAD_FLEET = (
    node_fp("a100-1", "nvidia/A100-80G"),
    node_fp("h100-1", "nvidia/H100-SXM"),
    node_fp("ascend-1", "huawei/Ascend910B2"),
)


def _burst(*, pods: int, spread: bool) -> tuple[dict[str, int], planning.Summary]:
    """``pods`` plans of 16 GiB, each reserved before the next is made (as a
    pledge is counted at once): pods per model, and the summary at the end."""
    state = state_of(*SPREAD_FLEET)
    node_of = {fp.devices[0].model: fp.node for fp in SPREAD_FLEET}
    held: dict[str, list] = {node: [] for node in node_of.values()}
    placed: dict[str, int] = {}
    request = PlanRequest(namespace="ml", requests=Requests(vram_mib=16384))
    for i in range(pods):
        summary = planning.summarise(state.nodes.values())
        plan = planning.plan(request, summary=summary, profiles=DB, spread=spread)
        assert plan.ok and "waits" not in plan.reason, plan.reason
        node = node_of[plan.model]
        held[node].append(reservation("ml", f"p{i}", [(len(held[node]) % 8, 16384, False)]))
        state.apply_reservations(node, NodeReservations(node=node, reservations=tuple(held[node])))
        placed[plan.model] = placed.get(plan.model, 0) + 1
    return placed, planning.summarise(state.nodes.values())


def test_pack_puts_a_burst_of_equally_sized_pods_in_the_cheapest_class_that_fits() -> None:
    placed, _ = _burst(pods=30, spread=False)
    cheapest = min(SPREAD_FLEET, key=lambda fp: fp.devices[0].compute.acu).devices[0].model
    assert placed == {cheapest: 30}


def test_spread_puts_a_burst_over_the_classes_keeping_their_free_shares_level() -> None:
    placed, summary = _burst(pods=30, spread=True)
    assert set(placed) == {"A100-80G", "H100-SXM", "Ascend910B2"}
    shares = [planning.free_share(stats) for stats in summary.classes.values()]
    # each pod went to the class with the most free: they end within one pod's share
    assert max(shares) - min(shares) <= 16384 / (8 * 65536) + 1e-9
    assert sum(placed.values()) == 30


def test_under_spread_a_class_passed_over_is_told_by_its_free_share() -> None:
    state = state_of(*SPREAD_FLEET)
    hog = reservation("other", "hog", [(i, 81920, True) for i in range(4)])
    state.apply_reservations("a100-1", NodeReservations(node="a100-1", reservations=(hog,)))
    summary = planning.summarise(state.nodes.values())
    plan = _plan(Requests(vram_mib=16384), summary=summary, spread=True)
    assert plan.model in {"H100-SXM", "Ascend910B2"}
    why = {r.model: r.reason for r in plan.rejected}
    assert why["A100-80G"].startswith("nvidia/A100-80G has 50% of its VRAM free")
    assert why["A100-80G"].endswith("100% (placement: spread)")
