"""The planner's summary from per-node parts: after any sequence of view
changes, each told to ``Parts.changed``, it equals a summary made afresh."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus.messages import NodeReservations
from scheduler.plan import rules as planning
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import dev, node_fp
from tests.view.factories import reservation, verdict

NODES = ("a", "b", "c", "d")
KEYS = ("nvidia/A100-80G", "huawei/Ascend910B2", "nvidia/H100-SXM")

node = st.sampled_from(NODES)
fingerprint = st.tuples(
    st.just("fingerprint"),
    node,
    st.sampled_from(KEYS),
    st.integers(1, 4),
    st.sampled_from((0, 480, 3161)),
    st.booleans(),
)
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
    parts = planning.Parts()
    for op in ops:
        parts.changed(_apply(state, op))
        assert parts.summary(state.nodes) == planning.summarise(state.nodes.values())


def test_a_node_not_said_to_have_changed_keeps_its_part() -> None:
    """What makes it cheap, and why every change must reach ``changed``."""
    state = ClusterState()
    state.apply_fingerprint(node_fp("a"), now=0.0)
    parts = planning.Parts()
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
    summary = planning.Parts().summary(state.nodes)
    assert set(summary.classes) == {"nvidia/A100-80G"}  # c takes no pods
    a100 = summary.classes["nvidia/A100-80G"]
    assert (a100.devices, a100.vram_mib) == (6, 81920 - 480)
    assert a100.free_mib == 81920 * 2 + 40960 + (81920 - 480) * 2
    assert (a100.idle_devices, a100.max_idle_per_node, a100.max_usable_per_node) == (4, 2, 3)
    assert a100.kth_free == [81920, 81920, 40960]
    assert summary.usage == {"ml": (40960, 0.0)}
