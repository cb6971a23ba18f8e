"""Pure device decisions: filter, device sets, scores, victims."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus.messages import NodeReservations
from scheduler.extender import rules as placing
from scheduler.extender.caches import NodeCache
from scheduler.plan.pods import PlanAnnotation
from scheduler.view.state import booked
from tests.scheduler.helpers import a100_slice, dev, node_fp, state_of
from tests.view.factories import reservation, verdict

SLICE = PlanAnnotation(
    vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=16384, whole_device=False
)
TWO = PlanAnnotation(
    vendor="nvidia",
    model="A100-80G",
    devices=2,
    vram_mib_per_device=81920,
    whole_device=True,
    acu_per_device=100.0,
)


def _reserve(
    state, node: str, slices: list[tuple[int, int, bool]], *, name: str = "x", priority: int = 0
) -> None:
    held = state.reservations_of(node)
    before = held.reservations if held else ()
    r = reservation("other", name, slices)
    import msgspec

    r = msgspec.structs.replace(r, priority=priority)
    state.apply_reservations(node, NodeReservations(node=node, reservations=(*before, r)))


@pytest.mark.parametrize(
    ("setup", "demand", "ok", "unresolvable", "words"),
    [
        ("none", SLICE, True, False, ""),
        ("stale", SLICE, False, True, "stale"),
        ("node_failed", SLICE, False, True, "isolated"),
        ("all_slices_full", SLICE, False, False, "preemption may help"),
        ("one_whole_taken", TWO, True, False, ""),
        ("seven_whole_taken", TWO, False, False, "1 nvidia/A100-80G idle"),
        ("seven_failed", TWO, False, True, "1 usable"),
        ("slice_on_every", TWO, False, False, "idle"),
    ],
)
def test_a_node_is_filtered_by_health_staleness_and_free_capacity(
    setup: str, demand: PlanAnnotation, ok: bool, unresolvable: bool, words: str
) -> None:
    state = state_of(node_fp("n1"))
    node = state.nodes["n1"]
    if setup == "stale":
        node.stale = True
    elif setup == "node_failed":
        state.apply_health(verdict("n1", None, "failed"))
    elif setup == "all_slices_full":
        _reserve(state, "n1", [(i, 70000, False) for i in range(8)])
    elif setup == "one_whole_taken":
        _reserve(state, "n1", [(0, 81920, True)])
    elif setup == "seven_whole_taken":
        _reserve(state, "n1", [(i, 81920, True) for i in range(7)])
    elif setup == "seven_failed":
        for i in range(7):
            state.apply_health(verdict("n1", i, "failed"))
    elif setup == "slice_on_every":
        _reserve(state, "n1", [(i, 1024, False) for i in range(8)])
    fit = placing.check_node(state.nodes["n1"], demand)
    assert (fit.ok, fit.unresolvable) == (ok, unresolvable), fit.reason
    assert words in fit.reason


def test_unknown_nodes_and_wrong_classes_cannot_be_helped_by_preemption() -> None:
    state = state_of(node_fp("ascend", "huawei/Ascend910B2"))
    assert placing.check_node(None, SLICE).unresolvable
    wrong = placing.check_node(state.nodes["ascend"], SLICE)
    assert wrong.unresolvable and "huawei/Ascend910B2" in wrong.reason


def test_a_failed_device_is_never_chosen() -> None:
    state = state_of(node_fp("n1", count=2))
    state.apply_health(verdict("n1", 0, "failed"))
    fit = placing.check_node(state.nodes["n1"], SLICE)
    assert [d.index for d in placing.choose_devices(fit, SLICE)] == [1]


def test_a_slice_goes_to_the_fullest_device_that_still_fits() -> None:
    state = state_of(node_fp("n1", count=3))
    _reserve(state, "n1", [(1, 60000, False)], name="a")
    _reserve(state, "n1", [(2, 70000, False)], name="b")
    fit = placing.check_node(state.nodes["n1"], SLICE)
    assert [d.index for d in placing.choose_devices(fit, SLICE)] == [1]


NPU_SLICE = msgspec.structs.replace(SLICE, vendor="huawei", model="Ascend910B2")


@pytest.mark.parametrize(("driver_mib", "room"), [(0, True), (3161, False)])
def test_what_the_driver_holds_is_never_promised(driver_mib: int, room: bool) -> None:
    """A 910B of 64 GiB holding three 16 GiB slices has room for a fourth
    only if its driver holds nothing (it holds about 3 GiB at rest)."""
    npu = dev(0, "huawei/Ascend910B2", driver_mib=driver_mib)
    state = state_of(node_fp("npu", devices=(npu,)))
    _reserve(state, "npu", [(0, 3 * 16384, False)])
    fit = placing.check_node(state.nodes["npu"], NPU_SLICE)
    assert fit.ok is room, fit.reason


def test_a_slice_larger_than_the_driver_leaves_is_refused_for_good_naming_the_hold() -> None:
    npu = dev(0, "huawei/Ascend910B2", driver_mib=3161)
    state = state_of(node_fp("npu", devices=(npu,)))
    big = msgspec.structs.replace(NPU_SLICE, vram_mib_per_device=63488)
    fit = placing.check_node(state.nodes["npu"], big)
    assert fit.unresolvable
    assert "the driver holds 3161 MiB of each 65536 MiB" in fit.reason
    assert "at most 62375 MiB can be promised" in fit.reason
    whole = msgspec.structs.replace(NPU_SLICE, vram_mib_per_device=0, whole_device=True)
    fit = placing.check_node(state.nodes["npu"], whole)
    [held] = placing.slices_for(placing.choose_devices(fit, whole), whole)
    assert (held.vram_mib, held.whole) == (62375, True)


def _islands() -> tuple:
    """0,1 reach each other only through PCIe; 2-3 and 4-5 are NVLink pairs,
    2-3 the faster."""
    return (
        dev(0),
        dev(1),
        dev(2, links={3: 600.0}),
        dev(3, links={2: 600.0}),
        dev(4, links={5: 300.0}),
        dev(5, links={4: 300.0}),
    )


def test_the_best_interconnect_beats_first_fit() -> None:
    state = state_of(node_fp("n1", devices=_islands()))
    fit = placing.check_node(state.nodes["n1"], TWO)
    first_fit = [d.index for d in fit.candidates[:2]]
    chosen = [d.index for d in placing.choose_devices(fit, TWO)]
    bw = placing.bandwidths(state.nodes["n1"].devices.values())
    assert placing.set_bandwidth(first_fit, bw)[0] == 0.0
    assert sorted(chosen) == [2, 3]
    assert placing.set_bandwidth(chosen, bw) == (600.0, 600.0)


def test_exact_search_maximises_the_minimum_then_the_total_over_sixteen_devices() -> None:
    ring = {i: {(i + 1) % 16: 100.0, (i - 1) % 16: 100.0} for i in range(16)}
    ring[3][4] = ring[4][3] = 400.0
    ring[4][5] = ring[5][4] = 400.0
    devices = tuple(dev(i, links=ring[i]) for i in range(16))
    bw = placing.bandwidths(state_of(node_fp("n", devices=devices)).nodes["n"].devices.values())
    chosen = placing.best_set(list(range(16)), n=3, bw=bw)
    assert sorted(chosen) == [3, 4, 5]


def test_scores_are_integers_from_zero_to_ten_and_prefer_partly_used_healthy_nodes() -> None:
    state = state_of(
        node_fp("empty"),
        node_fp("used"),
        node_fp("sick", devices=tuple(dev(i, health=40) for i in range(8))),
    )
    _reserve(state, "used", [(i, 81920, True) for i in range(4)])
    weights = placing.Weights()
    scores = {}
    for name in ("empty", "used", "sick"):
        node = state.nodes[name]
        fit = placing.check_node(node, SLICE)
        parts = placing.components(node, fit, SLICE)
        scores[name] = placing.node_score(parts, weights=weights, best_gbps=0.0, job_groups=None)
    assert all(isinstance(s, int) and 0 <= s <= 10 for s in scores.values())
    assert scores["used"] > scores["empty"] > scores["sick"]


@pytest.mark.parametrize(("placement", "first"), [("pack", "used"), ("spread", "empty")])
def test_placement_decides_whether_the_fuller_or_the_emptier_node_scores_higher(
    placement: str, first: str
) -> None:
    from hcs_bus.settings import SchedulerSettings

    state = state_of(node_fp("empty"), node_fp("used"))
    _reserve(state, "used", [(i, 81920, True) for i in range(4)])
    weights = placing.Weights.from_settings(SchedulerSettings(placement=placement))  # type: ignore[arg-type]
    scores = {}
    for name in ("empty", "used"):
        node = state.nodes[name]
        parts = placing.components(node, placing.check_node(node, SLICE), SLICE)
        scores[name] = placing.node_score(parts, weights=weights, best_gbps=0.0, job_groups=None)
    other = "used" if first == "empty" else "empty"
    assert scores[first] > scores[other]


def test_job_affinity_prefers_the_jobs_network_group() -> None:
    state = state_of(
        node_fp("a", labels={"hcs.io/rdma-fabric": "f1"}),
        node_fp("b", labels={"hcs.io/rdma-fabric": "f2"}),
    )
    weights = placing.Weights(binpack=0, health=0, right_size=0, topology=0, job_affinity=1)
    out = {}
    for name in ("a", "b"):
        node = state.nodes[name]
        parts = placing.components(node, placing.check_node(node, SLICE), SLICE)
        out[name] = placing.node_score(parts, weights=weights, best_gbps=0, job_groups={"f1"})
    assert out == {"a": 10, "b": 0}


def test_right_sizing_penalises_a_small_slice_on_a_big_device() -> None:
    small = PlanAnnotation(
        vendor="nvidia", model="H200", devices=1, vram_mib_per_device=8192, whole_device=False
    )
    state = state_of(node_fp("h", "nvidia/H200"))
    node = state.nodes["h"]
    parts = placing.components(node, placing.check_node(node, small), small)
    assert parts.right_size < 0.1


def test_victims_are_the_lowest_priority_and_never_equal_or_higher() -> None:
    state = state_of(node_fp("n1", count=2))
    _reserve(state, "n1", [(0, 81920, True)], name="low", priority=1)
    _reserve(state, "n1", [(1, 81920, True)], name="mid", priority=5)
    node, doc = state.nodes["n1"], state.reservations_of("n1")
    one = PlanAnnotation(
        vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=81920, whole_device=True
    )
    victims = placing.victims_for(node, doc, one, priority=10, already=set())
    assert [v.pod.name for v in victims or []] == ["low"]
    both = placing.victims_for(node, doc, TWO, priority=10, already=set())
    assert sorted(v.pod.name for v in both or []) == ["low", "mid"]
    assert placing.victims_for(node, doc, TWO, priority=5, already=set()) is None


def test_fragmentation_counts_free_vram_in_pieces_too_small() -> None:
    state = state_of(node_fp("n1", count=2))
    _reserve(state, "n1", [(0, 81920 - 4096, False)])
    value = placing.fragmentation(state.nodes.values(), piece_mib=8192)
    assert value == pytest.approx(4096 / (4096 + 81920))
    assert booked(state.nodes["n1"], None).devices[0].free_mib == 81920


def test_room_after_picks_counts_each_picked_pod_on_the_devices_a_bind_would_give_it() -> None:
    state = state_of(node_fp("n", count=2))  # two 80 GiB devices
    held = NodeReservations(node="n", reservations=(reservation("ml", "a", [(0, 81920, True)]),))
    node = state.nodes["n"]
    forty, whole = a100_slice(40960), a100_slice(81920, whole=True)
    assert placing.fits_after(node, held, [forty], forty)  # 80 GiB free on device 1
    assert not placing.fits_after(node, held, [forty, forty], forty)
    assert not placing.fits_after(node, held, [whole], forty)
    # a picked pod that no longer fits anyway takes nothing
    assert placing.fits_after(node, held, [a100_slice(81920 * 2)], forty)
    assert placing.fits_after(node, None, [whole, forty], forty)  # nothing held: two devices
    assert node.devices[1].reserved_mib == 0  # the node itself is left as it was


def test_pods_picked_for_a_node_count_in_its_binpack_share_as_their_binds_will() -> None:
    state = state_of(node_fp("n", count=2))  # two 80 GiB devices: 160 GiB of the class
    node = state.nodes["n"]
    forty, whole = a100_slice(40960), a100_slice(81920, whole=True)
    parts = placing.components(node, placing.check_node(node, forty), forty)
    assert parts.binpack == pytest.approx(0.25)  # this pod's 40 of 160
    assert placing.with_others(node, parts, forty, []) is parts
    assert placing.with_others(node, parts, forty, [forty]).binpack == pytest.approx(0.5)
    assert placing.with_others(node, parts, forty, [whole, forty]).binpack == pytest.approx(1.0)
    full = placing.with_others(node, parts, forty, [whole, whole, forty])
    assert full.binpack == 1.0  # never more than all of it
    h100 = PlanAnnotation(
        vendor="nvidia", model="H100-SXM", devices=1, vram_mib_per_device=40960, whole_device=False
    )
    assert placing.with_others(node, parts, forty, [h100]) == parts  # another class's VRAM
    spread = placing.Weights(spread=True)
    emptier = placing.node_score(parts, weights=spread, best_gbps=0.0, job_groups=None)
    fuller = placing.node_score(
        placing.with_others(node, parts, forty, [whole]),
        weights=spread,
        best_gbps=0.0,
        job_groups=None,
    )
    assert fuller < emptier  # under spread, a node promised to others ranks lower


def _holding(state, node: str, pods: int) -> None:
    """``pods`` slices of 16 GiB on ``node``, over its devices in turn."""
    held = tuple(reservation("ml", f"{node}-{i}", [(i % 8, 16384, False)]) for i in range(pods))
    state.apply_reservations(node, NodeReservations(node=node, reservations=held))


@pytest.mark.parametrize(("placement", "chosen"), [("spread", "n1"), ("pack", "n2")])
def test_of_nodes_with_one_score_spread_takes_the_emptiest_not_the_first(
    placement: str, chosen: str
) -> None:
    state = state_of(node_fp("n1"), node_fp("n2"))  # 8 × 80 GiB each
    _holding(state, "n1", 10)
    _holding(state, "n2", 20)
    weights = placing.Weights(spread=placement == "spread")
    cache = NodeCache(state, weights=weights).of(SLICE)
    if placement == "spread":  # 10 and 20 pods of 16 GiB: the same score
        assert cache.entry("n1").score == cache.entry("n2").score
    assert cache.best(["n2", "n1"]) == chosen
    assert cache.best_if_all_fit(["n2", "n1"]) == chosen


_SIZES = (8192, 16384, 20480, 40960, 81920)


@st.composite
def _picks_on_a_node(draw: st.DrawFn) -> tuple[Any, NodeReservations, list[PlanAnnotation], Any]:
    """A node of A100s (some failed, some with the driver holding memory, one
    of another class), its held slices and whole devices, the pods picked
    for it and one more pod: mostly one slice size, now and then another."""
    count = draw(st.integers(1, 8))
    devices = [
        dev(
            i,
            driver_mib=draw(st.sampled_from((0, 0, 1024))),
            error=draw(st.sampled_from((None,) * 7 + ("xid 79",))),
        )
        for i in range(count)
    ]
    devices.append(dev(count, "nvidia/H100-SXM"))
    state = state_of(node_fp("n", devices=tuple(devices)))
    held = []
    for i in range(count):
        kind = draw(st.sampled_from(("none", "slices", "whole")))
        if kind == "whole":
            held.append(reservation("ml", f"w{i}", [(i, 81920, True)]))
        elif kind == "slices":
            for j, mib in enumerate(draw(st.lists(st.sampled_from(_SIZES[:3]), max_size=4))):
                held.append(reservation("ml", f"s{i}-{j}", [(i, mib, False)]))
    doc = NodeReservations(node="n", reservations=tuple(held))
    state.apply_reservations("n", doc, revision=1)
    size = draw(st.sampled_from(_SIZES))
    one = a100_slice(size)
    odd = st.sampled_from(
        (
            a100_slice(81920, whole=True),
            a100_slice(draw(st.sampled_from(_SIZES))),
            PlanAnnotation(
                vendor="nvidia",
                model="H100-SXM",
                devices=1,
                vram_mib_per_device=size,
                whole_device=False,
            ),
        )
    )
    others = draw(st.lists(st.one_of(st.just(one), st.just(one), odd), max_size=12))
    demand = draw(st.sampled_from((one, one, one, a100_slice(81920, whole=True))))
    return state, doc, others, demand


@given(_picks_on_a_node())
@settings(max_examples=400, deadline=None)
def test_room_counted_in_slices_is_the_room_a_bind_by_bind_play_finds(
    case: tuple[Any, NodeReservations, list[PlanAnnotation], PlanAnnotation],
) -> None:
    state, doc, others, demand = case
    node = state.nodes["n"]
    for device in node.devices.values():  # the failed devices of the draw
        if device.fp.error is not None:
            state.apply_health(verdict("n", device.index, "failed"))
    played = placing.fits_after(node, doc, others, demand)
    assert placing.fits_with_picks(node, doc, others, demand) == played
