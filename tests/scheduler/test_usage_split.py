"""Metering split at the guarantee: ACU-, device- and VRAM-GiB-seconds within
a namespace's guarantee apart from those it borrowed in the shared pool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.report import usage_rules as metering
from scheduler.report.usage_rules import Guarantee, Span, Usage

UNITS = ("device_s", "acu_s", "vram_gib_s")


def span(
    start: float,
    end: float | None,
    acu: float,
    *,
    ns: str = "ml",
    devices: int = 1,
    vram_mib: int = 1024,
    model: str = "A100-80G",
) -> Span:
    return Span(ns, "p", "n1", "nvidia", model, devices, vram_mib, acu, start, end)


def test_what_a_namespace_holds_above_its_guarantee_is_metered_as_borrowed() -> None:
    spans = [span(0, 100, 100.0), span(50, None, 100.0)]  # 100 ACU, then 200 from 50 s
    found = metering.split_by_guarantee(
        spans, since=0, now=150, guarantees={"ml": Guarantee(acu=150.0)}
    )
    # 0..50: 100 within; 50..100: 150 within + 50 borrowed; 100..150: 100 within
    assert found["ml"].within_acu_s == pytest.approx(100 * 50 + 150 * 50 + 100 * 50)
    assert found["ml"].borrowed_acu_s == pytest.approx(50 * 50)


def test_a_namespace_without_a_guarantee_borrows_all_it_holds() -> None:
    found = metering.split_by_guarantee([span(0, 10, 5.0)], since=0, now=10, guarantees={})
    assert found["ml"].within == Usage()
    assert found["ml"].borrowed == Usage(device_s=10.0, acu_s=50.0, vram_gib_s=10.0)


def test_vram_is_split_at_the_vram_guarantee_and_devices_at_the_tighter_unit() -> None:
    # two 40 GiB devices of 100 ACU each for 100 s; 40 GiB and 150 ACU guaranteed
    spans = [span(0, 100, 100.0, vram_mib=40960), span(0, 100, 100.0, vram_mib=40960)]
    g = {"ml": Guarantee(acu=150.0, vram_mib=40 * 1024)}
    part = metering.split_by_guarantee(spans, since=0, now=100, guarantees=g)["ml"]
    assert part.within.vram_gib_s == pytest.approx(40 * 100)
    assert part.borrowed.vram_gib_s == pytest.approx(40 * 100)
    assert part.within.acu_s == pytest.approx(150 * 100)
    # ACU is 3/4 within, VRAM 1/2: devices follow the tighter, 1 of the 2 is within
    assert part.within.device_s == pytest.approx(100.0)
    assert part.borrowed.device_s == pytest.approx(100.0)


def test_a_guarantee_in_acu_only_leaves_vram_borrowed_and_devices_follow_acu() -> None:
    g = {"ml": Guarantee(acu=50.0)}
    part = metering.split_by_guarantee([span(0, 10, 100.0)], since=0, now=10, guarantees=g)["ml"]
    assert part.within.vram_gib_s == 0 and part.borrowed.vram_gib_s == pytest.approx(10.0)
    assert part.within.device_s == pytest.approx(5.0)


def test_each_model_takes_its_part_of_the_namespace_split() -> None:
    spans = [span(0, 10, 100.0, model="A100-80G"), span(0, 10, 300.0, model="H100")]
    g = {"ml": Guarantee(acu=200.0)}
    by_key = metering.split_by_key(spans, since=0, now=10, guarantees=g)
    a100, h100 = by_key[("ml", "nvidia", "A100-80G")], by_key[("ml", "nvidia", "H100")]
    assert a100.within.acu_s == pytest.approx(500.0)  # half of the namespace is within
    assert h100.within.acu_s == pytest.approx(1500.0)
    assert h100.borrowed.acu_s == pytest.approx(1500.0)


spans_st = st.lists(
    st.builds(
        lambda s, d, acu, ns, devices, vram: span(
            s, None if d is None else s + d, acu, ns=ns, devices=devices, vram_mib=vram
        ),
        st.floats(0, 100),
        st.one_of(st.none(), st.floats(0, 100)),
        st.floats(0, 500),
        st.sampled_from(["a", "b", "c"]),
        st.integers(0, 8),
        st.integers(0, 8 * 81920),
    ),
    max_size=20,
)
guarantee_st = st.builds(
    Guarantee,
    acu=st.one_of(st.none(), st.floats(0, 800)),
    vram_mib=st.one_of(st.none(), st.integers(0, 4 * 81920)),
)


@given(
    spans=spans_st,
    ga=guarantee_st,
    gb=guarantee_st,
    cut=st.floats(0, 200),
)
def test_the_split_adds_up_in_every_unit_and_over_adjacent_windows(
    spans: list[Span], ga: Guarantee, gb: Guarantee, cut: float
) -> None:
    g = {"a": ga, "b": gb}  # "c" has no ComputeQuota
    whole = metering.split_by_guarantee(spans, since=0, now=200, guarantees=g)
    usage = metering.by_namespace(metering.usage(spans, since=0, now=200))
    left = metering.split_by_guarantee(spans, since=0, now=cut, guarantees=g)
    right = metering.split_by_guarantee(spans, since=cut, now=200, guarantees=g)
    assert set(whole) == set(usage)
    for ns, part in whole.items():
        for unit in UNITS:
            within, borrowed = getattr(part.within, unit), getattr(part.borrowed, unit)
            total = getattr(usage[ns], unit)
            assert within + borrowed == pytest.approx(total, rel=1e-6, abs=1e-3)
            assert within >= -1e-6 and borrowed >= -1e-6
            pieces = [x for x in (left.get(ns), right.get(ns)) if x is not None]
            assert sum(getattr(p.borrowed, unit) for p in pieces) == pytest.approx(
                borrowed, rel=1e-6, abs=1e-3
            )


@given(spans=spans_st, ga=guarantee_st, since=st.floats(0, 100), length=st.floats(0, 150))
def test_within_never_exceeds_the_guarantee_times_the_window(
    spans: list[Span], ga: Guarantee, since: float, length: float
) -> None:
    now = since + length
    part = metering.split_by_guarantee(spans, since=since, now=now, guarantees={"a": ga}).get("a")
    if part is None:
        return
    acu_floor = (ga.acu or 0.0) * length
    vram_floor = (ga.vram_mib or 0) / 1024 * length
    assert part.within.acu_s <= acu_floor * (1 + 1e-9) + 1e-6
    assert part.within.vram_gib_s <= vram_floor * (1 + 1e-9) + 1e-6
    if ga.acu is None and ga.vram_mib is None:
        assert part.within == Usage()  # no guarantee: all borrowed
    held = metering.by_namespace(metering.usage(spans, since=since, now=now))["a"]
    assert part.within.device_s <= held.device_s * (1 + 1e-9) + 1e-6
