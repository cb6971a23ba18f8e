"""What the web console shows, as JSON-ready dicts. Pure: no I/O, no clock
reads (times arrive as arguments), so every figure is testable on a built
``ClusterState``.

* ``overview`` is the one document the page draws and the live feed pushes:
  fleet totals, one row per vendor/model class (capacity and use in ACU and
  VRAM), nodes with a cell per device (health, occupant), jobs with their last
  checkpoint, quota use per namespace and the latest alerts.
* ``node_detail`` is one node with every device and reservation.
* ``History`` keeps periodic samples (utilisation per class, devices per
  health verdict) for the plots; ``series`` turns them into columns.
* ``alert_query`` / ``history_query`` / ``page_query`` read URL parameters
  strictly: a bad or unknown parameter is a ``QueryError`` naming it (HTTP 400).

Free VRAM counts only devices that can take work (usable devices of
schedulable nodes); what failed devices and stale nodes hold is ``out``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hcs_bus.errors import HcsError
from hcs_bus.messages import SEVERITY_RANK, CheckpointEvent, HealthEvent
from hcs_bus.profiles import ProfileDB
from scheduler.plan.rules import QuotaLimits
from scheduler.view.state import ClusterState, DeviceView, NodeView

MAX_LIVE_NODES = 500  # node rows in one pushed overview; the rest through /api/nodes
LIVE_ALERTS = 50
HEALTH_STATES = ("healthy", "degraded", "failed", "stale")


class QueryError(HcsError):
    """A console query the API refuses; the message is the reason (HTTP 400)."""


# -- devices and nodes ------------------------------------------------------


def _owners(device: DeviceView) -> list[str]:
    return [device.whole_owner] if device.whole_owner else sorted(device.slice_owners)


def _reserved_share(device: DeviceView) -> float:
    if device.whole_owner is not None:
        return 1.0
    total = device.fp.vram_usable_mib
    return min(device.reserved_mib / total, 1.0) if total > 0 else 0.0


def _health(node: NodeView, device: DeviceView) -> str:
    return "stale" if node.stale else device.verdict


def device_row(node: NodeView, device: DeviceView) -> dict[str, Any]:
    fp, t = device.fp, device.fp.telemetry
    return {
        "index": fp.index,
        "uuid": fp.uuid,
        "class": f"{fp.vendor}/{fp.model}",
        "health": _health(node, device),
        "health_score": device.health_score,
        "vram_total_mib": fp.vram_usable_mib,
        "vram_driver_mib": fp.vram_driver_mib,  # held by the driver, outside the total
        "vram_reserved_mib": device.reserved_mib,
        "vram_free_mib": device.free_mib,
        "acu": round(fp.compute.acu, 1),
        "acu_measured": fp.compute.acu_measured,
        "utilisation_pct": t.utilisation_pct,
        "temperature_c": t.temperature_c,
        "power_w": t.power_w,
        "owners": _owners(device),
        "whole": device.whole_owner is not None,
        "error": fp.error,
    }


def node_row(node: NodeView) -> dict[str, Any]:
    devices = [node.devices[i] for i in sorted(node.devices)]
    counts = {state: 0 for state in HEALTH_STATES}
    for device in devices:
        counts[_health(node, device)] += 1
    return {
        "name": node.name,
        "classes": sorted(node.models()),
        "state": "stale" if node.stale else node.verdict,
        "blocked": node.blocked,  # why its Node takes no new pods (cordoned, a lifecycle taint)
        "devices": len(devices),
        **counts,
        "vram_total_mib": sum(d.fp.vram_usable_mib for d in devices),
        "vram_free_mib": sum(d.free_mib for d in devices if _takes_work(node, d)),
        "acu": round(sum(d.fp.compute.acu for d in devices), 1),
        "pods": sorted(node.reservations),
        "cells": [
            {
                "index": d.index,
                "health": _health(node, d),
                "owners": _owners(d),
                "reserved_pct": round(100 * _reserved_share(d)),
            }
            for d in devices
        ],
    }


def node_detail(node: NodeView) -> dict[str, Any]:
    row = node_row(node)
    del row["cells"]
    devices = [device_row(node, node.devices[i]) for i in sorted(node.devices)]
    reservations = [
        {
            "pod": key,
            "state": r.state,
            "job": r.job,
            "class": f"{r.vendor}/{r.model}" if r.vendor else "",
            "acu": round(r.acu, 1),
            "devices": [s.index for s in r.devices],
            "vram_mib": sum(s.vram_mib for s in r.devices),
            "time_s": r.time_s,
        }
        for key, r in sorted(node.reservations.items())
    ]
    fp = node.fingerprint
    agent = {"version": fp.agent_version, "seq": fp.seq, "time_s": fp.time_s}
    labels = dict(sorted(node.labels.items()))
    extra = {"simulated": fp.simulated, "agent": agent, "labels": labels}
    return {**row, **extra, "device_list": devices, "reservations": reservations}


def _takes_work(node: NodeView, device: DeviceView) -> bool:
    return node.schedulable and device.usable


def _attention(node: NodeView) -> tuple[int, str]:
    """Nodes needing a look first (failed, stale, taking no pods, degraded), then by name."""
    if node.stale or node.verdict == "failed" or node.blocked:
        rank = 0
    elif any(d.verdict != "healthy" for d in node.devices.values()) or node.verdict != "healthy":
        rank = 1
    else:
        rank = 2
    return rank, node.name


# -- classes and totals -----------------------------------------------------


def _blank_class(key: str, profiles: ProfileDB) -> dict[str, Any]:
    vendor, _, model = key.partition("/")
    row: dict[str, Any] = {"class": key, "vendor": vendor, "model": model, "devices": 0}
    row |= {state: 0 for state in HEALTH_STATES}
    row |= {"vram_total_mib": 0, "vram_reserved_mib": 0, "vram_free_mib": 0, "vram_out_mib": 0}
    row |= {"acu_total": 0.0, "acu_reserved": 0.0, "acu_out": 0.0, "utilisation_pct": 0.0}
    profile = profiles.match(vendor, model)
    row["profile"] = None
    if profile is not None:
        row["profile"] = {
            "name": profile.name,
            "vram_mib": profile.vram_mib,
            "tflops_fp16": profile.tflops_fp16,
            "acu": round(profile.acu, 1),
            "interconnect": profile.interconnect,
        }
    return row


def class_rows(nodes: Iterable[NodeView], *, profiles: ProfileDB) -> list[dict[str, Any]]:
    """Capacity and use per vendor/model class, in devices, VRAM and ACU."""
    rows: dict[str, dict[str, Any]] = {}
    for node in nodes:
        for device in node.devices.values():
            key = f"{device.fp.vendor}/{device.fp.model}"
            row = rows.get(key) or rows.setdefault(key, _blank_class(key, profiles))
            _add_device(row, node, device)
    out = []
    for key in sorted(rows):
        row = rows[key]
        row["utilisation_pct"] = round(row["utilisation_pct"] / max(row["devices"], 1), 1)
        for name in ("acu_total", "acu_reserved", "acu_out"):
            row[name] = round(row[name], 1)
        out.append(row)
    return out


def _add_device(row: dict[str, Any], node: NodeView, device: DeviceView) -> None:
    acu = device.fp.compute.acu
    row["devices"] += 1
    row[_health(node, device)] += 1
    row["vram_total_mib"] += device.fp.vram_usable_mib
    row["vram_reserved_mib"] += min(device.reserved_mib, device.fp.vram_usable_mib)
    row["acu_total"] += acu
    row["acu_reserved"] += acu * _reserved_share(device)
    row["utilisation_pct"] += device.fp.telemetry.utilisation_pct
    if _takes_work(node, device):
        row["vram_free_mib"] += device.free_mib
    else:
        row["vram_out_mib"] += device.fp.vram_usable_mib
        row["acu_out"] += acu


WORST_FIRST = ("failed", "stale", "degraded", "healthy")


def health_counts(nodes: Iterable[NodeView]) -> dict[str, int]:
    """Devices per health state (a stale node's devices are ``stale``)."""
    counts = {state: 0 for state in HEALTH_STATES}
    for node in nodes:
        for device in node.devices.values():
            counts[_health(node, device)] += 1
    return counts


def health_figure(counts: Mapping[str, int]) -> dict[str, Any]:
    """The fleet's health as one figure: devices healthy of all devices, and
    the worst state any device is in ("7/8 healthy, worst: failed"). The same
    figure in ``hcs top``, its screen and the console."""
    total = sum(counts.get(state, 0) for state in HEALTH_STATES)
    healthy = counts.get("healthy", 0)
    worst = next((s for s in WORST_FIRST if counts.get(s, 0)), None)
    if total == 0:
        text = "no devices"
    elif worst == "healthy":
        text = f"{healthy}/{total} healthy"
    else:
        text = f"{healthy}/{total} healthy, worst: {worst}"
    return {"healthy": healthy, "total": total, "worst": worst, "text": text}


def totals(classes: list[dict[str, Any]], *, nodes: int) -> dict[str, Any]:
    keys = ("devices", *HEALTH_STATES, "vram_total_mib", "vram_reserved_mib", "vram_free_mib")
    out: dict[str, Any] = {"nodes": nodes}
    out |= {k: sum(row[k] for row in classes) for k in (*keys, "vram_out_mib")}
    out |= {k: round(sum(row[k] for row in classes), 1) for k in ("acu_total", "acu_reserved")}
    out["acu_out"] = round(sum(row["acu_out"] for row in classes), 1)
    out["health"] = health_figure({state: out[state] for state in HEALTH_STATES})
    return out


# -- jobs, namespaces, alerts -----------------------------------------------


def job_keys(state: ClusterState) -> set[tuple[str, str]]:
    """(namespace, job) of every reservation that names a job."""
    return {
        (r.pod.namespace, r.job)
        for node in state.nodes.values()
        for r in node.reservations.values()
        if r.job
    }


def job_rows(
    state: ClusterState, *, checkpoints: Mapping[str, CheckpointEvent], now_s: float
) -> list[dict[str, Any]]:
    """One row per job: its pods with their devices, and its last checkpoint."""
    jobs: dict[str, dict[str, Any]] = {}
    for node in state.nodes.values():
        for r in node.reservations.values():
            if not r.job:
                continue
            key = f"{r.pod.namespace}/{r.job}"
            row = jobs.setdefault(key, {"job": key, "pods": [], "checkpoint": None})
            where = f"{len(r.devices)} × {r.vendor}/{r.model}" if r.vendor else ""
            pod = {"pod": r.pod.name, "node": node.name, "state": r.state, "devices": where}
            row["pods"].append(pod)
    for key, event in checkpoints.items():
        row = jobs.setdefault(key, {"job": key, "pods": [], "checkpoint": None})
        row["checkpoint"] = {
            "uri": event.uri,
            "step": event.step,
            "time_s": event.time_s,
            "age_s": round(max(now_s - event.time_s, 0.0), 1),
        }
    for row in jobs.values():
        row["pods"].sort(key=lambda p: (p["pod"], p["node"]))
    return [jobs[k] for k in sorted(jobs)]


def namespace_rows(
    state: ClusterState, *, limits: Mapping[str, QuotaLimits | None]
) -> list[dict[str, Any]]:
    """Reserved VRAM/ACU per namespace (from the view) beside its quota."""
    used: dict[str, dict[str, Any]] = {}
    for node in state.nodes.values():
        for r in node.reservations.values():
            row = used.setdefault(r.pod.namespace, {"pods": 0, "vram_mib": 0, "acu": 0.0})
            row["pods"] += 1
            row["vram_mib"] += sum(s.vram_mib for s in r.devices)
            row["acu"] += r.acu
    rows = []
    for namespace in sorted(set(used) | {ns for ns, lim in limits.items() if lim}):
        row = used.get(namespace, {"pods": 0, "vram_mib": 0, "acu": 0.0})
        limit = limits.get(namespace)
        vram_hard = limit.vram_mib if limit else None
        acu_hard = limit.acu if limit else None
        rows.append(
            {
                "namespace": namespace,
                "pods": row["pods"],
                "vram_mib": row["vram_mib"],
                "acu": round(row["acu"], 1),
                "vram_mib_hard": vram_hard,
                "acu_hard": acu_hard,
                "vram_pct": _pct(row["vram_mib"], vram_hard),
                "acu_pct": _pct(row["acu"], acu_hard),
            }
        )
    return rows


def _pct(used: float, hard: float | None) -> float | None:
    if hard is None:
        return None
    return round(100 * used / hard, 1) if hard > 0 else (0.0 if used == 0 else 100.0)


def is_alert(event: HealthEvent) -> bool:
    """What the console lists: every warning or worse, and every healer verdict."""
    return event.severity != "info" or event.source == "healer"


def alert_row(event: HealthEvent) -> dict[str, Any]:
    return {
        "id": event.id,
        "time_s": event.time_s,
        "node": event.node,
        "device": event.device,
        "kind": event.kind,
        "code": event.code,
        "severity": event.severity,
        "source": event.source,
        "verdict": event.verdict,
        "message": event.message,
        "evidence": dict(event.evidence),
    }


def overview(
    state: ClusterState,
    *,
    profiles: ProfileDB,
    alerts: Iterable[HealthEvent],
    checkpoints: Mapping[str, CheckpointEvent],
    limits: Mapping[str, QuotaLimits | None],
    now_s: float,
    ready: bool,
    max_nodes: int = MAX_LIVE_NODES,
) -> dict[str, Any]:
    nodes = sorted(state.nodes.values(), key=_attention)
    classes = class_rows(nodes, profiles=profiles)
    recent = list(alerts)[-LIVE_ALERTS:]
    return {
        "time_s": now_s,
        "ready": ready,
        "totals": totals(classes, nodes=len(nodes)),
        "classes": classes,
        "nodes": [node_row(n) for n in nodes[:max_nodes]],
        "nodes_total": len(nodes),
        "jobs": job_rows(state, checkpoints=checkpoints, now_s=now_s),
        "namespaces": namespace_rows(state, limits=limits),
        "alerts": [alert_row(e) for e in reversed(recent)],
    }


def nodes_page(state: ClusterState, *, offset: int, limit: int) -> dict[str, Any]:
    nodes = sorted(state.nodes.values(), key=_attention)
    rows = [node_row(n) for n in nodes[offset : offset + limit]]
    return {"total": len(nodes), "offset": offset, "nodes": rows}


# -- history ----------------------------------------------------------------


@dataclass(slots=True)
class History:
    """Periodic samples for the plots, the newest ``keep`` of them."""

    keep: int = 720
    samples: deque[dict[str, Any]] = field(default_factory=deque)

    def record(self, state: ClusterState, *, time_s: float) -> dict[str, Any]:
        classes: dict[str, dict[str, float]] = {}
        health = {s: 0 for s in HEALTH_STATES}
        for row in class_rows(state.nodes.values(), profiles=ProfileDB(())):
            total = row["vram_total_mib"]
            classes[row["class"]] = {
                "vram_reserved_pct": round(100 * row["vram_reserved_mib"] / total, 1)
                if total
                else 0.0,
                "utilisation_pct": row["utilisation_pct"],
            }
            for s in HEALTH_STATES:
                health[s] += row[s]
        sample = {"time_s": time_s, "classes": classes, "health": health}
        self.samples.append(sample)
        while len(self.samples) > self.keep:
            self.samples.popleft()
        return sample

    def series(self, *, since_s: float) -> dict[str, Any]:
        """Columns (one value per sample, None where a class was absent)."""
        picked = [s for s in self.samples if s["time_s"] >= since_s]
        names = sorted({c for s in picked for c in s["classes"]})
        metrics = ("vram_reserved_pct", "utilisation_pct")
        return {
            "time_s": [s["time_s"] for s in picked],
            "classes": {
                c: {m: [_get(s["classes"].get(c), m) for s in picked] for m in metrics}
                for c in names
            },
            "health": {h: [s["health"][h] for s in picked] for h in HEALTH_STATES},
        }


def _get(point: Mapping[str, float] | None, metric: str) -> float | None:
    return None if point is None else point[metric]


# -- queries ----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AlertQuery:
    limit: int = 100
    node: str | None = None
    severity: str = "info"  # the least severity listed

    def admits(self, event: HealthEvent) -> bool:
        if self.node is not None and event.node != self.node:
            return False
        return SEVERITY_RANK[event.severity] >= SEVERITY_RANK[self.severity]


def _only(params: Mapping[str, str], allowed: tuple[str, ...]) -> None:
    for name in params:
        if name not in allowed:
            raise QueryError(f"unknown parameter {name!r} (known: {', '.join(allowed)})")


def _int(params: Mapping[str, str], name: str, *, default: int, low: int, high: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise QueryError(f"{name}={text!r} is not a whole number") from None
    if not low <= value <= high:
        raise QueryError(f"{name}={value} is out of range {low}..{high}")
    return value


def alert_query(params: Mapping[str, str], *, keep: int) -> AlertQuery:
    _only(params, ("limit", "node", "severity"))
    severity = params.get("severity", "info")
    if severity not in SEVERITY_RANK:
        raise QueryError(f"severity={severity!r} is not one of {', '.join(SEVERITY_RANK)}")
    node = params.get("node")
    if node is not None and not node:
        raise QueryError("node= must name a node")
    limit = _int(params, "limit", default=min(100, keep), low=1, high=keep)
    return AlertQuery(limit=limit, node=node, severity=severity)


def history_query(params: Mapping[str, str], *, most_s: int) -> float:
    """The window in seconds (``window_s``, default the whole history)."""
    _only(params, ("window_s",))
    text = params.get("window_s")
    if text is None:
        return float(most_s)
    try:
        value = float(text)
    except ValueError:
        raise QueryError(f"window_s={text!r} is not a number") from None
    if not math.isfinite(value) or not 0 < value <= most_s:
        raise QueryError(f"window_s={text} is out of range (0, {most_s}]")
    return value


def page_query(params: Mapping[str, str]) -> tuple[int, int]:
    _only(params, ("offset", "limit"))
    offset = _int(params, "offset", default=0, low=0, high=10_000_000)
    limit = _int(params, "limit", default=200, low=1, high=MAX_LIVE_NODES)
    return offset, limit
