"""Kernel probe events (``agents.probes``) → HealthEvents on ``hcs.health.<node>``.

``to_health`` is the pure mapping: the device index comes from the probe when
it knows it, else from the PCI bus id through the node's current fingerprint.
``forward`` is the small task that feeds a Reporter.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from agents.parsing import normalize_bus_id
from hcs_bus.messages import DeviceFingerprint, HealthEvent, Severity
from hcs_bus.telemetry import logger
from hcs_bus.vocabulary import Kind

_log = logger("hcs.agent.probing")

# Probe kinds renamed where HCS already has a word for the same thing.
KINDS = {Kind.FALLEN_OFF_BUS.value: Kind.DEVICE_LOST.value}
SEVERITIES = {"info", "warning", "critical", "fatal"}


class ProbeEventLike(Protocol):
    """The fields of ``agents.probes.events.ProbeEvent`` this module reads."""

    source: str
    kind: str
    vendor: str | None
    pci_bus_id: str | None
    device_index: int | None
    code: int | None
    severity: str
    message: str
    ts_ns: int
    evidence: dict[str, Any]


def resolve_device(
    event: ProbeEventLike, devices: Sequence[DeviceFingerprint]
) -> DeviceFingerprint | None:
    bus = _bus(event.pci_bus_id)
    if bus:
        for device in devices:
            if device.pci_bus_id and _bus(device.pci_bus_id) == bus:
                return device
    if event.device_index is not None:
        for device in devices:
            if device.index == event.device_index:
                return device
    return None


def to_health(
    event: ProbeEventLike, *, node: str, devices: Sequence[DeviceFingerprint], now: float
) -> HealthEvent:
    device = resolve_device(event, devices)
    evidence: dict[str, str | int | float | bool] = {
        f"probe_{k}": v for k, v in event.evidence.items() if isinstance(v, str | int | float)
    }
    evidence.update(probe_source=event.source, probe_kind=event.kind, probe_ts_ns=event.ts_ns)
    if event.pci_bus_id:
        evidence["pci_bus_id"] = event.pci_bus_id
    if event.vendor:
        evidence["vendor"] = event.vendor
    severity: Severity = event.severity if event.severity in SEVERITIES else "warning"  # type: ignore[assignment]
    return HealthEvent(
        node=node,
        kind=KINDS.get(event.kind, event.kind),
        severity=severity,
        source="probe",
        time_s=now,
        device=device.index if device else event.device_index,
        device_uuid=device.uuid if device and device.uuid else None,
        code=event.code,
        evidence=evidence,
        message=event.message,
    )


def _bus(raw: str | None) -> str:
    if not raw:
        return ""
    try:
        return normalize_bus_id(raw)
    except ValueError:
        return raw.lower()


async def forward(
    events: AsyncIterator[Any],
    *,
    node: str,
    devices: Callable[[], Sequence[DeviceFingerprint]],
    publish: Callable[[HealthEvent], object],
    wall: Callable[[], float],
) -> int:
    """Map every probe event and hand it to ``publish``; returns the count at the end."""
    count = 0
    async for event in events:
        health = to_health(event, node=node, devices=devices(), now=wall())
        publish(health)
        count += 1
        if health.device is None and event.pci_bus_id:
            _log.warning(
                "probe_device_unknown", node=node, pci_bus_id=event.pci_bus_id, kind=event.kind
            )
    return count
