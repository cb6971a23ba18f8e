"""Polls PCIe AER counters in sysfs and yields an event per counter increase.

Watches accelerator functions (by PCI vendor id) under
``<sysfs_root>/bus/pci/devices`` and their link partners: the upstream port
found by resolving the device's sysfs path and taking its parent. The first
poll of a file is its baseline; later increases become ProbeEvents.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import AsyncGenerator, Callable, Iterable
from pathlib import Path

from agents.probes.aer_counters import (
    AER_FILES,
    Counters,
    DeviceRef,
    counter_event,
    increases,
    parse_counters,
)
from agents.probes.events import ProbeEvent
from agents.probes.tables import PCI_VENDORS, vendor_of_pci_id

_BDF_NAME = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
ACCELERATOR_VENDOR_IDS: frozenset[int] = frozenset(PCI_VENDORS)


def _read(path: Path) -> str | None:
    try:
        return path.read_text("ascii", "replace")
    except OSError:
        return None


def _vendor_id(device_dir: Path) -> int | None:
    text = _read(device_dir / "vendor")
    try:
        return int(text.strip(), 16) if text else None
    except ValueError:
        return None


def _has_aer(device_dir: Path) -> bool:
    return any((device_dir / name).is_file() for name in AER_FILES)


def _partner(device_dir: Path, *, of: DeviceRef) -> DeviceRef | None:
    parent = Path(os.path.realpath(device_dir)).parent
    if not _BDF_NAME.match(parent.name) or not _has_aer(parent):
        return None
    return DeviceRef(bdf=parent.name, vendor=of.vendor, partner_of=of.bdf)


def discover(*, sysfs_root: Path, vendor_ids: frozenset[int] | None) -> list[DeviceRef]:
    """Watched functions: matching devices with AER files, then their link partners."""
    devices_dir = sysfs_root / "bus" / "pci" / "devices"
    found: dict[str, DeviceRef] = {}
    partners: dict[str, DeviceRef] = {}
    for device_dir in sorted(devices_dir.iterdir()) if devices_dir.is_dir() else []:
        vid = _vendor_id(device_dir)
        if vendor_ids is not None and vid not in vendor_ids:
            continue
        ref = DeviceRef(bdf=device_dir.name, vendor=vendor_of_pci_id(vid) if vid else None)
        if _has_aer(device_dir):
            found[ref.bdf] = ref
        partner = _partner(device_dir, of=ref)
        if partner is not None:
            partners.setdefault(partner.bdf, partner)
    return list(found.values()) + [p for b, p in partners.items() if b not in found]


class AerPoller:
    """Keeps the last counters of each (device, file) and diffs on poll()."""

    def __init__(
        self,
        *,
        sysfs_root: Path = Path("/sys"),
        vendor_ids: frozenset[int] | None = ACCELERATOR_VENDOR_IDS,
        clock_ns: Callable[[], int] = time.monotonic_ns,
    ) -> None:
        self._root = sysfs_root
        self._vendor_ids = vendor_ids
        self._clock_ns = clock_ns
        self._last: dict[tuple[str, str], Counters] = {}

    def _device_dir(self, bdf: str) -> Path:
        return self._root / "bus" / "pci" / "devices" / bdf

    def _poll_file(self, device: DeviceRef, file: str, ts_ns: int) -> Iterable[ProbeEvent]:
        text = _read(self._device_dir(device.bdf) / file)
        if text is None:
            return []
        after = parse_counters(text)
        before = self._last.get((device.bdf, file))
        self._last[(device.bdf, file)] = after
        if before is None:
            return []
        return [
            counter_event(
                device=device, file=file, counter=name, delta=delta, total=total, ts_ns=ts_ns
            )
            for name, (delta, total) in increases(before, after).items()
        ]

    def poll(self) -> list[ProbeEvent]:
        """Events for counters that grew since the previous poll."""
        ts_ns = self._clock_ns()
        events: list[ProbeEvent] = []
        for device in discover(sysfs_root=self._root, vendor_ids=self._vendor_ids):
            for file in AER_FILES:
                events.extend(self._poll_file(device, file, ts_ns))
        return events


def watch_aer(
    *,
    sysfs_root: Path = Path("/sys"),
    poll_interval_s: float = 5.0,
    vendor_ids: frozenset[int] | None = ACCELERATOR_VENDOR_IDS,
) -> AsyncGenerator[ProbeEvent, None]:
    """Polls forever. The baseline is read now, so later increases all count."""
    poller = AerPoller(sysfs_root=sysfs_root, vendor_ids=vendor_ids)
    poller.poll()
    return _poll_forever(poller, poll_interval_s=poll_interval_s)


async def _poll_forever(
    poller: AerPoller, *, poll_interval_s: float
) -> AsyncGenerator[ProbeEvent, None]:
    while True:
        await asyncio.sleep(poll_interval_s)
        for event in await asyncio.to_thread(poller.poll):
            yield event
