"""Gangs: every rank placed at once on one collective library and one network
group, or none; which waiting gangs start; one set of collective flags."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcs_bus import vocabulary
from hcs_bus.messages import (
    Link,
    NodeFingerprint,
    NodeReservations,
    PodRef,
    Policy,
    Requests,
    Reservation,
)
from scheduler.extender import collectives
from scheduler.ledger.pledge_rules import Held, room_left, slices_fit
from scheduler.plan import gang_rules as gangs
from scheduler.plan.rules import ClassStats, summarise
from scheduler.view.state import ClusterState, booked
from tests.view.factories import fingerprint, reservation

A100 = {"vendor": "nvidia", "model": "A100-80G", "vram_mib": 81920}
H100 = {"vendor": "nvidia", "model": "H100", "vram_mib": 81920}
ASCEND = {"vendor": "huawei", "model": "Ascend910B2", "vram_mib": 65536}
BI = {"vendor": "iluvatar", "model": "BI-V150", "vram_mib": 32768}
GROUP = vocabulary.NETWORK_GROUP_LABEL
FABRIC = vocabulary.RDMA_FABRIC_LABEL
LIBRARY = {"nvidia": "nccl", "huawei": "hccl", "iluvatar": "ixccl"}  # what each vendor speaks


def fleet(*nodes: tuple[str, dict, str | None], devices: int = 8) -> ClusterState:
    """A view of ``(name, class, network group)`` nodes of ``devices`` each."""
    state = ClusterState()
    for name, kind, group in nodes:
        state.apply_fingerprint(fingerprint(name, devices=devices, **kind), now=1.0)
        if group:
            state.apply_node(name, {GROUP: group})
    return state


def occupy(state: ClusterState, node: str, slices: list[tuple[int, int, bool]]) -> None:
    """Book ``(index, MiB, whole)`` slices on ``node`` for another pod."""
    held = state.reservations_of(node)
    rest = held.reservations if held is not None else ()
    res = reservation("other", f"pod-{node}-{len(rest)}", slices)
    state.apply_reservations(node, NodeReservations(node=node, reservations=(*rest, res)))


def gang(
    n: int,
    requests: Requests | None = None,
    policy: Policy | None = None,
    *,
    name: str = "job",
    **kw: object,
) -> gangs.Gang:
    ask = requests or Requests(devices=1)
    members = tuple(gangs.Member(f"{name}-{i}", ask, policy or Policy()) for i in range(n))
    return gangs.Gang(name, members, **kw)  # type: ignore[arg-type]


def nodes_of(plan: gangs.GangPlan) -> set[str]:
    return {r.node for r in plan.ranks}


# ------------------------------------------------------------------ plans --


def test_sixteen_ranks_on_eight_a100_and_eight_ascend_are_refused_for_mixed_libraries() -> None:
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))
    plan = gangs.plan_gang(state, gang(16))
    assert not plan.ok
    assert plan.ranks == ()
    assert "nccl" in plan.reason and "hccl" in plan.reason
    assert "cannot join one job" in plan.reason
    assert "no cross-vendor library bridges hccl" in plan.reason


def test_a_cross_vendor_library_never_bridges_hccl() -> None:
    state = fleet(("gpu", A100, "g1"), ("npu", ASCEND, "g1"))
    plan = gangs.plan_gang(state, gang(16, collective="flagcx"))
    assert not plan.ok and plan.ranks == ()


def test_a_gang_that_opts_in_to_flagcx_may_span_nvidia_and_iluvatar() -> None:
    state = fleet(("gpu", A100, "g1"), ("ix", BI, "g1"))
    refused = gangs.plan_gang(state, gang(16))
    assert not refused.ok
    assert "unless the gang opts in to a cross-vendor library (flagcx)" in refused.reason
    plan = gangs.plan_gang(state, gang(16, collective="flagcx"))
    assert plan.ok, plan.reason
    assert plan.library == "flagcx"
    assert set(plan.classes) == {"nvidia/A100-80G", "iluvatar/BI-V150"}


def test_twelve_ranks_where_no_class_has_twelve_free_wait_with_a_reason() -> None:
    state = fleet(("a1", A100, "g1"), ("a2", A100, "g1"), ("h1", H100, "g2"))
    occupy(state, "a1", [(i, 81920, True) for i in range(6)])
    occupy(state, "a2", [(i, 81920, True) for i in range(2)])
    plan = gangs.plan_gang(state, gang(12))
    assert not plan.ok and plan.waits
    assert plan.ranks == ()
    assert plan.reason.startswith("gang job needs 12 devices of one class in one network group")
    assert "most free: 8 x nvidia/A100-80G in group g1" in plan.reason


def test_twelve_ranks_go_all_to_the_one_class_that_has_twelve_free() -> None:
    state = fleet(("a1", A100, "g1"), ("h1", H100, "g1"), ("h2", H100, "g1"))
    plan = gangs.plan_gang(state, gang(12))
    assert plan.ok, plan.reason
    assert plan.classes == ("nvidia/H100",)
    assert len(plan.ranks) == 12 and {r.key for r in plan.ranks} == {"nvidia/H100"}
    assert plan.library == "nccl"


def test_models_of_one_library_mix_only_when_substitution_is_allowed() -> None:
    state = fleet(("a1", A100, "g1"), ("h1", H100, "g1"))
    assert not gangs.plan_gang(state, gang(12)).ok
    plan = gangs.plan_gang(state, gang(12, policy=Policy(substitution="allow")))
    assert plan.ok, plan.reason
    assert set(plan.classes) == {"nvidia/A100-80G", "nvidia/H100"}
    assert plan.library == "nccl"


def test_sixteen_ranks_over_two_nodes_stay_in_one_network_group() -> None:
    state = fleet(("n1", A100, "g1"), ("n2", A100, "g2"), ("n3", A100, "g3"), ("n4", A100, "g3"))
    plan = gangs.plan_gang(state, gang(16))
    assert plan.ok, plan.reason
    assert plan.group == "g3"
    assert nodes_of(plan) == {"n3", "n4"}
    assert sorted(r.member for r in plan.ranks) == sorted(f"job-{i}" for i in range(16))


def test_nodes_without_a_network_group_hold_a_gang_only_alone() -> None:
    state = fleet(("n1", A100, None), ("n2", A100, None))
    assert gangs.plan_gang(state, gang(8)).ok
    plan = gangs.plan_gang(state, gang(9))
    assert not plan.ok and not plan.waits
    assert "no network group" in plan.reason


def test_the_tightest_pool_wins_so_large_pools_stay_whole() -> None:
    state = fleet(("n1", A100, "g1"), ("n2", A100, "g1"), ("n3", A100, "g2"))
    occupy(state, "n3", [(i, 81920, True) for i in range(4)])
    plan = gangs.plan_gang(state, gang(4))
    assert plan.ok and nodes_of(plan) == {"n3"}


def test_members_with_different_demands_are_refused_naming_the_member() -> None:
    same = gang(3)
    odd = gangs.Member("job-odd", Requests(devices=2))
    plan = gangs.plan_gang(fleet(("n1", A100, "g1")), gangs.Gang("job", (*same.members, odd)))
    assert not plan.ok and not plan.waits
    assert "member job-odd" in plan.reason
    assert "requests.devices 2 vs 1" in plan.reason


def test_a_gang_larger_than_the_whole_fleet_is_refused() -> None:
    state = fleet(("n1", A100, "g1"), ("n2", A100, "g1"))
    plan = gangs.plan_gang(state, gang(17))
    assert not plan.ok and not plan.waits
    assert "it can never fit" in plan.reason


def test_pledges_keep_their_room_from_a_gang() -> None:
    state = fleet(("n1", A100, "g1"))
    assert gangs.plan_gang(state, gang(6)).ok
    held = {"nvidia/A100-80G": Held(whole_devices=3, devices=3, vram_mib=3 * 81920)}
    plan = gangs.plan_gang(state, gang(6), held=held)
    assert not plan.ok and plan.waits
    assert "outstanding pledges hold the room" in plan.reason


def test_a_slice_gang_packs_ranks_into_free_vram() -> None:
    state = fleet(("n1", A100, "g1"), devices=2)
    plan = gangs.plan_gang(state, gang(8, Requests(vram_mib=20480)))
    assert plan.ok, plan.reason
    assert all(not r.whole_device and r.devices[0].vram_mib == 20480 for r in plan.ranks)
    assert not gangs.plan_gang(state, gang(9, Requests(vram_mib=20480))).ok


def test_an_unknown_cross_vendor_library_is_refused_by_name() -> None:
    plan = gangs.plan_gang(fleet(("n1", A100, "g1")), gang(2, collective="mpi"))
    assert not plan.ok and "collective 'mpi'" in plan.reason


# ------------------------------------------------------------- admitting --


def test_two_gangs_that_fit_alone_but_not_together_never_deadlock() -> None:
    state = fleet(("n1", A100, "g1"))
    first, second = gang(6, name="first", since_s=1.0), gang(6, name="second", since_s=2.0)
    assert gangs.plan_gang(state, second).ok
    admitted = gangs.admit_order([second, first], state=state, now=10.0, starvation_s=600.0)
    assert [p.gang for p in admitted.start] == ["first"]
    assert [p.gang for p in admitted.waiting] == ["second"]
    assert admitted.waiting[0].ranks == () and admitted.waiting[0].waits


def _starving_fleet() -> ClusterState:
    state = fleet(("n1", A100, "g1"), ("n2", A100, "g2"))
    occupy(state, "n1", [(i, 81920, True) for i in range(6)])  # 2 free in g1
    occupy(state, "n2", [(i, 81920, True) for i in range(4)])  # 4 free in g2
    return state


def test_small_gangs_pass_a_big_one_before_it_starves() -> None:
    big, small = gang(8, name="big", since_s=0.0), gang(3, name="small", since_s=50.0)
    admitted = gangs.admit_order(
        [big, small], state=_starving_fleet(), now=100.0, starvation_s=600.0
    )
    assert [p.gang for p in admitted.start] == ["small"]
    assert admitted.claim is None


def test_a_starving_gang_keeps_its_room_and_smaller_ones_backfill_elsewhere() -> None:
    big = gang(8, name="big", since_s=0.0)
    small, tiny = gang(3, name="small", since_s=50.0), gang(2, name="tiny", since_s=60.0)
    admitted = gangs.admit_order(
        [tiny, small, big], state=_starving_fleet(), now=1000.0, starvation_s=600.0
    )
    assert admitted.claim is not None and admitted.claim.where == "in group g2"
    assert admitted.claim.gang == "big"
    assert [p.gang for p in admitted.start] == ["tiny"]
    assert {r.node for r in admitted.start[0].ranks} == {"n1"}
    waiting = {p.gang: p for p in admitted.waiting}
    assert set(waiting) == {"big", "small"}
    assert "are kept for it" in waiting["big"].reason


def test_higher_priority_goes_first_whatever_its_age() -> None:
    state = fleet(("n1", A100, "g1"))
    old, urgent = gang(6, name="old", since_s=0.0), gang(6, name="urgent", since_s=9.0, priority=5)
    admitted = gangs.admit_order([old, urgent], state=state, now=10.0, starvation_s=600.0)
    assert [p.gang for p in admitted.start] == ["urgent"]


def test_a_gang_that_can_never_fit_is_refused_not_kept_waiting() -> None:
    state = fleet(("n1", A100, "g1"))
    admitted = gangs.admit_order([gang(9)], state=state, now=1e6, starvation_s=1.0)
    assert [p.gang for p in admitted.refused] == ["job"] and admitted.claim is None


# ------------------------------------------------------ collective flags --


def _meshed(fp: NodeFingerprint, kind: str = "nvlink") -> NodeFingerprint:
    n = len(fp.devices)
    devices = tuple(
        msgspec.structs.replace(
            d,
            links=tuple(
                Link(peer_index=j, type=kind, bandwidth_gbps=300.0)  # type: ignore[arg-type]
                for j in range(n)
                if j != d.index
            ),
        )
        for d in fp.devices
    )
    return msgspec.structs.replace(fp, devices=devices)


def test_every_rank_gets_the_same_flags_from_the_whole_placement() -> None:
    state = ClusterState()
    state.apply_fingerprint(_meshed(fingerprint("n1", **A100)), now=1.0)
    state.apply_fingerprint(_meshed(fingerprint("n2", **A100)), now=1.0)
    for name in ("n1", "n2"):
        state.apply_node(name, {FABRIC: "ib0"})
    plan = gangs.plan_gang(state, gang(16))
    assert plan.ok and plan.group == "ib0"
    flags = gangs.collective_flags(plan)
    assert flags == {collectives.P2P_DISABLE: "0", collectives.IB_DISABLE: "0"}
    # one node whose devices have no peer links turns peer-to-peer off for all
    state.apply_fingerprint(fingerprint("n2", seq=2, **A100), now=2.0)
    flags = gangs.collective_flags(gangs.plan_gang(state, gang(16)))
    assert flags[collectives.P2P_DISABLE] == "1"


def test_ascend_ranks_without_hccs_everywhere_all_go_over_roce() -> None:
    state = ClusterState()
    state.apply_fingerprint(_meshed(fingerprint("n1", **ASCEND), "hccs"), now=1.0)
    state.apply_node("n1", {GROUP: "g1"})
    plan = gangs.plan_gang(state, gang(8))
    assert gangs.collective_flags(plan) == {
        collectives.INTRA_PCIE: "1",
        collectives.INTRA_ROCE: "0",
    }
    state.apply_fingerprint(fingerprint("n2", **ASCEND), now=1.0)
    state.apply_node("n2", {GROUP: "g1"})
    plan = gangs.plan_gang(state, gang(16))
    assert gangs.collective_flags(plan) == {
        collectives.INTRA_PCIE: "0",
        collectives.INTRA_ROCE: "1",
    }


def test_a_refused_gang_has_no_flags() -> None:
    assert gangs.collective_flags(gangs.plan_gang(ClusterState(), gang(2))) == {}


# -------------------------------------------------------------- properties --

KINDS = (A100, H100, ASCEND, BI)
FLEETS = ((A100, H100), (A100, H100), (H100, BI), (A100, ASCEND), (A100,), (ASCEND, BI))


@st.composite
def views(draw: st.DrawFn) -> tuple[ClusterState, dict[str, Held]]:
    state = ClusterState()
    # two kinds at most, often of one library, so gangs too large for one often fit two
    kinds = draw(st.sampled_from(FLEETS))
    label = draw(st.sampled_from([GROUP, FABRIC]))
    for i in range(draw(st.integers(1, 6))):
        name, kind = f"n{i}", draw(st.sampled_from(kinds))
        count = draw(st.integers(1, 8))
        state.apply_fingerprint(fingerprint(name, devices=count, **kind), now=1.0)
        group = draw(st.sampled_from([None, "g1", "g1", "g2"]))
        if group:
            state.apply_node(name, {label: group})
        used = draw(st.lists(st.integers(0, count - 1), unique=True, max_size=count))
        slices = [
            (d, kind["vram_mib"], True)
            if draw(st.booleans())
            else (d, draw(st.integers(1, kind["vram_mib"])), False)
            for d in used
        ]
        if slices:
            occupy(state, name, slices)
    held: dict[str, Held] = {}
    for kind in draw(st.lists(st.sampled_from(KINDS), unique_by=lambda k: k["model"])):
        whole = draw(st.integers(0, 6))
        size, n = draw(st.integers(1, 40000)), draw(st.integers(0, 6))
        held[f"{kind['vendor']}/{kind['model']}"] = Held(
            whole_devices=whole,
            devices=whole + n,
            vram_mib=whole * kind["vram_mib"] + size * n,
            slices=((size, n),) if n else (),
        )
    return state, held


asks = st.one_of(
    st.builds(Requests, devices=st.integers(1, 3)),
    st.builds(Requests, vram_mib=st.integers(1000, 40000)),
)


@st.composite
def gangs_(draw: st.DrawFn, name: str = "job") -> gangs.Gang:
    policy = Policy(substitution=draw(st.sampled_from(["deny", "allow"])))
    return gang(
        draw(st.integers(1, 20)),
        draw(asks),
        policy,
        name=name,
        collective=draw(st.sampled_from(["", "flagcx"])),
        priority=draw(st.integers(0, 2)),
        since_s=draw(st.floats(0, 100)),
    )


def over_capacity(state: ClusterState, ranks: Iterable[gangs.RankPlace]) -> list[str]:
    """What ``ranks`` take beyond what each device has free in ``state``."""
    taken: dict[tuple[str, int], list[tuple[str, int, bool]]] = defaultdict(list)
    for r in ranks:
        for s in r.devices:
            taken[(r.node, s.index)].append((r.key, s.vram_mib, s.whole))
    problems = []
    for (node, index), slices in taken.items():
        view = state.nodes[node]
        dev = view.devices[index]
        key = f"{dev.fp.vendor}/{dev.fp.model}"
        if not view.schedulable or not dev.usable or any(k != key for k, _, _ in slices):
            problems.append(f"{node}/{index}: not a usable {key}")
        if any(w for _, _, w in slices) and (len(slices) > 1 or not dev.idle):
            problems.append(f"{node}/{index}: a whole device shared")
        if sum(m for _, m, _ in slices) > dev.free_mib:
            problems.append(f"{node}/{index}: over its free VRAM")
    return problems


def pledges_squeezed(
    state: ClusterState, held: dict[str, Held], plans: Sequence[gangs.GangPlan]
) -> list[str]:
    """Pledge counts that held before the gangs and fail once they hold
    their ranks: idle devices and VRAM left (``room_left``), each pledged
    slice size packed (``slices_fit``)."""
    extra: dict[str, list[Reservation]] = defaultdict(list)
    for plan in plans:
        for r in plan.ranks:
            ref = PodRef(namespace="gang", name=r.member, uid=r.member)
            extra[r.node].append(Reservation(pod=ref, devices=r.devices, state="bound", time_s=1.0))
    after = []
    for node in state.schedulable():
        doc = state.reservations_of(node.name)
        mine = doc.reservations if doc is not None else ()
        more = (*mine, *extra[node.name])
        after.append(booked(node, NodeReservations(node=node.name, reservations=more)))
    old, new = summarise(state.schedulable()).classes, summarise(after).classes
    problems = []
    for key in {r.key for plan in plans for r in plan.ranks}:
        pledged = held.get(key, Held())
        for name, was, now in zip(
            ("idle", "vram", *(f"{s} MiB slices" for s, _ in pledged.slices)),
            _counts(old[key], pledged),
            _counts(new[key], pledged),
            strict=True,
        ):
            if was and not now:
                problems.append(f"pledges of {key}: {name} squeezed")
    return problems


def _counts(stats: ClassStats, pledged: Held) -> list[bool]:
    idle, free = room_left(
        idle_devices=stats.idle_devices,
        free_mib=stats.free_mib,
        vram_mib=stats.vram_mib,
        pledged=pledged,
    )
    return [
        idle >= 0,
        free >= 0,
        *(
            slices_fit(
                stats.free_counts, device_mib=stats.vram_mib, size_mib=s, devices=0, pledged=pledged
            )
            for s, _ in pledged.slices
        ),
    ]


PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(view=views(), job=gangs_())
def test_a_gang_plan_is_whole_within_capacity_and_on_one_library(
    view: tuple[ClusterState, dict[str, Held]], job: gangs.Gang
) -> None:
    state, held = view
    plan = gangs.plan_gang(state, job, held=held)
    if not plan.ok:
        assert plan.ranks == () and plan.nodes == ()
        return
    assert sorted(r.member for r in plan.ranks) == sorted(m.name for m in job.members)
    assert over_capacity(state, plan.ranks) == []
    assert pledges_squeezed(state, held, [plan]) == []
    libraries = {LIBRARY[r.vendor] for r in plan.ranks}
    if len(libraries) > 1:
        assert job.collective == "flagcx" and libraries <= gangs.BRIDGES["flagcx"]
        assert "hccl" not in libraries
    if job.members[0].policy.substitution != "allow" and not job.collective:
        assert len(plan.classes) == 1
    groups = {network_of(state, n) for n in nodes_of(plan)}
    assert len(groups) == 1
    if len(nodes_of(plan)) > 1:
        label, value = groups.pop()
        assert label and value == plan.group


def network_of(state: ClusterState, node: str) -> tuple[str, str]:
    labels = state.nodes[node].labels
    label = FABRIC if labels.get(FABRIC) else GROUP if labels.get(GROUP) else ""
    return label, labels.get(label, node)


@PROPERTY
@given(view=views(), waiting=st.lists(gangs_(), min_size=1, max_size=4), now=st.floats(0, 2000))
def test_admit_order_never_starts_gangs_that_together_exceed_the_room(
    view: tuple[ClusterState, dict[str, Held]], waiting: list[gangs.Gang], now: float
) -> None:
    state, held = view
    waiting = [renamed(g, f"job{i}") for i, g in enumerate(waiting)]
    admitted = gangs.admit_order(waiting, state=state, now=now, starvation_s=500.0, held=held)
    assert len(admitted.start) + len(admitted.waiting) + len(admitted.refused) == len(waiting)
    ranks = [r for plan in admitted.start for r in plan.ranks]
    assert over_capacity(state, ranks) == []
    assert pledges_squeezed(state, held, admitted.start) == []
    for plan in admitted.start:
        assert len(plan.ranks) == len(next(g for g in waiting if g.name == plan.gang).members)
    assert all(p.ranks == () for p in (*admitted.waiting, *admitted.refused))


def renamed(job: gangs.Gang, name: str) -> gangs.Gang:
    """``job`` under ``name``, its members renamed to match (names unique per gang)."""
    members = tuple(
        gangs.Member(f"{name}-{i}", m.requests, m.policy) for i, m in enumerate(job.members)
    )
    return gangs.Gang(name, members, job.collective, job.priority, job.since_s)


@PROPERTY
@given(
    counts=st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 8)), min_size=1, max_size=5),
    n=st.integers(1, 40),
    mixing=st.sampled_from(["deny", "allow"]),
)
def test_a_gang_is_placed_whenever_one_library_in_one_group_has_room_for_it(
    counts: list[tuple[dict, int]], n: int, mixing: str
) -> None:
    state = fleet(*((f"n{i}", kind, "g1") for i, (kind, _) in enumerate(counts)))
    for i, (_, busy) in enumerate(counts):
        if busy:
            occupy(state, f"n{i}", [(d, 1024, True) for d in range(busy)])
    free: dict[str, int] = defaultdict(int)
    for kind, busy in counts:
        key = LIBRARY[kind["vendor"]] if mixing == "allow" else kind["model"]
        free[key] += 8 - busy
    plan = gangs.plan_gang(state, gang(n, policy=Policy(substitution=mixing)))
    assert plan.ok == (max(free.values()) >= n), plan.reason
    if plan.ok:
        assert over_capacity(state, plan.ranks) == []
        assert len({LIBRARY[r.vendor] for r in plan.ranks}) == 1
