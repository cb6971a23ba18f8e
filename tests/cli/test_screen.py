"""The live ``hcs top`` screen fits the terminal it is drawn on."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from hcs.screen import layout
from scheduler.console.panels import health_figure

BREAKER = (
    "circuit breaker refused to isolate npu-910b-0: 1 of 6 nodes (17 %) already isolated in the "
    "last 600 s, limit 10 %; the node keeps serving until an operator decides"
)


def _node(name: str, model: str, *, failed: int = 0) -> dict[str, Any]:
    return {
        "node": name,
        "models": [model],
        "devices": 8,
        "healthy": 8 - failed,
        "degraded": 0,
        "failed": failed,
        "vram_total_mib": 8 * 81920,
        "vram_free_mib": 6 * 81920,
        "acu": 800.0,
        "health": 40 if failed else 100,
        "verdict": "failed" if failed else "healthy",
        "stale": False,
        "pods": [],
        "labels": {},
    }


def _alert(n: int, message: str) -> dict[str, Any]:
    return {
        "node": f"gpu-a100-{n % 3}",
        "device": n % 8,
        "kind": "xid",
        "severity": "fatal" if n % 2 else "warning",
        "source": "agent",
        "verdict": None,
        "message": message,
        "evidence": {},
    }


def _summary(nodes: int, *, alerts: int) -> dict[str, Any]:
    rows = [_node(f"gpu-a100-{i}", "nvidia/A100-80G", failed=int(i == 4)) for i in range(nodes)]
    return {
        "nodes": rows,
        "models": [
            {
                "model": m,
                "devices": 8,
                "vram_total_mib": 1,
                "vram_free_mib": 1,
                "acu": 1.0,
                "unhealthy": 0,
            }
            for m in ("nvidia/A100-80G", "nvidia/H100-SXM", "huawei/Ascend910B2", "hygon/K100")
        ],
        "totals": {
            "nodes": nodes,
            "devices": 8.0 * nodes,
            "unhealthy_devices": 1.0,
            "health": health_figure({"healthy": 8 * nodes - 1, "failed": 1}),
            "vram_free_mib": 1e6,
            "vram_total_mib": 2e6,
            "acu": 4800.0,
        },
        "jobs": [
            {
                "job": "demo/llama-70b-finetune",
                "pod": "train-1",
                "node": "gpu-h100-0",
                "devices": "8 × nvidia/H100-SXM",
                "state": "bound",
                "checkpoint": "s3://hcs-demo/llama/step-1200",
                "step": 1200,
            }
        ],
        "alerts": [_alert(99, BREAKER)]  # newest first
        + [_alert(n, f"Xid {n}: a message") for n in reversed(range(alerts - 1))],
    }


def _draw(summary: dict[str, Any], *, width: int, height: int) -> list[str]:
    out = io.StringIO()
    console = Console(width=width, height=height, file=out, color_system=None, legacy_windows=False)
    console.print(layout(summary, width=width, height=height))
    return out.getvalue().rstrip("\n").split("\n")


@pytest.mark.parametrize("nodes", [6, 40])
def test_the_screen_fits_80_by_24_and_keeps_the_newest_alert_whole(nodes: int) -> None:
    lines = _draw(_summary(nodes, alerts=12), width=80, height=24)
    assert len(lines) <= 24, "\n".join(lines)
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    text = " ".join(" ".join(lines).split())
    assert " ".join(BREAKER.split()) in text, "\n".join(lines)
    assert "gpu-a100-4" in text  # the failed node is shown even when others are not
    assert "s3://hcs-demo/llama/step-1200" in text


def test_many_nodes_are_summed_up_in_one_row_when_they_do_not_fit() -> None:
    lines = _draw(_summary(40, alerts=3), width=80, height=24)
    more = [line for line in lines if line.startswith("… ")]
    assert len(more) == 1 and "more" in more[0], "\n".join(lines)
    shown = sum(line.startswith("gpu-a100-") for line in lines)
    assert shown + int(more[0].split()[1]) == 40


def test_a_larger_terminal_gets_more_columns_rows_and_the_model_table() -> None:
    small = _draw(_summary(6, alerts=12), width=80, height=24)
    large = _draw(_summary(6, alerts=12), width=160, height=50)
    assert "SCORE" not in small[1] and "SCORE" in large[1]
    assert "hygon/K100" in "\n".join(large) and len(large) <= 50
    assert sum("Xid" in line for line in large) > sum("Xid" in line for line in small)
