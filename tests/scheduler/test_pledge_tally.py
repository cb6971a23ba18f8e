"""The pledges a namespace holds are summed in one pass (``tallied``) to
exactly what adding them one by one (``Held.plus``) gives: per class and in
all, slices by size, the ACU's floating-point sum included, in any order,
with whole devices and slices mixed."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.pledge_rules import Held, Pledge

PLEDGE = st.builds(
    Pledge,
    id=st.uuids().map(str),
    vendor=st.sampled_from(["nvidia", "huawei"]),
    model=st.sampled_from(["A100-80G", "H100-SXM", "Ascend910B2"]),
    devices=st.integers(min_value=0, max_value=16),
    vram_mib_per_device=st.sampled_from([0, 4096, 16384, 16385, 81920]),
    whole_device=st.booleans(),
    acu_per_device=st.floats(min_value=0, max_value=400, allow_nan=False),
)


def _one_by_one(items: list[Pledge]) -> tuple[dict[str, Held], Held]:
    total, by_class = Held(), dict[str, Held]()
    for p in items:
        total = total.plus(p)
        by_class[p.key] = by_class.get(p.key, Held()).plus(p)
    return by_class, total


@settings(max_examples=300, deadline=None)
@given(st.lists(PLEDGE, max_size=40))
def test_one_pass_sums_to_what_adding_each_pledge_gives(items: list[Pledge]) -> None:
    by_class, total, count = pledges.tallied(items)
    assert (by_class, total) == _one_by_one(items) and count == len(items)
    assert list(by_class) == list(_one_by_one(items)[0])  # classes in the order first seen
    assert pledges.held(items) == total and pledges.per_class(items) == by_class
