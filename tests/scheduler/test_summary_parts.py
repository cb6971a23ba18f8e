"""The planner's summary from per-node parts: after any sequence of view
changes, each told to ``Parts.changed``, it equals a summary made afresh."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus.messages import DeviceSlice, NodeReservations, PodRef, Reservation
from scheduler.plan import fleet_summary
from scheduler.plan import rules as planning
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import dev, node_fp, state_of
from tests.view.factories import reservation, verdict

NODES = ("a", "b", "c", "d")
KEYS = ("nvidia/A100-80G", "huawei/Ascend910B2", "nvidia/H100-SXM")

node = st.sampled_from(NODES)


def fingerprints_on(nodes: st.SearchStrategy[str]) -> st.SearchStrategy[tuple[object, ...]]:
    """A fingerprint step: node, class, device count, VRAM in use, links."""
    return st.tuples(
        st.just("fingerprint"),
        nodes,
        st.sampled_from(KEYS),
        st.integers(1, 4),
        st.sampled_from((0, 480, 3161)),
        st.booleans(),
    )


fingerprint = fingerprints_on(node)
booking = st.tuples(
    st.just("reservations"),
    node,
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 40_000), st.booleans()), max_size=4),
)
health = st.tuples(
    st.just("verdict"), node, st.integers(0, 3), st.sampled_from(("failed", "degraded", "healthy"))
)
block = st.tuples(st.just("block"), node, st.sampled_from((None, "cordoned")))
stale = st.tuples(st.just("stale"), node)
gone = st.tuples(st.just("gone"), node)


def _apply(state: ClusterState, op: tuple) -> str:
    kind, name = op[0], op[1]
    if kind == "fingerprint":
        key, count, driver, broken = op[2:]
        devices = tuple(
            dev(i, key, driver_mib=driver, error="lost" if broken and i == 0 else None)
            for i in range(count)
        )
        state.apply_fingerprint(node_fp(name, key, devices=devices), now=0.0)
    elif kind == "reservations":
        held = tuple(
            reservation("ns" + str(i % 2), f"p{i}", [slice_]) for i, slice_ in enumerate(op[2])
        )
        state.apply_reservations(name, NodeReservations(node=name, reservations=held))
    elif kind == "verdict":
        state.apply_health(verdict(name, op[2], op[3]))
    elif kind == "block":
        state.apply_node(name, {}, blocked=op[2])
    elif kind == "stale" and name in state.nodes:
        state.nodes[name].stale = True
    elif kind == "gone":
        state.nodes.pop(name, None)
    return name


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(fingerprint, booking, health, block, stale, gone), max_size=25))
def test_a_summary_from_kept_parts_equals_one_made_afresh(ops: list[tuple]) -> None:
    state = ClusterState()
    parts = fleet_summary.Parts()
    for op in ops:
        parts.changed(_apply(state, op))
        assert parts.summary(state.nodes) == planning.summarise(state.nodes.values())


def test_a_node_not_said_to_have_changed_keeps_its_part() -> None:
    """What makes it cheap, and why every change must reach ``changed``."""
    state = ClusterState()
    state.apply_fingerprint(node_fp("a"), now=0.0)
    parts = fleet_summary.Parts()
    before = parts.summary(state.nodes)
    state.apply_health(verdict("a", 0, "failed"))
    assert parts.summary(state.nodes) == before  # not told
    parts.changed("a")
    after = parts.summary(state.nodes)
    assert after.classes["nvidia/A100-80G"].free_mib < before.classes["nvidia/A100-80G"].free_mib


def test_a_class_summary_folds_each_nodes_devices_as_the_planner_reads_them() -> None:
    """Two A100 nodes: a (4 devices, one 40 GiB slice, one failed) and b (2
    idle devices whose driver holds 480 MiB), and a cordoned H100 node."""
    state = ClusterState()
    state.apply_fingerprint(node_fp("a", count=4), now=0.0)
    state.apply_reservations(
        "a", NodeReservations(node="a", reservations=(reservation("ml", "p", [(1, 40960, False)]),))
    )
    state.apply_health(verdict("a", 3, "failed"))
    held = tuple(dev(i, driver_mib=480) for i in range(2))
    state.apply_fingerprint(node_fp("b", devices=held), now=0.0)
    state.apply_fingerprint(node_fp("c", "nvidia/H100-SXM"), now=0.0)
    state.apply_node("c", {}, blocked="cordoned")
    summary = fleet_summary.Parts().summary(state.nodes)
    assert set(summary.classes) == {"nvidia/A100-80G"}  # c takes no pods
    a100 = summary.classes["nvidia/A100-80G"]
    assert (a100.devices, a100.vram_mib) == (6, 81920 - 480)
    assert a100.free_mib == 81920 * 2 + 40960 + (81920 - 480) * 2
    assert (a100.idle_devices, a100.max_idle_per_node, a100.max_usable_per_node) == (4, 2, 3)
    assert a100.kth_free == [81920, 81920, 40960]
    assert summary.usage == {"ml": (40960, 0.0)}


# -- kept up to date node by node ---------------------------------------------

ACUS = (0.0, 0.1, 1 / 3, 12.5, 1e16)  # 1e16 swallows the others: a drifting sum shows
changing_node = st.sampled_from((*NODES, "e", "f"))
refingerprint = fingerprints_on(changing_node)
rebooking = st.tuples(
    st.just("reservations"),
    changing_node,
    st.lists(
        st.tuples(
            st.integers(0, 3),  # device
            st.integers(1, 40_000),  # MiB
            st.booleans(),  # whole
            st.sampled_from(("ml", "web", "batch")),
            st.sampled_from(ACUS),
            st.sampled_from(("", "pl-1", "pl-2", "pl-3")),
        ),
        max_size=4,
    ),
)
reverdict = st.tuples(
    st.just("verdict"),
    changing_node,
    st.sampled_from((None, 0, 1, 2, 3)),  # None: the node's own verdict
    st.sampled_from(("failed", "degraded", "healthy")),
)
reblock = st.tuples(st.just("block"), changing_node, st.sampled_from((None, "cordoned")))
restale = st.tuples(st.just("stale"), changing_node, st.booleans())
removal = st.tuples(st.just("gone"), changing_node)
vanishing = st.tuples(st.just("vanish"), changing_node)  # gone, and nobody told


def _change(state: ClusterState, op: tuple, *, seq: int) -> None:
    kind, name = op[0], op[1]
    node = state.nodes.get(name)
    if kind == "fingerprint":
        key, count, driver, broken = op[2:]
        devices = tuple(
            dev(i, key, driver_mib=driver, error="lost" if broken and i == 0 else None)
            for i in range(count)
        )
        state.apply_fingerprint(node_fp(name, key, devices=devices, seq=seq), now=0.0)
    elif kind == "reservations":
        held = tuple(
            Reservation(
                pod=PodRef(namespace=ns, name=f"p{i}", uid=f"uid-{i}"),
                devices=(DeviceSlice(index=index, uuid=f"GPU-{index}", vram_mib=mib, whole=whole),),
                state="bound",
                time_s=1.0,
                acu=acu,
                pledge=pledge,
            )
            for i, (index, mib, whole, ns, acu, pledge) in enumerate(op[2])
        )
        state.apply_reservations(name, NodeReservations(node=name, reservations=held))
    elif kind == "verdict":
        state.apply_health(verdict(name, op[2], op[3]))
    elif kind == "block":
        state.apply_node(name, {}, blocked=op[2])
    elif kind == "stale" and node is not None:
        node.stale = op[2]
    elif kind in ("gone", "vanish"):
        state.nodes.pop(name, None)


def _assert_same(got: planning.Summary, want: planning.Summary) -> None:
    assert list(got.classes) == sorted(want.classes)
    for key, stats in want.classes.items():
        assert dataclasses.asdict(got.classes[key]) == dataclasses.asdict(stats), key
    assert got.usage.keys() == want.usage.keys()
    for ns, (vram_mib, acu) in want.usage.items():
        assert got.usage[ns][0] == vram_mib, ns
        assert math.isclose(got.usage[ns][1], acu, rel_tol=1e-9, abs_tol=1e-9), ns
    assert got.pledge_ids == want.pledge_ids


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(refingerprint, rebooking, reverdict, reblock, restale, removal, vanishing),
        max_size=40,
    )
)
def test_a_summary_kept_by_taking_out_and_adding_node_parts_equals_one_made_afresh(
    ops: list[tuple],
) -> None:
    state = ClusterState()
    parts = fleet_summary.Parts()
    for seq, op in enumerate(ops, start=1):
        _change(state, op, seq=seq)
        if op[0] != "vanish":
            parts.changed(op[1])
        _assert_same(parts.summary(state.nodes), planning.summarise(state.nodes.values()))
        _assert_same_usage(parts.usage(state.nodes), state)


def _assert_same_usage(got: dict[str, planning.Usage], state: ClusterState) -> None:
    """What the quotas' ``status.used`` is written from: every node's
    reservations summed, schedulable or not, devices included."""
    held = (r for node in state.nodes.values() for r in node.reservations.values())
    want = planning.namespace_usage(held)
    assert got.keys() == want.keys()
    for ns, usage in want.items():
        assert (got[ns].vram_mib, got[ns].devices) == (usage.vram_mib, usage.devices), ns
        assert math.isclose(got[ns].acu, usage.acu, rel_tol=1e-9, abs_tol=1e-9), ns


def test_a_summary_makes_again_only_the_parts_of_the_nodes_said_to_have_changed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    state = state_of(*(node_fp(f"n{i}", count=2) for i in range(20)))
    parts = fleet_summary.Parts()
    parts.summary(state.nodes)
    made: list[str] = []
    node_part = planning.node_part
    monkeypatch.setattr(
        fleet_summary, "node_part", lambda node: made.append(node.name) or node_part(node)
    )
    for name in ("n3", "n11"):
        state.apply_health(verdict(name, 0, "failed"))
        parts.changed(name)
    summary = parts.summary(state.nodes)
    assert sorted(made) == ["n11", "n3"]
    assert summary.classes["nvidia/A100-80G"].devices == 40
    assert summary == planning.summarise(state.nodes.values())


def test_what_a_summary_hands_out_is_the_callers_to_change() -> None:
    state = state_of(node_fp("a", count=2), node_fp("b", count=1))
    parts = fleet_summary.Parts()
    first = parts.summary(state.nodes)
    stats = first.classes["nvidia/A100-80G"]
    stats.free_mib = 0
    stats.kth_free.append(1)
    stats.free_counts[1] = 99
    first.usage["ml"] = (1, 1.0)
    assert parts.summary(state.nodes) == planning.summarise(state.nodes.values())


def _hold_one(state: ClusterState, parts: fleet_summary.Parts, name: str, acu: float) -> None:
    """Node ``name`` holds one 1 GiB slice of ``acu`` for namespace ml; ``parts`` is told."""
    held = Reservation(
        pod=PodRef(namespace="ml", name=f"p-{name}", uid=name),
        devices=(DeviceSlice(index=0, uuid="GPU-0", vram_mib=1024, whole=False),),
        state="bound",
        time_s=1.0,
        acu=acu,
    )
    state.apply_reservations(name, NodeReservations(node=name, reservations=(held,)))
    parts.changed(name)


def test_taking_out_a_node_leaves_its_namespaces_usage_as_the_other_nodes_make_it() -> None:
    """A float sum that values are subtracted from drifts: 0.1 + 1e16 − 1e16 is 0."""
    state = state_of(node_fp("a"), node_fp("b"))
    parts = fleet_summary.Parts()
    for name, acu in (("a", 0.1), ("b", 1e16)):
        _hold_one(state, parts, name, acu)
        parts.summary(state.nodes)
    state.apply_reservations("b", None)
    parts.changed("b")
    assert parts.summary(state.nodes).usage == {"ml": (1024, 0.1)}


def test_an_infinite_acu_counts_as_a_float_sum_would_until_its_node_goes() -> None:
    state = state_of(node_fp("a"), node_fp("b"))
    parts = fleet_summary.Parts()
    for name, acu in (("a", 1.5), ("b", math.inf)):
        _hold_one(state, parts, name, acu)
    assert parts.summary(state.nodes).usage == {"ml": (2048, math.inf)}
    state.nodes.pop("b")
    parts.changed("b")
    assert parts.summary(state.nodes).usage == {"ml": (1024, 1.5)}


def test_a_namespaces_usage_follows_a_node_booked_again_while_another_holds_for_it() -> None:
    """``status.used`` of a quota is written from ``Parts.usage``: a node's
    old share is taken out before its new one is added, devices included."""
    state = state_of(node_fp("a"), node_fp("b"))
    parts = fleet_summary.Parts()
    for name in ("a", "b"):
        _hold_one(state, parts, name, 1.0)
    assert parts.usage(state.nodes) == {"ml": planning.Usage(vram_mib=2048, acu=2.0, devices=2)}
    _hold_one(state, parts, "a", 0.5)  # booked again: still one slice
    assert parts.usage(state.nodes) == {"ml": planning.Usage(vram_mib=2048, acu=1.5, devices=2)}
    state.apply_reservations("b", None)
    parts.changed("b")
    assert parts.usage(state.nodes) == {"ml": planning.Usage(vram_mib=1024, acu=0.5, devices=1)}
