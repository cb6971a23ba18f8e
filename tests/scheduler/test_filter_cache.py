"""The extender's cached filter answers exactly what judging every name on
its own answers (``placing.check_node``): the same names passed, in order
and with repeats, the same reasons, resolvable or not, whatever the view
changed in between, whichever names are unknown, and however small the
entry budget (the reasons of nodes that filled are kept with their entries)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from hcs_bus.messages import NodeReservations
from scheduler.extender import rules as placing
from scheduler.extender.caches import NodeCache
from scheduler.plan.pods import PlanAnnotation
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import node_fp, state_of
from tests.view.factories import reservation, verdict

SLICE = PlanAnnotation(
    vendor="nvidia", model="A100-80G", devices=1, vram_mib_per_device=16384, whole_device=False
)
NODES = [f"n{i}" for i in range(8)]
NAMES = st.one_of(  # kube-scheduler's whole list, or any list at all
    st.just(NODES), st.lists(st.sampled_from([*NODES, "ghost"]), max_size=20)
)
CHANGE = st.tuples(
    st.sampled_from(NODES), st.sampled_from(["full", "empty", "stale", "failed", "fresh"])
)


def _apply(state: ClusterState, node: str, change: str) -> None:
    view = state.nodes[node]
    if change == "full":
        held = tuple(reservation("ml", f"{node}-{i}", [(i, 70000, False)]) for i in range(8))
        state.apply_reservations(node, NodeReservations(node=node, reservations=held))
    elif change == "empty":
        state.apply_reservations(node, NodeReservations(node=node, reservations=()))
    elif change == "stale":
        view.stale = True
    elif change == "failed":
        state.apply_health(verdict(node, None, "failed"))
    else:
        view.stale = False


def _judged(state: ClusterState, names: list[str]) -> tuple[list[str], dict, dict]:
    passed, failed, never = [], {}, {}
    for name in names:
        fit = placing.check_node(state.nodes.get(name), SLICE)
        if fit.ok:
            passed.append(name)
        elif fit.unresolvable:
            never[name] = fit.reason
        else:
            failed[name] = fit.reason
    return passed, failed, never


@settings(max_examples=300, deadline=None)
@given(
    rounds=st.lists(st.tuples(st.lists(CHANGE, max_size=3), NAMES), min_size=1, max_size=10),
    budget=st.sampled_from([2, 5, 1000]),
)
def test_a_cached_filter_answers_as_judging_each_name_does(
    rounds: list[tuple[list[tuple[str, str]], list[str]]], budget: int
) -> None:
    state = state_of(*(node_fp(n) for n in NODES))
    nodes = NodeCache(state, weights=placing.Weights(), max_entries=budget)
    for changes, names in rounds:
        for node, change in changes:
            _apply(state, node, change)
            nodes.changed(node)
        got = nodes.of(SLICE).filter(names)
        want = _judged(state, names)
        assert got == want
        assert [list(d) for d in got[1:]] == [list(d) for d in want[1:]]  # reasons in order
