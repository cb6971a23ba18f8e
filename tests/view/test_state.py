"""The pure cluster state."""

from __future__ import annotations

from hcs_bus.messages import NodeReservations
from scheduler.view.state import ClusterState, fleet_totals
from tests.view.factories import fingerprint, reservation, verdict


def test_a_fingerprint_older_than_the_one_held_is_ignored() -> None:
    state = ClusterState()
    assert state.apply_fingerprint(fingerprint("n1", seq=5, devices=2), now=0)
    assert not state.apply_fingerprint(fingerprint("n1", seq=4, devices=8), now=1)
    assert len(state.nodes["n1"].devices) == 2
    assert state.stale_ignored == 1


def test_a_restarted_agent_is_accepted_with_a_new_boot_and_a_lower_seq() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=50, boot="a", time_s=10.0, devices=2), now=0)
    assert state.apply_fingerprint(fingerprint("n1", seq=1, boot="b", time_s=11.0), now=1)
    assert len(state.nodes["n1"].devices) == 8


def test_free_vram_is_total_minus_reservations_and_a_whole_device_has_none() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", devices=2), now=0)
    doc = NodeReservations(
        node="n1",
        reservations=(
            reservation("ml", "a", [(0, 16384, False)]),
            reservation("ml", "b", [(1, 81920, True)]),
        ),
    )
    state.apply_reservations("n1", doc)
    devices = state.nodes["n1"].devices
    assert devices[0].free_mib == 81920 - 16384
    assert devices[1].free_mib == 0 and devices[1].whole_owner == "ml/b"
    state.apply_reservations("n1", None)
    assert devices[0].free_mib == 81920 and devices[1].whole_owner is None


def test_reservations_arriving_before_the_fingerprint_are_applied_when_it_comes() -> None:
    state = ClusterState()
    state.apply_reservations(
        "n1",
        NodeReservations(node="n1", reservations=(reservation("ml", "a", [(0, 1000, False)]),)),
    )
    state.apply_fingerprint(fingerprint("n1", devices=1), now=0)
    assert state.nodes["n1"].devices[0].reserved_mib == 1000


def test_a_healer_verdict_survives_a_new_fingerprint() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=1, devices=2), now=0)
    assert state.apply_health(verdict("n1", 1, "failed"))
    state.apply_fingerprint(fingerprint("n1", seq=2, devices=2), now=1)
    assert state.nodes["n1"].devices[1].verdict == "failed"
    assert not state.nodes["n1"].devices[1].usable
    assert state.nodes["n1"].devices[0].usable


def test_events_that_are_not_healer_verdicts_do_not_change_health() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", devices=1), now=0)
    probe = verdict("n1", 0, "failed").__replace__(source="probe")
    assert not state.apply_health(probe)
    assert state.nodes["n1"].devices[0].verdict == "healthy"


def test_silent_nodes_become_stale_and_unschedulable() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1"), now=0)
    state.apply_fingerprint(fingerprint("n2"), now=30)
    assert state.mark_stale(now=40, stale_after_s=35) == ["n1"]
    assert [n.name for n in state.schedulable()] == ["n2"]
    assert state.mark_stale(now=41, stale_after_s=35) == []


def test_fleet_totals_add_up() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", devices=2), now=0)
    state.apply_fingerprint(fingerprint("n2", devices=3), now=0)
    totals = fleet_totals(state.nodes.values())
    assert totals["devices"] == 5
    assert totals["vram_total_mib"] == 5 * 81920
    assert totals["acu"] == 500.0


def test_a_new_report_of_the_same_devices_keeps_bookings_and_verdicts_and_takes_its_figures() -> (
    None
):
    from msgspec import structs

    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=1, devices=2), now=0)
    state.apply_reservations(
        "n1",
        NodeReservations(node="n1", reservations=(reservation("ml", "a", [(0, 16384, False)]),)),
    )
    state.apply_health(verdict("n1", 1, "failed"))
    state.mark_stale(now=100, stale_after_s=10)
    assert state.nodes["n1"].stale
    later = fingerprint("n1", seq=2, devices=2)
    hotter = structs.replace(later.devices[0], health_score=70)
    state.apply_fingerprint(structs.replace(later, devices=(hotter, later.devices[1])), now=101)
    node = state.nodes["n1"]
    assert not node.stale and node.seen_at == 101 and node.fingerprint.seq == 2
    assert node.devices[0].free_mib == 81920 - 16384 and node.devices[0].health_score == 70
    assert node.devices[0].verdict == "healthy" and node.devices[1].verdict == "failed"
    assert node.reservations.keys() == {"ml/a"}


def test_a_report_naming_other_devices_rebuilds_the_node() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", seq=1, devices=2), now=0)
    state.apply_fingerprint(fingerprint("n1", seq=2, devices=2, model="H100-SXM"), now=1)
    assert {d.fp.model for d in state.nodes["n1"].devices.values()} == {"H100-SXM"}
    state.apply_fingerprint(fingerprint("n1", seq=3, devices=4, model="H100-SXM"), now=2)
    assert len(state.nodes["n1"].devices) == 4


def test_a_failed_device_and_a_stale_node_count_no_free_vram_in_the_fleet_totals() -> None:
    state = ClusterState()
    state.apply_fingerprint(fingerprint("n1", devices=2), now=0)
    state.apply_fingerprint(fingerprint("n2", devices=1), now=95)
    state.apply_health(verdict("n1", 1, "failed"))
    assert fleet_totals(state.nodes.values())["vram_free_mib"] == 3 * 81920 - 81920
    state.mark_stale(now=100, stale_after_s=10)  # n1 silent for 100 s, n2 for 5 s
    assert fleet_totals(state.nodes.values())["vram_free_mib"] == 81920
