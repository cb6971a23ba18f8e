"""``hcs top``: the unified view of the fleet, per node and per vendor/model.

``summarise`` is pure (state → dict); ``render`` turns that into text; the
live loop lives in ``hcs.cli``.

One format per figure in every view (this text, the live screen of
``hcs.screen``, the console): ACU and GiB as whole numbers with a thousands
separator (``acu_text``, ``gib_text``); the fleet's health as devices healthy
of all and the worst state (``scheduler.console.panels.health_figure``);
alerts newest first.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from hcs_bus.messages import CheckpointEvent, HealthEvent
from scheduler.console.panels import health_counts, health_figure
from scheduler.view.state import ClusterState, NodeView, fleet_totals, free_for_work

ALERTS_SHOWN = 8  # hcs top --once, unless --limit says otherwise


def acu_text(acu: float) -> str:
    """ACU as every view writes it: a whole number, thousands separated."""
    return f"{acu:,.0f}"


def gib_text(mib: float) -> str:
    """VRAM in GiB as every view writes it: a whole number, thousands separated."""
    return f"{mib / 1024:,.0f}"


def summarise(
    state: ClusterState,
    *,
    alerts: deque[HealthEvent] | None = None,
    checkpoints: dict[str, CheckpointEvent] | None = None,
    limit: int | None = None,
) -> dict[str, Any]:
    """``alerts`` oldest first, as they came; the summary lists them newest
    first, at most ``limit`` of them."""
    nodes = sorted(state.nodes.values(), key=lambda n: n.name)
    newest_first = [_alert_row(e) for e in reversed(alerts or ())]
    return {
        "nodes": [_node_row(n) for n in nodes],
        "models": _model_rows(nodes),
        "totals": {**fleet_totals(nodes), "health": health_figure(health_counts(nodes))},
        "jobs": _job_rows(nodes, checkpoints or {}),
        "alerts": newest_first[:limit],
    }


def _job_rows(
    nodes: list[NodeView], checkpoints: dict[str, CheckpointEvent]
) -> list[dict[str, Any]]:
    rows = []
    for node in nodes:
        for r in node.reservations.values():
            if not r.job:
                continue
            last = checkpoints.get(f"{r.pod.namespace}/{r.job}")
            rows.append(
                {
                    "job": f"{r.pod.namespace}/{r.job}",
                    "pod": r.pod.name,
                    "node": node.name,
                    "devices": f"{len(r.devices)} × {r.vendor}/{r.model}",
                    "state": r.state,
                    "checkpoint": last.uri if last else "",
                    "step": last.step if last else None,
                }
            )
    return sorted(rows, key=lambda row: (row["job"], row["pod"]))


def _node_row(node: NodeView) -> dict[str, Any]:
    devices = list(node.devices.values())
    models = sorted(node.models())
    return {
        "node": node.name,
        "models": models,
        "devices": len(devices),
        "healthy": sum(d.verdict == "healthy" for d in devices),
        "degraded": sum(d.verdict == "degraded" for d in devices),
        "failed": sum(d.verdict == "failed" for d in devices),
        "vram_total_mib": sum(d.fp.vram_usable_mib for d in devices),
        "vram_free_mib": sum(free_for_work(node, d) for d in devices),
        "acu": round(sum(d.fp.compute.acu for d in devices), 1),
        "health": min((d.health_score for d in devices), default=100),
        "verdict": node.verdict,
        "stale": node.stale,
        "pods": sorted(node.reservations),
        "labels": dict(node.labels),
    }


def _model_rows(nodes: list[NodeView]) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = defaultdict(
        lambda: {"devices": 0, "vram_total_mib": 0, "vram_free_mib": 0, "acu": 0.0, "unhealthy": 0}
    )
    for node in nodes:
        for device in node.devices.values():
            row = rows[f"{device.fp.vendor}/{device.fp.model}"]
            row["devices"] += 1
            row["vram_total_mib"] += device.fp.vram_usable_mib
            row["vram_free_mib"] += free_for_work(node, device)
            row["acu"] += device.fp.compute.acu
            row["unhealthy"] += device.verdict != "healthy"
    return [{"model": k, **v, "acu": round(v["acu"], 1)} for k, v in sorted(rows.items())]


def _alert_row(event: HealthEvent) -> dict[str, Any]:
    return {
        "node": event.node,
        "device": event.device,
        "kind": event.kind,
        "time_s": event.time_s,
        "severity": event.severity,
        "source": event.source,
        "verdict": event.verdict,
        "message": event.message,
        "evidence": dict(event.evidence),
    }


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"{'NODE':<28} {'MODELS':<34} {'DEV':>3} {'OK':>3} {'DEG':>3} {'FAIL':>4} "
        f"{'VRAM FREE/TOTAL GiB':>20} {'ACU':>7} {'SCORE':>6}  STATE"
    ]
    for row in summary["nodes"]:
        state = "stale" if row["stale"] else row["verdict"]
        vram = f"{gib_text(row['vram_free_mib'])}/{gib_text(row['vram_total_mib'])}"
        lines.append(
            f"{row['node'][:28]:<28} {','.join(row['models'])[:34]:<34} {row['devices']:>3} "
            f"{row['healthy']:>3} {row['degraded']:>3} {row['failed']:>4} {vram:>20} "
            f"{acu_text(row['acu']):>7} {row['health']:>6}  {state}"
        )
    lines += [
        "",
        f"{'VENDOR/MODEL':<28} {'DEV':>4} {'UNHEALTHY':>9} {'VRAM FREE/TOTAL GiB':>20} {'ACU':>8}",
    ]
    for row in summary["models"]:
        vram = f"{gib_text(row['vram_free_mib'])}/{gib_text(row['vram_total_mib'])}"
        counts = f"{row['devices']:>4} {row['unhealthy']:>9}"
        lines.append(f"{row['model']:<28} {counts} {vram:>20} {acu_text(row['acu']):>8}")
    t = summary["totals"]
    lines += [
        "",
        f"FLEET  nodes {t['nodes']:.0f}  devices {t['health']['text']}  "
        f"VRAM {gib_text(t['vram_free_mib'])}/{gib_text(t['vram_total_mib'])} GiB free  "
        f"ACU {acu_text(t['acu'])}",
    ]
    if summary["jobs"]:
        lines += ["", f"{'JOB':<20} {'POD':<12} {'NODE':<16} {'DEVICES':<26} LAST CHECKPOINT"]
        for j in summary["jobs"]:
            where = f"{j['job']:<20} {j['pod']:<12} {j['node']:<16} {j['devices']:<26}"
            lines.append(f"{where} {j['checkpoint']}")
    if summary["alerts"]:
        lines += ["", f"ALERTS (hcs.health.*) newest first, {len(summary['alerts'])} shown"]
        for a in summary["alerts"]:
            where = a["node"] + (f"/{a['device']}" if a["device"] is not None else "")
            what = a["verdict"] or a["kind"]
            lines.append(
                f"  {a['severity']:<8} {a['source']:<6} {where:<32} {what}  {a['message']}"
            )
    return "\n".join(lines)
