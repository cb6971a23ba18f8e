"""What changed between two snapshots of a node's devices (pure).

``reason_to_publish`` decides whether a new fingerprint must go out before the
next report interval; ``health_changes`` turns discrete device changes into
HealthEvents (the alert feed carries changes, never levels). Xid and ECC
events come from their own sources (NVML events, kernel probes), not from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from hcs_bus.messages import DeviceFingerprint, HealthEvent, Severity
from hcs_bus.vocabulary import Kind

THERMAL = frozenset({"hw_thermal_slowdown", "sw_thermal_slowdown"})


def reason_to_publish(
    previous: Sequence[DeviceFingerprint] | None,
    current: Sequence[DeviceFingerprint],
    *,
    vram_threshold_mib: int,
) -> str | None:
    """Why ``current`` differs materially from what was last published, or None."""
    if previous is None:
        return "first"
    before = {d.uuid or f"#{d.index}": d for d in previous}
    after = {d.uuid or f"#{d.index}": d for d in current}
    if before.keys() != after.keys():
        return "device_set"
    for key, now in after.items():
        then = before[key]
        if (then.health_score, then.error) != (now.health_score, now.error):
            return "health"
        if abs(then.vram_free_mib - now.vram_free_mib) > vram_threshold_mib:
            return "vram"
        if then.compute != now.compute:
            return "compute"
    return None


def health_changes(
    previous: Sequence[DeviceFingerprint] | None,
    current: Sequence[DeviceFingerprint],
    *,
    node: str,
    now: float,
) -> list[HealthEvent]:
    if previous is None:
        return []
    before = {d.index: d for d in previous}
    after = {d.index: d for d in current}
    events: list[HealthEvent] = []
    for index in sorted(before.keys() - after.keys()):
        gone = before[index]
        events.append(_event(node, gone, Kind.DEVICE_LOST, "fatal", now, "device no longer listed"))
    for index in sorted(after.keys() - before.keys()):
        events.append(_event(node, after[index], Kind.DEVICE_ADDED, "info", now, "new device"))
    for index in sorted(before.keys() & after.keys()):
        events.extend(_device_changes(node, before[index], after[index], now=now))
    return events


def _device_changes(
    node: str, then: DeviceFingerprint, now_: DeviceFingerprint, *, now: float
) -> list[HealthEvent]:
    out: list[HealthEvent] = []
    if now_.error and now_.error != then.error:
        out.append(_event(node, now_, Kind.DEVICE_UNREADABLE, "warning", now, now_.error))
    t0, t1 = then.telemetry, now_.telemetry
    if t1.remap_pending and not t0.remap_pending:
        out.append(_event(node, now_, Kind.ROW_REMAP_PENDING, "warning", now, "row remap pending"))
    if t1.remap_failed and not t0.remap_failed:
        out.append(_event(node, now_, Kind.ROW_REMAP_FAILURE, "fatal", now, "row remapping failed"))
    hot0, hot1 = THERMAL & set(t0.throttle_reasons), THERMAL & set(t1.throttle_reasons)
    if hot1 and not hot0:
        out.append(
            _event(node, now_, Kind.THERMAL_THROTTLE, "warning", now, ",".join(sorted(hot1)))
        )
    if hot0 and not hot1:
        out.append(
            _event(node, now_, Kind.THERMAL_THROTTLE_CLEARED, "info", now, "clocks restored")
        )
    if now_.health_score < then.health_score and not now_.error:
        message = f"health score {then.health_score} -> {now_.health_score}"
        severity: Severity = "critical" if now_.health_score <= 40 else "warning"
        out.append(_event(node, now_, Kind.HEALTH_DEGRADED, severity, now, message))
    return out


def _event(
    node: str, device: DeviceFingerprint, kind: str, severity: Severity, now: float, message: str
) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind=kind,
        severity=severity,
        source="agent",
        time_s=now,
        device=device.index,
        device_uuid=device.uuid or None,
        health_score=device.health_score,
        message=message,
    )
