"""PCIe AER sysfs counters (pure): parse ``aer_dev_*`` files, diff snapshots.

Each file holds ``Name count`` lines, e.g. ``RxErr 3`` ... ``TOTAL_ERR_COR 3``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from agents.probes.events import CONTRACT_VERSION, Kind, ProbeEvent, Severity, Vendor

AER_FILES: Final[dict[str, tuple[Kind, Severity]]] = {
    "aer_dev_correctable": ("aer_correctable", "info"),
    "aer_dev_nonfatal": ("aer_nonfatal", "critical"),
    "aer_dev_fatal": ("aer_fatal", "fatal"),
}

Counters = dict[str, int]


def parse_counters(text: str) -> Counters:
    """``Name count`` lines -> {name: count}; malformed lines are skipped."""
    counters: Counters = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
            counters[parts[0]] = int(parts[1])
    return counters


def increases(before: Counters, after: Counters) -> dict[str, tuple[int, int]]:
    """{name: (delta, new value)} for named counters that grew.

    ``TOTAL_*`` lines are only reported when no named counter explains them.
    A counter that went down (device reset, driver reload) is a new baseline.
    """
    grown = {
        name: (value - before[name], value)
        for name, value in after.items()
        if name in before and value > before[name]
    }
    named = {k: v for k, v in grown.items() if not k.startswith("TOTAL_")}
    return named or grown


@dataclass(frozen=True)
class DeviceRef:
    """A watched PCI function and, for a link partner, whom it serves."""

    bdf: str
    vendor: Vendor | None
    partner_of: str | None = None


def counter_event(
    *, device: DeviceRef, file: str, counter: str, delta: int, total: int, ts_ns: int
) -> ProbeEvent:
    """One ProbeEvent for one counter increase."""
    kind, severity = AER_FILES[file]
    evidence: dict[str, str | int | float] = {
        "file": file,
        "counter": counter,
        "delta": delta,
        "count": total,
        "role": "link_partner" if device.partner_of else "device",
    }
    if device.partner_of:
        evidence["partner_of"] = device.partner_of
    where = f" (link partner of {device.partner_of})" if device.partner_of else ""
    return ProbeEvent(
        v=CONTRACT_VERSION,
        source="sysfs-aer",
        kind=kind,
        vendor=device.vendor,
        pci_bus_id=device.bdf,
        device_index=None,
        code=None,
        severity=severity,
        message=f"{device.bdf}{where}: {file} {counter} +{delta} (now {total})",
        ts_ns=ts_ns,
        evidence=evidence,
    )
