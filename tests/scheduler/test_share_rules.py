"""The shared pool's rules: queue order, borrowing up to ceilings, reclaim
that never takes a namespace below its guarantee, elastic bounds, and the
ComputeQuota conditions for guarantees the pool cannot meet."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler.plan.rules import QuotaLimits
from scheduler.quota import share_rules as rules
from scheduler.quota.share_rules import Amount, ClassRoom, Job, Share

A100 = ClassRoom("nvidia/A100-80G", 16, 100.0, 81920, "nccl")
NPU = ClassRoom("huawei/Ascend910B2", 16, 100.0, 81920, "hccl")
CLASSES = {c.key: c for c in (A100, NPU)}
POOL = rules.pool_total(CLASSES.values())  # 3200 ACU


def share(ns: str, floor: float, *, ceiling: float | None = 1.0, weight: float = 1.0) -> Share:
    return Share(
        ns,
        guaranteed=POOL.times(floor),
        ceiling=POOL.times(ceiling) if ceiling is not None else None,
        weight=weight,
    )


def waiting(key: str, ranks: int, *, priority: int = 0, since: float = 0.0, **kw: object) -> Job:
    ns = key.split("/")[0]
    return Job(key=key, namespace=ns, ranks=ranks, priority=priority, since_s=since, **kw)  # type: ignore[arg-type]


def running(key: str, ranks: int, cls: str, *, since: float = 0.0, **kw: object) -> Job:
    ns = key.split("/")[0]
    return Job(key=key, namespace=ns, ranks=ranks, cls=cls, since_s=since, **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- order --

ORDER_CASES = [
    pytest.param(
        [waiting("a/x", 1, since=5), waiting("b/y", 1, priority=1, since=9)],
        {"a": 0.0, "b": 0.9},
        ["b/y", "a/x"],
        id="a high-priority gang jumps the queue whatever its share and age",
    ),
    pytest.param(
        [waiting("a/x", 1, since=1), waiting("b/y", 1, since=9)],
        {"a": 0.5, "b": 0.1},
        ["b/y", "a/x"],
        id="same priority: the lower weighted dominant share goes first",
    ),
    pytest.param(
        [waiting("a/x", 1, since=9), waiting("a/y", 1, since=1)],
        {"a": 0.2},
        ["a/y", "a/x"],
        id="same priority and share: the older goes first",
    ),
    pytest.param(
        [waiting("a/y", 1, since=1), waiting("a/x", 1, since=1)],
        {"a": 0.2},
        ["a/x", "a/y"],
        id="all else equal: by key",
    ),
]


@pytest.mark.parametrize(("jobs", "dominant", "expected"), ORDER_CASES)
def test_the_queue_orders_by_priority_then_weighted_dominant_share_then_age(
    jobs: list[Job], dominant: dict[str, float], expected: list[str]
) -> None:
    assert [j.key for j in rules.queue_order(jobs, dominant=dominant)] == expected


def test_the_weight_divides_the_dominant_share_and_the_larger_resource_counts() -> None:
    used = Amount(acu=800.0, vram_mib=POOL.vram_mib // 2)  # 25 % ACU, 50 % VRAM
    assert rules.dominant_share(used, pool=POOL, weight=1.0) == pytest.approx(0.5)
    assert rules.dominant_share(used, pool=POOL, weight=2.0) == pytest.approx(0.25)


def test_a_high_priority_gang_starts_before_an_older_one_when_only_one_fits() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.5)}
    jobs = [waiting("a/old", 16, since=0.0), waiting("b/urgent", 16, priority=5, since=50.0)]
    busy = [running("a/r", 16, A100.key)]
    adm = rules.admit(jobs, running=busy, classes=CLASSES, shares=shares, now=60.0)
    assert [s.key for s in adm.start] == ["b/urgent"]
    assert adm.waiting[0].key == "a/old" and adm.waiting[0].position == 1


jobs_strategy = st.lists(
    st.builds(
        lambda i, ns, p, since: waiting(f"{ns}/j{i}", 1, priority=p, since=since),
        st.integers(0, 50),
        st.sampled_from("abcd"),
        st.integers(0, 3),
        st.sampled_from([0.0, 1.0, 2.0]),
    ),
    max_size=30,
    unique_by=lambda j: j.key,
)


@given(jobs=jobs_strategy, dominant=st.dictionaries(st.sampled_from("abcd"), st.floats(0, 2)))
def test_the_queue_order_is_a_total_order_whatever_the_input_order(
    jobs: list[Job], dominant: dict[str, float]
) -> None:
    once = rules.queue_order(jobs, dominant=dominant)
    again = rules.queue_order(list(reversed(jobs)), dominant=dominant)
    assert once == again
    keys = [rules.order_key(j, dominant=dominant) for j in once]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # strictly ordered: no ties


# ------------------------------------------------------------- borrowing --


def test_idle_capacity_is_lent_up_to_the_ceiling_and_the_excess_is_borrowed() -> None:
    shares = {"a": share("a", 0.25, ceiling=0.5), "b": share("b", 0.25)}
    adm = rules.admit(
        [waiting("a/big", 16), waiting("a/more", 16, since=1.0)],
        running=[],
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert [s.key for s in adm.start] == ["a/big"]  # 1600 ACU: the whole ceiling
    assert adm.start[0].borrowed.acu == pytest.approx(800.0)
    assert "ceiling" in adm.waiting[0].reason


def test_a_hungry_namespaces_unmet_guarantee_is_not_lent_even_to_a_higher_priority() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.5)}
    busy = [running("a/r", 16, A100.key)]  # a at its guarantee, the NPUs idle
    adm = rules.admit(
        [waiting("a/more", 8, priority=1), waiting("b/x", 16, classes=(NPU.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert [s.key for s in adm.start] == ["b/x"]
    reasons = {w.key: w.reason for w in adm.waiting}
    assert "kept for other namespaces' guarantees" in reasons["a/more"]


def test_a_namespace_with_nothing_that_fits_lends_its_guarantee_until_reclaim() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.5)}
    busy = [running("a/r", 16, A100.key)]
    adm = rules.admit(
        [waiting("a/more", 8), waiting("b/x", 16, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert [(s.key, s.cls) for s in adm.start] == [("a/more", NPU.key)]


room_cases = st.lists(
    st.tuples(st.sampled_from("abc"), st.integers(1, 16), st.sampled_from([A100.key, NPU.key])),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    busy=room_cases,
    asks=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 16)), max_size=12),
    floors=st.tuples(st.floats(0, 0.4), st.floats(0, 0.3), st.floats(0, 0.3)),
    ceilings=st.tuples(st.floats(0.1, 1), st.floats(0.1, 1), st.floats(0.1, 1)),
)
def test_starts_never_take_a_namespace_past_its_ceiling(
    busy: list[tuple[str, int, str]],
    asks: list[tuple[str, int]],
    floors: tuple[float, float, float],
    ceilings: tuple[float, float, float],
) -> None:
    shares = {
        ns: share(ns, f, ceiling=max(f, c))
        for ns, f, c in zip("abc", floors, ceilings, strict=True)
    }
    run = _fitting(busy)
    jobs = [waiting(f"{ns}/w{i}", n, since=float(i)) for i, (ns, n) in enumerate(asks)]
    before = rules.usage(run, CLASSES)
    adm = rules.admit(jobs, running=run, classes=CLASSES, shares=shares, now=0.0)
    after = dict(before)
    for s in adm.start:
        ns = s.key.split("/")[0]
        after[ns] = after.get(ns, Amount()) + CLASSES[s.cls].amount(s.ranks)
    for ns, used in after.items():
        ceiling = shares[ns].ceiling
        assert ceiling is not None
        if used != before.get(ns, Amount()):
            assert used.within(ceiling), (ns, used, ceiling)
    free = rules.free_devices(CLASSES, run)
    for cls in CLASSES:
        assert sum(s.ranks for s in adm.start if s.cls == cls) <= free[cls]


def _fitting(busy: list[tuple[str, int, str]]) -> list[Job]:
    left = {k: c.devices for k, c in CLASSES.items()}
    out = []
    for i, (ns, n, cls) in enumerate(busy):
        if left[cls] >= n:
            left[cls] -= n
            out.append(running(f"{ns}/r{i}", n, cls, since=float(i)))
    return out


# ---------------------------------------------------------------- reclaim --


def test_reclaim_takes_the_newest_whole_gangs_of_a_namespace_above_its_guarantee() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.25)}
    busy = [
        running("b/old", 8, A100.key, since=1.0),
        running("b/new", 8, A100.key, since=2.0),
        running("b/npu", 16, NPU.key, since=0.0),
    ]
    adm = rules.admit(
        [waiting("a/x", 8, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=5.0,
    )
    assert adm.reclaim is not None and adm.reclaim.ok
    assert [(v.key, v.ranks, v.whole) for v in adm.reclaim.victims] == [("b/new", 8, True)]


def test_reclaim_never_takes_a_victim_below_its_own_guarantee() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.5)}
    busy = [running("b/r", 16, A100.key)]  # b holds exactly its guarantee
    adm = rules.admit(
        [waiting("a/x", 8, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert adm.reclaim is not None and not adm.reclaim.ok and not adm.reclaim.victims


def test_elastic_victims_lose_their_highest_ranks_before_a_whole_gang_goes() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.0)}
    busy = [
        running("b/rigid", 8, A100.key, since=9.0),
        running("b/elastic", 8, A100.key, since=1.0, min_ranks=2, max_ranks=8),
    ]
    adm = rules.admit(
        [waiting("a/x", 4, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=10.0,
    )
    assert adm.reclaim is not None and adm.reclaim.ok
    assert [(v.key, v.ranks, v.whole) for v in adm.reclaim.victims] == [("b/elastic", 4, False)]


def test_a_gang_that_would_borrow_reclaims_nothing() -> None:
    shares = {"a": share("a", 0.1), "b": share("b", 0.0)}
    busy = [running("b/r", 16, A100.key)]
    adm = rules.admit(
        [waiting("a/x", 16, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert adm.reclaim is None


def test_reclaim_waits_when_the_minutes_budget_is_spent() -> None:
    shares = {"a": share("a", 0.5), "b": share("b", 0.0)}
    busy = [running("b/r", 8, A100.key), running("b/s", 8, A100.key)]
    budget = rules.Rules(reclaim_acu_per_min=1000.0)
    spent = rules.spent_last_minute([(0.0, 500.0), (30.0, 400.0)], now=50.0)
    adm = rules.admit(
        [waiting("a/x", 8, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=50.0,
        rules=budget,
        reclaimed_last_min_acu=spent,
    )
    assert adm.reclaim is not None and not adm.reclaim.ok
    assert "budget" in adm.reclaim.reason


@settings(max_examples=200, deadline=None)
@given(
    busy=room_cases,
    ask=st.tuples(st.sampled_from("abc"), st.integers(1, 16)),
    floors=st.tuples(st.floats(0, 0.5), st.floats(0, 0.5), st.floats(0, 0.5)),
)
def test_reclaim_never_takes_any_namespace_below_its_guarantee(
    busy: list[tuple[str, int, str]],
    ask: tuple[str, int],
    floors: tuple[float, float, float],
) -> None:
    shares = {ns: share(ns, f) for ns, f in zip("abc", floors, strict=True)}
    run = _fitting(busy)
    used = rules.usage(run, CLASSES)
    job = waiting(f"{ask[0]}/x", ask[1], since=100.0)
    found = rules.reclaim_for(
        job,
        running=run,
        classes=CLASSES,
        shares=shares,
        used=used,
        free=rules.free_devices(CLASSES, run),
        budget_acu=float("inf"),
    )
    if found is None or not found.ok:
        return
    left = dict(used)
    for v in found.victims:
        left[v.namespace] = left[v.namespace] - v.amount
        assert v.namespace != job.namespace
    for ns, amount in left.items():
        if amount != used[ns]:
            assert amount.covers(shares[ns].guaranteed)
    freed = sum(v.ranks for v in found.victims)
    assert freed >= job.least - rules.free_devices(CLASSES, run)[found.cls]


# ---------------------------------------------------------------- elastic --


def test_an_elastic_gang_starts_at_its_least_and_grows_into_idle_capacity() -> None:
    shares = {"a": share("a", 0.5)}
    gang = waiting("a/e", 12, min_ranks=4, max_ranks=12, classes=(A100.key,))
    adm = rules.admit([gang], running=[], classes=CLASSES, shares=shares, now=0.0)
    assert [(s.key, s.ranks) for s in adm.start] == [("a/e", 4)]
    now_running = [running("a/e", 4, A100.key, min_ranks=4, max_ranks=12)]
    grown = rules.admit([], running=now_running, classes=CLASSES, shares=shares, now=1.0)
    assert grown.grow == (("a/e", 8),)


# ---------------------------------------------------------- backfill head --


def test_after_starvation_the_head_keeps_its_room_and_smaller_gangs_backfill_only_elsewhere() -> (
    None
):
    shares = {"a": share("a", 1.0)}
    busy = [running("a/r", 8, A100.key)]  # 8 A100 free, the head needs 16
    head = waiting("a/head", 16, classes=(A100.key,), since=0.0)
    small = waiting("a/small", 4, classes=(A100.key,), since=1.0)
    anywhere = waiting("a/any", 4, since=2.0)
    gangs = [head, small, anywhere]
    early = rules.admit(gangs, running=busy, classes=CLASSES, shares=shares, now=10.0)
    assert [(s.key, s.cls) for s in early.start] == [("a/small", A100.key), ("a/any", NPU.key)]
    late = rules.admit(gangs, running=busy, classes=CLASSES, shares=shares, now=10_000.0)
    assert late.head == "a/head"
    assert [(s.key, s.cls) for s in late.start] == [("a/any", NPU.key)]
    reasons = {w.key: w.reason for w in late.waiting}
    assert "8 free nvidia/A100-80G kept for it" in reasons["a/head"]
    assert reasons["a/small"].startswith("room")


# ------------------------------------------------------------- conditions --


def test_guarantees_beyond_the_pool_are_reported_not_enforced() -> None:
    big = {"a": share("a", 1.5), "b": share("b", 0.2)}
    found = rules.guarantee_conditions(big, pool=POOL)
    assert found["a"].reason == "GuaranteeExceedsPool" and found["a"].status == "False"
    assert found["b"].reason == "GuaranteesOversubscribed"
    fine = rules.guarantee_conditions({"a": share("a", 0.5), "b": share("b", 0.5)}, pool=POOL)
    assert {c.status for c in fine.values()} == {"True"}
    per_class = rules.guarantee_conditions(
        {"a": share("a", 0.1)},
        pool=POOL,
        by_class={"a": {A100.key: A100.amount(20)}},
        class_pool={A100.key: A100.amount(16)},
    )
    assert per_class["a"].reason == "ClassGuaranteeExceedsClass"


def test_a_quota_without_a_guarantee_keeps_working_as_a_plain_ceiling() -> None:
    old = rules.share_of("a", QuotaLimits(vram_mib=81920, acu=100.0))
    assert old.guaranteed == Amount() and old.ceiling == Amount(100.0, 81920)
    assert rules.share_of("a", None).ceiling is None
    full = rules.share_of(
        "a", QuotaLimits(acu=800.0, guaranteed_acu=400.0, guaranteed_vram_mib=1024, weight=2.0)
    )
    assert full.guaranteed == Amount(400.0, 1024) and full.weight == 2.0
    assert full.ceiling is not None and full.ceiling.acu == 800.0


def test_a_backfill_may_not_pass_a_lower_share_namespace_on_the_class_it_waits_for() -> None:
    shares = {"a": share("a", 0.0), "b": share("b", 0.0)}
    busy = [running("a/r", 12, A100.key)]  # 4 A100 free; a's share is the higher
    big = waiting("b/big", 8, classes=(A100.key,), since=0.0)  # ahead: b has the lower share
    small = waiting("a/small", 4, classes=(A100.key,), since=1.0)
    elsewhere = waiting("a/npu", 4, classes=(NPU.key,), since=2.0)
    adm = rules.admit(
        [big, small, elsewhere], running=busy, classes=CLASSES, shares=shares, now=5.0
    )
    assert [s.key for s in adm.start] == ["a/npu"]  # a class b/big cannot use
    reasons = {w.key: w.reason for w in adm.waiting}
    assert reasons["a/small"].startswith("fair backfill: b/big waits for nvidia/A100-80G")
    unfair = rules.admit(
        [big, small],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=5.0,
        rules=rules.Rules(fair_backfill=False),
    )
    assert [s.key for s in unfair.start] == ["a/small"]


def test_a_ceiling_given_in_one_resource_is_told_in_that_resource_only() -> None:
    in_vram = {"a": rules.share_of("a", QuotaLimits(vram_mib=480 * 1024))}
    why = rules.entitled(
        waiting("a/x", 8), A100.amount(8), used={"a": A100.amount(4)}, shares=in_vram, pool=POOL
    )
    assert why.endswith("ceiling 480 GiB"), why
    assert "holds 400 ACU/320 GiB, asks 800 ACU/640 GiB" in why
    in_acu = {"a": rules.share_of("a", QuotaLimits(acu=500.0))}
    why = rules.entitled(
        waiting("a/x", 8), A100.amount(8), used={"a": A100.amount(4)}, shares=in_acu, pool=POOL
    )
    assert why.endswith("ceiling 500 ACU"), why


def test_a_guarantee_in_acu_only_guarantees_the_same_fraction_of_the_pools_vram() -> None:
    half = rules.share_of("a", QuotaLimits(guaranteed_acu=POOL.acu / 2), pool=POOL)
    assert half.guaranteed == Amount(POOL.acu / 2, POOL.vram_mib // 2)
    capped = rules.share_of("a", QuotaLimits(vram_mib=1024, guaranteed_acu=POOL.acu / 2), pool=POOL)
    assert capped.guaranteed.vram_mib == 1024  # never above the ceiling


# ------------------------------------------------------------ class choice --

CHEAP = ClassRoom("cambricon/MLU370-X8", 16, 10.0, 16384, "cncl")
MIXED = {c.key: c for c in (A100, CHEAP)}
MIXED_POOL = rules.pool_total(MIXED.values())


def mixed(ns: str, floor: float, *, weight: float = 1.0) -> Share:
    return Share(ns, guaranteed=MIXED_POOL.times(floor), ceiling=MIXED_POOL, weight=weight)


def test_a_namespace_behind_the_others_takes_the_class_worth_more_and_one_ahead_the_one_worth_less() -> (
    None
):
    shares = {"a": mixed("a", 0.0), "b": mixed("b", 0.0)}
    busy = [running("b/r", 8, A100.key)]  # b holds half the A100s: b is ahead
    behind = rules.admit(
        [waiting("a/x", 4), waiting("b/wait", 16, classes=(CHEAP.key,), since=9.0)],
        running=[*busy, running("b/c", 16, CHEAP.key)],
        classes=MIXED,
        shares=shares,
        now=0.0,
    )
    assert [(s.key, s.cls) for s in behind.start] == [("a/x", A100.key)]
    ahead = rules.admit(
        [waiting("b/x", 4), waiting("a/wait", 16, classes=(A100.key,), since=9.0)],
        running=busy,
        classes=MIXED,
        shares=shares,
        now=0.0,
        rules=rules.Rules(fair_backfill=False),
    )
    assert [(s.key, s.cls) for s in ahead.start] == [("b/x", CHEAP.key)]


def test_a_gang_that_may_run_anywhere_leaves_the_class_a_bound_gang_waits_for() -> None:
    shares = {"a": share("a", 1.0)}
    busy = [running("a/r", 8, A100.key)]  # 8 A100 free, 16 NPU free
    bound = waiting("a/bound", 12, classes=(A100.key,), since=0.0)  # waits for A100
    anywhere = waiting("a/any", 4, since=1.0)
    adm = rules.admit([bound, anywhere], running=busy, classes=CLASSES, shares=shares, now=0.0)
    assert [(s.key, s.cls) for s in adm.start] == [("a/any", NPU.key)]
    old = rules.admit(
        [bound, anywhere],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
        rules=rules.Rules(fair_class=False),
    )
    assert [(s.key, s.cls) for s in old.start] == [("a/any", A100.key)]  # the tightest


# ----------------------------------------------------------- order by ask --


def test_of_two_gangs_of_the_same_share_the_smaller_ask_goes_first() -> None:
    shares = {"a": share("a", 0.0), "b": share("b", 0.0)}
    big = waiting("a/big", 16, since=0.0)
    small = waiting("b/small", 2, since=5.0)
    adm = rules.admit([big, small], running=[], classes=CLASSES, shares=shares, now=10.0)
    assert adm.order == ("b/small", "a/big")
    plain = rules.admit(
        [big, small],
        running=[],
        classes=CLASSES,
        shares=shares,
        now=10.0,
        rules=rules.Rules(ask_order=False),
    )
    assert plain.order == ("a/big", "b/small")  # equal shares: the older first


def test_a_namespace_of_low_weight_pays_more_share_for_the_same_ask() -> None:
    shares = {"a": share("a", 0.0, weight=1.0), "b": share("b", 0.0, weight=4.0)}
    light = waiting("a/x", 8, since=0.0)
    heavy = waiting("b/x", 8, since=1.0)
    used = {"a": Amount(), "b": Amount()}
    after = {
        j.key: rules.share_after(j, used=used, shares=shares, pool=POOL, classes=CLASSES)
        for j in (light, heavy)
    }
    assert after["a/x"] == pytest.approx(0.25) and after["b/x"] == pytest.approx(0.0625)
    dominant = rules.shares_of(used, shares, pool=POOL)
    assert [j.key for j in rules.queue_order([light, heavy], dominant=dominant, after=after)] == [
        "b/x",
        "a/x",
    ]


@given(
    jobs=jobs_strategy,
    dominant=st.dictionaries(st.sampled_from("abcd"), st.floats(0, 2)),
    extra=st.dictionaries(st.integers(0, 50), st.floats(0, 2)),
)
def test_the_queue_order_by_share_after_the_ask_is_a_total_order(
    jobs: list[Job], dominant: dict[str, float], extra: dict[int, float]
) -> None:
    after = {j.key: extra[i] for i, j in enumerate(jobs) if i in extra}
    once = rules.queue_order(jobs, dominant=dominant, after=after)
    again = rules.queue_order(list(reversed(jobs)), dominant=dominant, after=after)
    assert once == again
    keys = [rules.order_key(j, dominant=dominant, after=after) for j in once]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


# ------------------------------------------------- lending and fair reclaim --


def test_elastic_ranks_above_their_minimum_are_lent_back_to_a_gang_waiting_for_room() -> None:
    shares = {"a": share("a", 0.0), "b": share("b", 0.0)}
    busy = [
        running("a/e", 12, A100.key, min_ranks=4, max_ranks=12),
        running("b/r", 16, NPU.key),
    ]
    adm = rules.admit(
        [waiting("b/x", 8, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert adm.reclaim is not None and adm.reclaim.ok
    assert adm.reclaim.reason.startswith("lent back for b/x")
    assert [(v.key, v.ranks, v.whole) for v in adm.reclaim.victims] == [("a/e", 4, False)]


def test_fair_reclaim_takes_the_newest_gang_of_a_namespace_that_stays_above_the_claimant() -> None:
    shares = {ns: share(ns, 0.0) for ns in "abc"}
    busy = [
        running("a/old", 4, A100.key, since=0.0),
        running("a/new", 4, A100.key, since=5.0),
        running("b/newest", 4, A100.key, since=9.0),  # b would end below c: not taken
        running("a/npu", 16, NPU.key, since=0.0),
    ]
    adm = rules.admit(
        [waiting("c/x", 8, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=10.0,
    )
    assert adm.reclaim is not None and adm.reclaim.ok
    assert adm.reclaim.reason.startswith("fair reclaim for c/x")
    assert [(v.key, v.ranks, v.whole) for v in adm.reclaim.victims] == [("a/new", 4, True)]


def test_a_fair_reclaim_ends_no_gang_it_shrank_and_takes_the_next_whole_gang_instead() -> None:
    shares = {ns: share(ns, 0.0) for ns in "bc"}
    busy = [
        running("b/rigid", 4, A100.key, since=0.0),
        running("b/elastic", 12, A100.key, since=5.0, min_ranks=6, max_ranks=12),
        running("b/npu", 16, NPU.key, since=0.0),
    ]
    adm = rules.admit(
        [waiting("c/x", 8, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=10.0,
    )
    assert adm.reclaim is not None and adm.reclaim.ok
    assert adm.reclaim.reason.startswith("fair reclaim for c/x")
    assert [(v.key, v.ranks, v.whole) for v in adm.reclaim.victims] == [
        ("b/elastic", 6, False),
        ("b/rigid", 4, True),
    ]


def test_a_reclaim_for_a_guarantee_takes_the_rest_of_an_elastic_gang_whose_spare_is_too_few() -> (
    None
):
    shares = {"a": share("a", 0.5), "b": share("b", 0.0)}
    busy = [running("b/elastic", 16, A100.key, min_ranks=8, max_ranks=16)]
    adm = rules.admit(
        [waiting("a/x", 12, classes=(A100.key,))],
        running=busy,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert adm.reclaim is not None and adm.reclaim.ok
    assert [(v.key, v.ranks, v.whole) for v in adm.reclaim.victims] == [("b/elastic", 16, True)]


def test_fair_reclaim_never_takes_a_higher_priority_gang_or_one_that_would_end_behind() -> None:
    shares = {"a": share("a", 0.0), "b": share("b", 0.0)}
    urgent = [running("a/r", 16, A100.key, priority=1), running("a/n", 16, NPU.key, priority=1)]
    adm = rules.admit(
        [waiting("b/x", 8, classes=(A100.key,))],
        running=urgent,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert adm.reclaim is None
    close = [running("a/r", 16, A100.key)]  # a after losing it: 0 < b's 0.25 once it runs
    adm = rules.admit(
        [waiting("b/x", 8, classes=(A100.key,))],
        running=close,
        classes=CLASSES,
        shares=shares,
        now=0.0,
    )
    assert adm.reclaim is None


@settings(max_examples=200, deadline=None)
@given(
    busy=st.lists(
        st.tuples(
            st.sampled_from("abc"),
            st.integers(1, 16),
            st.sampled_from([A100.key, NPU.key]),
            st.integers(0, 1),
            st.booleans(),
        ),
        max_size=12,
    ),
    asks=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(1, 16), st.integers(0, 1)),
        min_size=1,
        max_size=8,
    ),
    floors=st.tuples(st.floats(0, 0.4), st.floats(0, 0.3), st.floats(0, 0.3)),
    weights=st.tuples(st.floats(0.5, 4), st.floats(0.5, 4), st.floats(0.5, 4)),
)
def test_no_reclaim_takes_a_namespace_below_its_guarantee_or_a_fair_victim_behind_the_claimant(
    busy: list[tuple[str, int, str, int, bool]],
    asks: list[tuple[str, int, int]],
    floors: tuple[float, float, float],
    weights: tuple[float, float, float],
) -> None:
    shares = {ns: share(ns, f, weight=w) for ns, f, w in zip("abc", floors, weights, strict=True)}
    left = {k: c.devices for k, c in CLASSES.items()}
    run = []
    for i, (ns, n, cls, prio, elastic) in enumerate(busy):
        if left[cls] >= n:
            left[cls] -= n
            least = max(1, n // 2) if elastic else None
            run.append(
                running(
                    f"{ns}/r{i}",
                    n,
                    cls,
                    since=float(i),
                    priority=prio,
                    min_ranks=least,
                    max_ranks=n if elastic else None,
                )
            )
    jobs = [waiting(f"{ns}/w{i}", n, priority=p) for i, (ns, n, p) in enumerate(asks)]
    adm = rules.admit(jobs, running=run, classes=CLASSES, shares=shares, now=1000.0)
    if adm.reclaim is None or not adm.reclaim.ok:
        return
    used = rules.usage(run, CLASSES)
    for s in adm.start:  # a reclaim is worked out on the pass's starts
        ns = s.key.split("/")[0]
        used[ns] = used.get(ns, Amount()) + CLASSES[s.cls].amount(s.ranks)
    after = dict(used)
    held = {j.key: j for j in run}
    for v in adm.reclaim.victims:
        after[v.namespace] = after[v.namespace] - v.amount
        victim = held[v.key]
        assert v.ranks <= victim.ranks and (v.whole or victim.ranks - v.ranks >= victim.least)
    for ns, amount in after.items():
        if amount != used[ns]:
            assert amount.covers(shares[ns].guaranteed), (ns, amount, shares[ns].guaranteed)
    key = adm.reclaim.reason.split(" for ", 1)[1].split(" ")[0].rstrip(":")
    claimant = next(j for j in jobs if j.key == key)
    if not adm.reclaim.reason.startswith("lent back"):  # lent ranks come back from any namespace
        assert all(v.namespace != claimant.namespace for v in adm.reclaim.victims)
    if adm.reclaim.reason.startswith("fair reclaim"):
        ask = CLASSES[adm.reclaim.cls].amount(claimant.least)
        mine = rules.dominant_share(
            used.get(claimant.namespace, Amount()) + ask,
            pool=POOL,
            weight=shares[claimant.namespace].weight,
        )
        for v in adm.reclaim.victims:
            assert held[v.key].priority <= claimant.priority
            theirs = rules.dominant_share(
                after[v.namespace], pool=POOL, weight=shares[v.namespace].weight
            )
            assert theirs > mine


@settings(max_examples=150, deadline=None)
@given(
    busy=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(1, 16), st.sampled_from([A100.key, NPU.key])),
        max_size=12,
    ),
    asks=st.lists(
        st.tuples(st.sampled_from("abc"), st.integers(1, 16), st.booleans()), max_size=12
    ),
    floors=st.tuples(st.floats(0, 0.4), st.floats(0, 0.3), st.floats(0, 0.3)),
    ceilings=st.tuples(st.floats(0.1, 1), st.floats(0.1, 1), st.floats(0.1, 1)),
)
def test_starts_and_growth_together_never_take_a_namespace_past_its_ceiling(
    busy: list[tuple[str, int, str]],
    asks: list[tuple[str, int, bool]],
    floors: tuple[float, float, float],
    ceilings: tuple[float, float, float],
) -> None:
    shares = {
        ns: share(ns, f, ceiling=max(f, c))
        for ns, f, c in zip("abc", floors, ceilings, strict=True)
    }
    run = [
        replace(j, min_ranks=1, max_ranks=16) if i % 2 else j for i, j in enumerate(_fitting(busy))
    ]
    jobs = [
        waiting(f"{ns}/w{i}", n, since=float(i), **({"min_ranks": 1, "max_ranks": n} if e else {}))
        for i, (ns, n, e) in enumerate(asks)
    ]
    before = rules.usage(run, CLASSES)
    adm = rules.admit(jobs, running=run, classes=CLASSES, shares=shares, now=0.0)
    after = dict(before)
    taken = dict(rules.free_devices(CLASSES, run))
    for s in adm.start:
        ns = s.key.split("/")[0]
        after[ns] = after.get(ns, Amount()) + CLASSES[s.cls].amount(s.ranks)
        taken[s.cls] -= s.ranks
    held = {j.key: j for j in run}
    for key, more in adm.grow:
        job = held[key]
        assert job.ranks + more <= job.most
        after[job.namespace] = after[job.namespace] + CLASSES[job.cls].amount(more)
        taken[job.cls] -= more
    for ns, used in after.items():
        ceiling = shares[ns].ceiling
        assert ceiling is not None
        if used != before.get(ns, Amount()):
            assert used.within(ceiling), (ns, used, ceiling)
    assert all(left >= 0 for left in taken.values()), taken
