"""Fleet figures for the gauges: counted from the view, a failed device's
VRAM is never free, reservations are charged to their namespace."""

from __future__ import annotations

from hcs_bus.messages import HealthEvent, NodeReservations
from scheduler.ledger.pledge_rules import Held
from scheduler.view import gauge_meters as gauging
from scheduler.view.figures import MIB, fleet_figures
from tests.scheduler.helpers import node_fp as fp
from tests.scheduler.helpers import state_of
from tests.view.factories import reservation

A100_MIB = 81920


def _verdict(node: str, device: int, verdict: str) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind="verdict",
        severity="critical",
        source="healer",
        time_s=1.0,
        device=device,
        verdict=verdict,  # type: ignore[arg-type]
    )


def test_devices_vram_and_acu_by_model_health_and_state() -> None:
    state = state_of(fp("a", count=4), fp("b", "huawei/Ascend910B2", count=2))
    state.apply_health(_verdict("a", 3, "failed"))
    doc = NodeReservations(
        node="a",
        reservations=(
            reservation("ml", "whole", [(0, A100_MIB, True)]),
            reservation("ml", "slice", [(1, 16384, False)]),
            reservation("web", "slice", [(2, 8192, False)]),
        ),
    )
    state.apply_reservations("a", doc)
    figures = fleet_figures(state.nodes.values())

    assert figures.devices[("nvidia", "A100-80G", "healthy")] == 3
    assert figures.devices[("nvidia", "A100-80G", "failed")] == 1
    assert figures.devices[("huawei", "Ascend910B2", "healthy")] == 2
    vram = {k[2]: v / MIB for k, v in figures.vram_bytes.items() if k[1] == "A100-80G"}
    assert vram["total"] == 4 * A100_MIB
    assert vram["reserved"] == A100_MIB + 16384 + 8192
    # device 0 is taken whole, device 3 failed: only what is left on 1 and 2 is free
    assert vram["free"] == (A100_MIB - 16384) + (A100_MIB - 8192)
    acu = {k[2]: v for k, v in figures.acu.items() if k[1] == "A100-80G"}
    assert acu["total"] == 400.0
    assert acu["reserved"] == 100.0 + 100.0 * (16384 + 8192) / A100_MIB
    assert figures.namespace_vram_bytes == {
        "ml": (A100_MIB + 16384) * MIB,
        "web": 8192 * MIB,
    }
    assert figures.namespace_acu["ml"] == 100.0 + 100.0 * 16384 / A100_MIB


def test_a_stale_or_failed_node_has_nothing_free() -> None:
    state = state_of(fp("a", count=2))
    state.mark_stale(now=1_000.0, stale_after_s=1.0)
    figures = fleet_figures(state.nodes.values())
    assert figures.vram_bytes[("nvidia", "A100-80G", "free")] == 0
    assert figures.vram_bytes[("nvidia", "A100-80G", "total")] == 2 * A100_MIB * MIB


def test_an_empty_fleet_has_no_figures() -> None:
    figures = fleet_figures([])
    assert not figures.devices and not figures.vram_bytes and not figures.namespace_acu


def test_pledged_gauges_show_each_namespace_with_pledges_or_reservations() -> None:
    state = state_of(fp("pledge-a", count=2))
    doc = NodeReservations(
        node="pledge-a", reservations=(reservation("ml", "p", [(0, 8192, False)]),)
    )
    state.apply_reservations("pledge-a", doc)

    class Pledger:
        def by_namespace(self) -> dict[str, tuple[Held, int]]:
            return {"web": (Held(vram_mib=1024, acu=12.5, devices=1), 1)}

    pledger = Pledger()
    gauging.watch(state)
    gauging.watch_pledges(pledger)
    gauging._cache.clear()
    vram = {
        o.attributes["namespace"]: o.value
        for o in gauging._pledged(None, field="vram_mib", scale=MIB)
    }  # type: ignore[arg-type,index]
    acu = {
        o.attributes["namespace"]: o.value for o in gauging._pledged(None, field="acu", scale=1.0)
    }  # type: ignore[arg-type,index]
    assert vram["web"] == 1024 * MIB and acu["web"] == 12.5
    assert vram["ml"] == 0.0 and acu["ml"] == 0.0  # reservations only: pledged 0, not absent
