"""``hcs top``: the unified view of the fleet, per node and per vendor/model.

``summarise`` is pure (state → dict); ``render`` turns that into text; the
live loop lives in ``hcs.cli``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from hcs_bus.messages import CheckpointEvent, HealthEvent
from scheduler.view.state import ClusterState, NodeView, fleet_totals, free_for_work


def summarise(
    state: ClusterState,
    *,
    alerts: deque[HealthEvent] | None = None,
    checkpoints: dict[str, CheckpointEvent] | None = None,
) -> dict[str, Any]:
    nodes = sorted(state.nodes.values(), key=lambda n: n.name)
    return {
        "nodes": [_node_row(n) for n in nodes],
        "models": _model_rows(nodes),
        "totals": fleet_totals(nodes),
        "jobs": _job_rows(nodes, checkpoints or {}),
        "alerts": [_alert_row(e) for e in (alerts or ())],
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
        "severity": event.severity,
        "source": event.source,
        "verdict": event.verdict,
        "message": event.message,
        "evidence": dict(event.evidence),
    }


def _gib(mib: float) -> str:
    return f"{mib / 1024:,.0f}"


def render(summary: dict[str, Any]) -> str:
    lines = [
        f"{'NODE':<28} {'MODELS':<34} {'DEV':>3} {'OK':>3} {'DEG':>3} {'FAIL':>4} "
        f"{'VRAM FREE/TOTAL GiB':>20} {'ACU':>7} {'HEALTH':>6}  STATE"
    ]
    for row in summary["nodes"]:
        state = "stale" if row["stale"] else row["verdict"]
        vram = f"{_gib(row['vram_free_mib'])}/{_gib(row['vram_total_mib'])}"
        lines.append(
            f"{row['node'][:28]:<28} {','.join(row['models'])[:34]:<34} {row['devices']:>3} "
            f"{row['healthy']:>3} {row['degraded']:>3} {row['failed']:>4} {vram:>20} "
            f"{row['acu']:>7.0f} {row['health']:>6}  {state}"
        )
    lines += [
        "",
        f"{'VENDOR/MODEL':<28} {'DEV':>4} {'UNHEALTHY':>9} {'VRAM FREE/TOTAL GiB':>20} {'ACU':>8}",
    ]
    for row in summary["models"]:
        vram = f"{_gib(row['vram_free_mib'])}/{_gib(row['vram_total_mib'])}"
        counts = f"{row['devices']:>4} {row['unhealthy']:>9}"
        lines.append(f"{row['model']:<28} {counts} {vram:>20} {row['acu']:>8.0f}")
    t = summary["totals"]
    lines += [
        "",
        f"FLEET  nodes {t['nodes']:.0f}  devices {t['devices']:.0f}  "
        f"unhealthy {t['unhealthy_devices']:.0f}  VRAM {_gib(t['vram_free_mib'])}/"
        f"{_gib(t['vram_total_mib'])} GiB free  ACU {t['acu']:,.0f}",
    ]
    if summary["jobs"]:
        lines += ["", f"{'JOB':<20} {'POD':<12} {'NODE':<16} {'DEVICES':<26} LAST CHECKPOINT"]
        for j in summary["jobs"]:
            where = f"{j['job']:<20} {j['pod']:<12} {j['node']:<16} {j['devices']:<26}"
            lines.append(f"{where} {j['checkpoint']}")
    if summary["alerts"]:
        lines += ["", "RECENT ALERTS (hcs.health.*)"]
        for a in summary["alerts"][-8:]:
            where = a["node"] + (f"/{a['device']}" if a["device"] is not None else "")
            what = a["verdict"] or a["kind"]
            lines.append(
                f"  {a['severity']:<8} {a['source']:<6} {where:<32} {what}  {a['message']}"
            )
    return "\n".join(lines)
