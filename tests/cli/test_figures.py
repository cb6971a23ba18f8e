"""One format per figure and one order for alerts in the three views: ``hcs top
--once`` (``hcs.top.render``), its live screen (``hcs.screen.layout``) and the
console (``panels.overview``; its page writes the numbers as ``console.js``
does, checked in a real browser by test_console_browser)."""

from __future__ import annotations

import io
import re
from collections import deque
from typing import Any

import pytest
from msgspec import structs
from rich.console import Console

from hcs.screen import layout
from hcs.top import render, summarise
from hcs_bus.messages import HealthEvent
from scheduler.console import panels
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import DB, node_fp
from tests.view.factories import verdict

FIGURE = "14/16 healthy, worst: failed"


def _state() -> ClusterState:
    """gpu-h: 8 × H100-SXM (2,537 ACU), device 3 failed; gpu-a: 8 × A100-80G
    (800 ACU), device 1 degraded."""
    state = ClusterState()
    state.apply_fingerprint(node_fp("gpu-h", "nvidia/H100-SXM"), now=0.0)
    state.apply_fingerprint(node_fp("gpu-a"), now=0.0)
    state.apply_health(verdict("gpu-h", 3, "failed"))
    state.apply_health(verdict("gpu-a", 1, "degraded"))
    return state


def _alerts() -> deque[HealthEvent]:
    """Three alerts as they came, oldest first."""
    base = verdict("gpu-h", 3, "failed")
    return deque(
        structs.replace(base, time_s=float(t), message=m)
        for t, m in ((1, "first alert"), (2, "second alert"), (3, "third alert"))
    )


def _screen(summary: dict[str, Any], *, width: int = 120, height: int = 40) -> str:
    out = io.StringIO()
    Console(width=width, height=height, file=out, color_system=None).print(
        layout(summary, width=width, height=height)
    )
    return out.getvalue()


def _console(state: ClusterState, alerts: deque[HealthEvent]) -> dict[str, Any]:
    return panels.overview(
        state, profiles=DB, alerts=alerts, checkpoints={}, limits={}, now_s=10.0, ready=True
    )


def test_the_health_figure_is_devices_healthy_of_all_and_the_worst_state_in_every_view() -> None:
    state = _state()
    summary = summarise(state, alerts=_alerts())
    assert summary["totals"]["health"]["text"] == FIGURE
    assert f"devices {FIGURE}" in render(summary)
    assert f"devices {FIGURE}" in _screen(summary)
    assert _console(state, _alerts())["totals"]["health"]["text"] == FIGURE


@pytest.mark.parametrize(
    ("counts", "text"),
    [
        ({"healthy": 8}, "8/8 healthy"),
        ({"healthy": 7, "degraded": 1}, "7/8 healthy, worst: degraded"),
        ({"healthy": 6, "degraded": 1, "stale": 1}, "6/8 healthy, worst: stale"),
        ({"healthy": 0, "degraded": 1, "failed": 1}, "0/2 healthy, worst: failed"),
        ({}, "no devices"),
    ],
)
def test_the_health_figure_names_the_worst_state_a_device_is_in(
    counts: dict[str, int], text: str
) -> None:
    assert panels.health_figure(counts)["text"] == text


def test_acu_and_gib_are_whole_numbers_with_a_thousands_separator_in_top_and_its_screen() -> None:
    summary = summarise(_state())
    text, screen = render(summary), _screen(summary)
    for view in (text, screen):
        assert "2,537" in view and "2537" not in view, view  # the H100 node and its model
        assert "ACU 3,337" in view, view  # the fleet
        assert not re.search(r"\d\.\d", view), view  # no decimals anywhere
    gpu_h = next(line for line in text.splitlines() if line.startswith("gpu-h "))
    assert gpu_h.split()[7] == "2,537", gpu_h
    assert "VRAM 1,200/1,280 GiB free" in text  # 16 × 80 GiB, the failed device out


def test_alerts_are_newest_first_in_every_view_and_limit_keeps_the_newest() -> None:
    state = _state()
    order = ["third alert", "second alert", "first alert"]

    def seen(view: str) -> list[str]:
        return sorted((m for m in order if m in view), key=view.index)

    assert seen(render(summarise(state, alerts=_alerts()))) == order
    assert seen(render(summarise(state, alerts=_alerts(), limit=2))) == order[:2]
    assert seen(_screen(summarise(state, alerts=_alerts()))) == order
    assert [a["message"] for a in _console(state, _alerts())["alerts"]] == order
