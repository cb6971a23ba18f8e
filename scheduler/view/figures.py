"""Fleet figures for the gauges (pure): what the fleet holds, what is free and
who holds it, read off the scheduler's view at scrape time.

* devices by vendor, model and health (the healer's verdict),
* VRAM (bytes) and ACU by vendor and model: ``total``; ``free`` counts only
  devices a pod could be placed on now (usable, on a schedulable node), so a
  failed device's VRAM is never free; ``reserved`` is what reservations hold,
* per namespace: VRAM and ACU held by its reservations (reserved or bound).

A device's ACU is held in proportion to the VRAM reserved on it (all of it
for a whole device), and free in proportion to its free VRAM.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler.view.state import DeviceView, NodeView

MIB = 1 << 20
Model = tuple[str, str]  # vendor, model


@dataclass
class FleetFigures:
    devices: dict[tuple[str, str, str], int] = field(default_factory=dict)  # + health
    vram_bytes: dict[tuple[str, str, str], float] = field(default_factory=dict)  # + state
    acu: dict[tuple[str, str, str], float] = field(default_factory=dict)  # + state
    namespace_vram_bytes: dict[str, float] = field(default_factory=dict)
    namespace_acu: dict[str, float] = field(default_factory=dict)


def fleet_figures(nodes: Iterable[NodeView]) -> FleetFigures:
    devices: defaultdict[tuple[str, str, str], int] = defaultdict(int)
    vram: defaultdict[tuple[str, str, str], float] = defaultdict(float)
    acu: defaultdict[tuple[str, str, str], float] = defaultdict(float)
    ns_vram: defaultdict[str, float] = defaultdict(float)
    ns_acu: defaultdict[str, float] = defaultdict(float)
    for node in nodes:
        for device in node.devices.values():
            vendor, model = device.fp.vendor, device.fp.model
            devices[(vendor, model, device.verdict)] += 1
            total, free, reserved = _vram_mib(device, placeable=node.schedulable)
            share = device.fp.compute.acu / total if total else 0.0
            for state, mib in (("total", total), ("free", free), ("reserved", reserved)):
                vram[(vendor, model, state)] += mib * MIB
                acu[(vendor, model, state)] += mib * share
        for reservation in node.reservations.values():
            namespace = reservation.pod.namespace
            for slice_ in reservation.devices:
                held = node.devices.get(slice_.index)
                mib = _held_mib(held, whole=slice_.whole, vram_mib=slice_.vram_mib)
                ns_vram[namespace] += mib * MIB
                if held is not None and held.fp.vram_usable_mib:
                    ns_acu[namespace] += held.fp.compute.acu * mib / held.fp.vram_usable_mib
    return FleetFigures(dict(devices), dict(vram), dict(acu), dict(ns_vram), dict(ns_acu))


def _vram_mib(device: DeviceView, *, placeable: bool) -> tuple[int, int, int]:
    """(total, free, reserved) MiB of one device."""
    total = device.fp.vram_usable_mib
    reserved = total if device.whole_owner is not None else min(device.reserved_mib, total)
    free = device.free_mib if placeable and device.usable else 0
    return total, free, reserved


def _held_mib(device: DeviceView | None, *, whole: bool, vram_mib: int) -> int:
    if whole and device is not None:
        return device.fp.vram_usable_mib
    return vram_mib
