"""Bus time in the pure view: the server's receive time and the per-node
sequence decide, never the clock in a message body."""

from __future__ import annotations

import math

import pytest
from msgspec import structs

from hcs_bus.clocks import BusClock, future_claim
from scheduler.view.state import ClusterState
from tests.view.factories import fingerprint, verdict

RECEIVED_S = 1_700_000_000.0  # the server's clock when it stored the message
HOUR_S = 3600.0


@pytest.mark.parametrize("clock_off_s", [HOUR_S, -HOUR_S, 0.0])
def test_a_node_is_as_fresh_as_the_server_receive_time_whatever_its_own_clock_says(
    clock_off_s: float,
) -> None:
    state = ClusterState()
    for seq in range(1, 5):  # every 10 s on the server's clock
        fp = fingerprint("n1", seq=seq, time_s=RECEIVED_S + 10 * seq + clock_off_s)
        assert state.apply_fingerprint(fp, now=RECEIVED_S + 10 * seq)
        assert state.mark_stale(now=RECEIVED_S + 10 * seq + 9, stale_after_s=35) == []
    assert state.mark_stale(now=RECEIVED_S + 40 + 35, stale_after_s=35) == []
    assert state.mark_stale(now=RECEIVED_S + 40 + 36, stale_after_s=35) == ["n1"]


def test_a_clock_stepped_back_an_hour_within_a_boot_does_not_make_the_node_stale() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=1, time_s=RECEIVED_S + HOUR_S), now=RECEIVED_S)
    for seq in range(2, 10):  # the clock corrected: each body an hour earlier than the first
        fp = fingerprint("n1", seq=seq, time_s=RECEIVED_S + 10 * seq)
        assert state.apply_fingerprint(fp, now=RECEIVED_S + 10 * seq)
    assert state.mark_stale(now=RECEIVED_S + 100, stale_after_s=35) == []
    assert state.nodes["n1"].fingerprint.seq == 9


def test_an_out_of_order_fingerprint_never_becomes_the_node_state_nor_keeps_it_fresh() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=5, devices=2), now=RECEIVED_S)
    late = fingerprint("n1", seq=3, devices=8, time_s=RECEIVED_S + HOUR_S)
    assert not state.apply_fingerprint(late, now=RECEIVED_S + 30)
    node = state.nodes["n1"]
    assert (node.fingerprint.seq, len(node.devices), node.seen_at) == (5, 2, RECEIVED_S)
    assert state.mark_stale(now=RECEIVED_S + 36, stale_after_s=35) == ["n1"]
    assert state.stale_ignored == 1


def test_the_next_fingerprint_of_a_stale_node_makes_it_fresh_again() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=1), now=RECEIVED_S)
    assert state.mark_stale(now=RECEIVED_S + 60, stale_after_s=35) == ["n1"]
    state.apply_fingerprint(fingerprint("n1", seq=2), now=RECEIVED_S + 61)
    assert state.mark_stale(now=RECEIVED_S + 62, stale_after_s=35) == []
    assert not state.nodes["n1"].stale


def test_the_bus_clock_is_the_server_clock_bounded_by_the_freshest_message() -> None:
    clock = BusClock()
    assert clock.now(loop_s=5.0) is None
    clock.saw(RECEIVED_S - 600, loop_s=10.0)  # a replayed fingerprint, ten minutes old
    assert clock.now(loop_s=11.0) == RECEIVED_S - 599
    clock.saw(RECEIVED_S, loop_s=12.0)  # a live one
    clock.saw(RECEIVED_S - 7200, loop_s=13.0)  # an old health event read after it
    assert clock.now(loop_s=20.0) == RECEIVED_S + 8
    clock.saw(0.0, loop_s=21.0)  # no receive time known: nothing learnt
    assert clock.now(loop_s=22.0) == RECEIVED_S + 10


def test_a_boot_claimed_after_the_server_received_the_message_is_refused_naming_the_field() -> None:
    fp = structs.replace(fingerprint("n1", time_s=RECEIVED_S), boot_s=RECEIVED_S + HOUR_S)
    why = future_claim(fp, received_s=RECEIVED_S, tolerance_s=30.0)
    assert "boot_s" in why and "3600 s after the server received it" in why
    assert "tolerance 30 s" in why


@pytest.mark.parametrize("clock_off_s", [HOUR_S, -HOUR_S, 0.0])
def test_a_boot_in_the_past_is_believed_whatever_the_agent_clock_says(clock_off_s: float) -> None:
    body_now = RECEIVED_S + clock_off_s
    fp = structs.replace(fingerprint("n1", time_s=body_now), boot_s=body_now - 120.0)
    assert future_claim(fp, received_s=RECEIVED_S, tolerance_s=30.0) == ""


def test_a_boot_within_the_tolerance_is_believed() -> None:
    fp = structs.replace(fingerprint("n1", time_s=RECEIVED_S), boot_s=RECEIVED_S + 29.0)
    assert future_claim(fp, received_s=RECEIVED_S, tolerance_s=30.0) == ""
    assert future_claim(fp, received_s=RECEIVED_S, tolerance_s=10.0) != ""


@pytest.mark.parametrize(
    ("field", "value"), [("time_s", math.inf), ("time_s", math.nan), ("boot_s", -math.inf)]
)
def test_a_time_that_is_no_number_is_refused_naming_the_field(field: str, value: float) -> None:
    fp = structs.replace(fingerprint("n1"), **{field: value})
    assert future_claim(fp, received_s=RECEIVED_S, tolerance_s=30.0).startswith(
        f"fingerprint {field} is"
    )


def test_a_fingerprint_without_a_boot_time_or_another_message_claims_nothing() -> None:
    assert future_claim(fingerprint("n1"), received_s=RECEIVED_S, tolerance_s=30.0) == ""
    assert future_claim(verdict("n1", 0, "failed"), received_s=RECEIVED_S, tolerance_s=0) == ""
