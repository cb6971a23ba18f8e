"""Metering split at the guarantee: ACU-seconds within a namespace's
guarantee apart from those it borrowed in the shared pool."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from scheduler.report import usage_rules as metering
from scheduler.report.usage_rules import Span


def span(start: float, end: float | None, acu: float, *, ns: str = "ml") -> Span:
    return Span(ns, "p", "n1", "nvidia", "A100-80G", 1, 1024, acu, start, end)


def test_what_a_namespace_holds_above_its_guarantee_is_metered_as_borrowed() -> None:
    spans = [span(0, 100, 100.0), span(50, None, 100.0)]  # 100 ACU, then 200 from 50 s
    found = metering.split_by_guarantee(spans, since=0, now=150, guaranteed_acu={"ml": 150.0})
    # 0..50: 100 within; 50..100: 150 within + 50 borrowed; 100..150: 100 within
    assert found["ml"].within_acu_s == pytest.approx(100 * 50 + 150 * 50 + 100 * 50)
    assert found["ml"].borrowed_acu_s == pytest.approx(50 * 50)


def test_a_namespace_without_a_guarantee_borrows_all_it_holds() -> None:
    found = metering.split_by_guarantee([span(0, 10, 5.0)], since=0, now=10, guaranteed_acu={})
    assert found["ml"].within_acu_s == 0 and found["ml"].borrowed_acu_s == pytest.approx(50.0)


spans_st = st.lists(
    st.builds(
        lambda s, d, acu, ns: span(s, None if d is None else s + d, acu, ns=ns),
        st.floats(0, 100),
        st.one_of(st.none(), st.floats(0, 100)),
        st.floats(0, 500),
        st.sampled_from(["a", "b"]),
    ),
    max_size=20,
)


@given(spans=spans_st, floor=st.floats(0, 800), cut=st.floats(0, 200))
def test_the_split_adds_up_to_the_acu_seconds_and_over_adjacent_windows(
    spans: list[Span], floor: float, cut: float
) -> None:
    g = {"a": floor, "b": floor / 2}
    whole = metering.split_by_guarantee(spans, since=0, now=200, guaranteed_acu=g)
    usage = metering.by_namespace(metering.usage(spans, since=0, now=200))
    left = metering.split_by_guarantee(spans, since=0, now=cut, guaranteed_acu=g)
    right = metering.split_by_guarantee(spans, since=cut, now=200, guaranteed_acu=g)
    for ns, part in whole.items():
        total = part.within_acu_s + part.borrowed_acu_s
        assert total == pytest.approx(usage[ns].acu_s, rel=1e-6, abs=1e-3)
        assert part.borrowed_acu_s >= -1e-6 and part.within_acu_s >= -1e-6
        pieces = [x for x in (left.get(ns), right.get(ns)) if x is not None]
        assert sum(p.borrowed_acu_s for p in pieces) == pytest.approx(
            part.borrowed_acu_s, rel=1e-6, abs=1e-3
        )
