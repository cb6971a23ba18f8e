"""Usage metering's pure rules (scheduler/report/usage_rules.py): lifetimes from
AllocationEvents, usage over windows, quota shares and the alert's hysteresis."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hcs_bus.messages import AllocationEvent, AllocState, DeviceSlice, PodRef
from scheduler.report import usage_rules as metering
from scheduler.report.usage_rules import Held, Lifetimes, Usage

T0 = 1_700_000_000.0


def event(
    state: AllocState,
    time_s: float,
    *,
    pod: str = "p",
    namespace: str = "ml",
    node: str = "n1",
    devices: int = 2,
    vram_mib: int = 8192,
    acu: float = 200.0,
    model: str = "A100-80G",
) -> AllocationEvent:
    return AllocationEvent(
        node=node,
        pod=PodRef(namespace=namespace, name=pod, uid=f"uid-{pod}"),
        state=state,
        time_s=time_s,
        devices=tuple(
            DeviceSlice(index=i, uuid=f"u{i}", vram_mib=vram_mib) for i in range(devices)
        ),
        vendor="nvidia",
        model=model,
        acu=acu,
    )


def replay(*events: AllocationEvent) -> Lifetimes:
    life = Lifetimes()
    for e in events:
        life.apply(e)
    return life


def test_a_bound_then_released_pod_is_metered_for_its_lifetime() -> None:
    life = replay(event("reserved", T0 - 1), event("bound", T0), event("released", T0 + 100))
    found = metering.usage(life.spans(), since=T0 - 1000, now=T0 + 1000)
    assert found == {
        ("ml", "nvidia", "A100-80G"): Usage(device_s=200.0, acu_s=20_000.0, vram_gib_s=1600.0)
    }


def test_an_open_allocation_counts_up_to_now_and_the_window_clips_it() -> None:
    life = replay(event("bound", T0, devices=1, acu=100.0))
    found = metering.usage(life.spans(), since=T0 + 10, now=T0 + 70)
    assert found[("ml", "nvidia", "A100-80G")].device_s == pytest.approx(60.0)
    assert metering.usage(life.spans(), since=T0 + 70, now=T0 + 70) == {}


def test_a_second_bound_does_not_restart_the_clock_and_a_stray_release_is_ignored() -> None:
    life = replay(
        event("released", T0 - 50, pod="never-bound"),
        event("bound", T0, devices=1),
        event("bound", T0 + 30, devices=1),  # re-announced at expiry
        event("expired", T0 + 60, devices=1),
    )
    assert [(s.start_s, s.end_s) for s in life.spans()] == [(T0, T0 + 60)]


def test_usage_is_split_by_namespace_and_model() -> None:
    life = replay(
        event("bound", T0, pod="a", namespace="ml"),
        event("bound", T0, pod="b", namespace="cv", model="910B"),
        event("bound", T0, pod="c", namespace="ml", node="n2", model="910B"),
    )
    found = metering.usage(life.spans(), since=T0, now=T0 + 10)
    assert set(found) == {
        ("ml", "nvidia", "A100-80G"),
        ("cv", "nvidia", "910B"),
        ("ml", "nvidia", "910B"),
    }
    totals = metering.by_namespace(found)
    assert totals["ml"].device_s == pytest.approx(40.0) and totals["cv"].device_s == pytest.approx(
        20.0
    )
    only_cv = metering.usage(life.spans(), since=T0, now=T0 + 10, namespace="cv")
    assert set(only_cv) == {("cv", "nvidia", "910B")}


def test_pruning_keeps_the_usage_of_what_it_drops() -> None:
    life = replay(
        event("bound", T0, pod="a"),
        event("released", T0 + 10, pod="a"),
        event("bound", T0, pod="b"),
    )
    before = metering.usage(life.spans(), since=-math.inf, now=T0 + 20)
    dropped = life.prune(before_s=T0 + 15)
    after = metering.merge(dropped, metering.usage(life.spans(), since=-math.inf, now=T0 + 20))
    assert len(life.closed) == 0 and after == before


def test_held_counts_open_allocations_only() -> None:
    life = replay(
        event("bound", T0, pod="a"),
        event("bound", T0, pod="b", devices=1, vram_mib=4096, acu=50.0),
        event("released", T0 + 1, pod="a"),
        event("bound", T0, pod="c", namespace="cv"),
    )
    assert metering.held(life.spans()) == {
        "ml": Held(devices=1, vram_mib=4096, acu=50.0),
        "cv": Held(devices=2, vram_mib=16384, acu=200.0),
    }


def test_the_quota_share_is_the_tightest_resource() -> None:
    holding = Held(devices=2, vram_mib=16384, acu=150.0)
    assert metering.quota_share(holding, vram_mib_hard=32768, acu_hard=200.0) == (0.75, "acu")
    assert metering.quota_share(holding, vram_mib_hard=16384, acu_hard=None) == (1.0, "vram")
    assert metering.quota_share(holding, vram_mib_hard=None, acu_hard=None) is None
    assert metering.quota_share(holding, vram_mib_hard=0, acu_hard=None) == (math.inf, "vram")


def test_an_alert_fires_once_per_crossing_with_hysteresis() -> None:
    rules = {"threshold": 0.9, "rearm": 0.8}
    fired, alerting = metering.crossings({"ml": 0.5, "cv": 0.95}, alerting=frozenset(), **rules)
    assert fired == ["cv"] and alerting == {"cv"}
    fired, alerting = metering.crossings({"cv": 0.85}, alerting=alerting, **rules)
    assert fired == [] and alerting == {"cv"}  # still above rearm: no second alert
    fired, alerting = metering.crossings({"cv": 0.95}, alerting=alerting, **rules)
    assert fired == []
    fired, alerting = metering.crossings({"cv": 0.5}, alerting=alerting, **rules)
    assert fired == [] and alerting == frozenset()
    fired, _ = metering.crossings({"cv": 0.92}, alerting=alerting, **rules)
    assert fired == ["cv"]


# -- properties ---------------------------------------------------------------

PODS = ("a", "b", "c")
times = st.floats(min_value=0.0, max_value=10_000.0, allow_nan=False)
steps = st.lists(
    st.tuples(
        st.sampled_from(("reserved", "bound", "released", "expired")), st.sampled_from(PODS), times
    ),
    max_size=30,
)


def _replay_steps(items: list[tuple[str, str, float]]) -> Lifetimes:
    return replay(*(event(s, T0 + t, pod=p, devices=1 + PODS.index(p)) for s, p, t in items))  # type: ignore[arg-type]


@given(items=steps, since=times, length=times)
def test_usage_is_never_negative(
    items: list[tuple[str, str, float]], since: float, length: float
) -> None:
    found = metering.usage(_replay_steps(items).spans(), since=T0 + since, now=T0 + since + length)
    for value in found.values():
        assert value.device_s >= 0 and value.acu_s >= 0 and value.vram_gib_s >= 0


@given(items=steps, cuts=st.lists(times, min_size=3, max_size=3))
def test_usage_adds_up_over_adjacent_windows(
    items: list[tuple[str, str, float]], cuts: list[float]
) -> None:
    a, b, c = (T0 + t for t in sorted(cuts))
    spans = list(_replay_steps(items).spans())
    whole = metering.usage(spans, since=a, now=c)
    split = metering.merge(
        metering.usage(spans, since=a, now=b), metering.usage(spans, since=b, now=c)
    )
    assert set(whole) <= set(split)
    for key, value in split.items():
        got = whole.get(key, Usage())
        assert got.device_s == pytest.approx(value.device_s, abs=1e-5)
        assert got.acu_s == pytest.approx(value.acu_s, abs=1e-3)


@given(items=steps, bound_at=times, held_s=times, later=times)
def test_a_released_allocation_stops_accruing(
    items: list[tuple[str, str, float]], bound_at: float, held_s: float, later: float
) -> None:
    life = _replay_steps(items)
    release_at = T0 + bound_at + held_s
    life.apply(event("bound", T0 + bound_at, pod="z", namespace="solo"))
    life.apply(event("released", release_at, pod="z", namespace="solo"))
    after = metering.usage(life.spans(), since=release_at, now=release_at + later, namespace="solo")
    assert after == {}
    total = metering.usage(life.spans(), since=-math.inf, now=release_at + later, namespace="solo")
    metered = total.get(("solo", "nvidia", "A100-80G"), Usage())
    assert metered.device_s == pytest.approx(2 * held_s, abs=1e-5)  # float seconds near 1.7e9
