"""Raw NVML readings of one node → DeviceFingerprints (pure).

``agents.nvml`` reads NVML into plain dicts of this shape (one per GPU) and
tests use recorded ones::

    {"index": 0, "name": "NVIDIA A100-SXM4-80GB", "uuid": "GPU-…",
     "pci_bus_id": "00000000:07:00.0", "pci_device_id": 0x20B210DE,
     "memory_total_b": …, "memory_free_b": …, "memory_reserved_b": …,
     "cuda_capability": [8, 0],
     "sm_clock_mhz": 1410, "max_sm_clock_mhz": 1410, "clock_event_reasons": 0x1,
     "fields": {"ecc_sbe_volatile": 0, "ecc_dbe_volatile": 0, "remapped_cor": 0,
                "remapped_unc": 0, "remap_pending": 0, "remap_failure": 0,
                "pcie_replay": 0},
     "pcie_gen": 4, "pcie_width": 16, "numa_node": 0, "cpu_affinity": "0-63",
     "power_w": 65.2, "power_limit_w": 400.0, "temperature_c": 31,
     "utilisation_pct": 0,
     "nvlinks": [{"link": 0, "version": 3, "remote_bus_id": "…", "remote_type": "gpu"}],
     "common_ancestor": {"00000000:0F:00.0": 40}}

A reading a GPU refused (NVML_ERROR_NOT_SUPPORTED) is simply absent. A GPU
whose mandatory identity/memory cannot be read is reported broken.
"""

from __future__ import annotations

from typing import Any

import msgspec

from agents.parsing import (
    Parsed,
    ParseError,
    broken_device,
    device_from,
    normalize_bus_id,
)
from hcs_bus.messages import DeviceFingerprint, Link, LinkType, Telemetry
from hcs_bus.profiles import ProfileDB

TOOL = "nvml"
VENDOR = "nvidia"
MIB = 1 << 20

# nvmlClocksEventReason* bits (nvml.h), decoded to names.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
# Bidirectional GB/s per NVLink link by NVLink version (NVIDIA NVLink pages).
NVLINK_LINK_GBPS: dict[int, float] = {1: 40.0, 2: 50.0, 3: 50.0, 4: 50.0, 5: 100.0}
# One direction GB/s per PCIe lane by generation.
PCIE_LANE_GBPS: dict[int, float] = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
# NVML topology level of the common ancestor → share of the slower link's bandwidth.
TOPOLOGY_FACTOR: dict[int, float] = {0: 1.0, 10: 1.0, 20: 0.9, 30: 0.8, 40: 0.7, 50: 0.5}


def clock_event_reasons(mask: int) -> tuple[str, ...]:
    names = [name for bit, name in CLOCK_EVENT_REASONS.items() if mask & bit]
    unknown = mask & ~sum(CLOCK_EVENT_REASONS)
    if unknown:
        names.append(f"unknown_0x{unknown:x}")
    return tuple(names)


def pcie_gbps(gen: int | None, width: int | None) -> float:
    if not gen or not width:
        return 0.0
    return round(PCIE_LANE_GBPS.get(gen, 0.0) * width, 1)


def convert(readings: list[dict[str, Any]], *, db: ProfileDB) -> Parsed:
    """All GPUs of a node: each device, then the links between them."""
    devices: list[DeviceFingerprint] = []
    errors: list[ParseError] = []
    for reading in readings:
        index = int(reading.get("index", len(devices)))
        try:
            if "error" in reading:
                raise ValueError(str(reading["error"]))
            devices.append(_device(reading, db=db))
        except (KeyError, TypeError, ValueError) as exc:
            reason = f"bad reading: {exc}" if isinstance(exc, ValueError) else f"missing {exc}"
            errors.append(ParseError(tool=TOOL, device=index, reason=reason))
            devices.append(broken_device(vendor=VENDOR, index=index, error=f"{TOOL}: {reason}"))
    by_bus = {d.pci_bus_id: d.index for d in devices if d.pci_bus_id}
    linked = [
        msgspec.structs.replace(d, links=links_of(r, by_bus=by_bus, devices=devices))
        if not d.error
        else d
        for d, r in zip(devices, readings, strict=True)
    ]
    return Parsed(devices=tuple(linked), errors=tuple(errors))


def _device(reading: dict[str, Any], *, db: ProfileDB) -> DeviceFingerprint:
    fields = reading.get("fields", {})
    cc = reading.get("cuda_capability")
    telemetry = Telemetry(
        utilisation_pct=float(reading.get("utilisation_pct", 0)),
        sm_clock_mhz=float(reading.get("sm_clock_mhz", 0)),
        max_sm_clock_mhz=float(reading.get("max_sm_clock_mhz", 0)),
        power_w=float(reading.get("power_w", 0)),
        power_limit_w=float(reading.get("power_limit_w", 0)),
        temperature_c=float(reading.get("temperature_c", 0)),
        ecc_corrected=int(fields.get("ecc_sbe_volatile", 0)),
        ecc_uncorrected=int(fields.get("ecc_dbe_volatile", 0)),
        remapped_rows=int(fields.get("remapped_cor", 0)) + int(fields.get("remapped_unc", 0)),
        remap_pending=bool(fields.get("remap_pending", 0)),
        remap_failed=bool(fields.get("remap_failure", 0)),
        pcie_replay=int(fields.get("pcie_replay", 0)),
        throttle_reasons=clock_event_reasons(int(reading.get("clock_event_reasons", 0))),
    )
    total = int(reading["memory_total_b"]) // MIB
    device = device_from(
        db=db,
        vendor=VENDOR,
        name=_profile_name(reading, db=db),
        index=int(reading["index"]),
        uuid=str(reading["uuid"]),
        vram_total_mib=total,
        vram_free_mib=int(reading["memory_free_b"]) // MIB,
        vram_driver_mib=_driver_mib(reading.get("memory_reserved_b")),
        pci_bus_id=normalize_bus_id(str(reading["pci_bus_id"])),
        telemetry=telemetry,
    )
    return msgspec.structs.replace(
        device,
        pcie_gen=reading.get("pcie_gen"),
        pcie_width=reading.get("pcie_width"),
        numa_node=reading.get("numa_node"),
        compute_capability=f"{cc[0]}.{cc[1]}" if cc else None,
    )


def _profile_name(reading: dict[str, Any], *, db: ProfileDB) -> str:
    """The marketing name, or — when the DB does not know it — the PCI id's model."""
    name = str(reading["name"])
    if db.match(VENDOR, name) is not None or "pci_device_id" not in reading:
        return name
    raw = int(reading["pci_device_id"])
    by_pci = db.by_pci(raw & 0xFFFF, raw >> 16)
    return by_pci.model if by_pci is not None else name


def links_of(
    reading: dict[str, Any], *, by_bus: dict[str, int], devices: list[DeviceFingerprint]
) -> tuple[Link, ...]:
    """NVLink links aggregated per peer; PCIe links to every GPU NVLink does not reach."""
    me = int(reading["index"])
    nvlink: dict[int, float] = {}
    switch_gbps = 0.0
    for link in reading.get("nvlinks", []):
        gbps = NVLINK_LINK_GBPS.get(int(link.get("version", 0)), 50.0)
        remote = _bus(link.get("remote_bus_id", ""))
        peer = by_bus.get(remote) if remote else None
        if peer is not None and peer != me and link.get("remote_type", "gpu") == "gpu":
            nvlink[peer] = nvlink.get(peer, 0.0) + gbps
        else:
            switch_gbps += gbps  # NVSwitch: full bandwidth to every switched peer
    bus_of = {index: bus for bus, index in by_bus.items()}
    out = [
        Link(peer_index=p, type="nvlink", bandwidth_gbps=g, peer_bus_id=bus_of.get(p))
        for p, g in sorted(nvlink.items())
    ]
    mine = next((d for d in devices if d.index == me), None)
    for other in devices:
        if other.index == me or other.index in nvlink or other.error or mine is None:
            continue
        if switch_gbps:
            out.append(_link(other, kind="nvlink", gbps=switch_gbps))
            continue
        level = reading.get("common_ancestor", {}).get(other.pci_bus_id)
        level = _lookup_level(reading, other.pci_bus_id) if level is None else level
        slower = min(
            pcie_gbps(mine.pcie_gen, mine.pcie_width), pcie_gbps(other.pcie_gen, other.pcie_width)
        )
        factor = TOPOLOGY_FACTOR.get(int(level), 0.5) if level is not None else 0.5
        out.append(_link(other, kind="pcie", gbps=round(slower * factor, 1)))
    return tuple(out)


def _lookup_level(reading: dict[str, Any], bus_id: str) -> int | None:
    for raw, level in reading.get("common_ancestor", {}).items():
        if _bus(raw) == bus_id:
            return int(level)
    return None


def _link(other: DeviceFingerprint, *, kind: LinkType, gbps: float) -> Link:
    return Link(
        peer_index=other.index, type=kind, bandwidth_gbps=gbps, peer_bus_id=other.pci_bus_id
    )


def _bus(raw: str) -> str:
    try:
        return normalize_bus_id(raw) if raw else ""
    except ValueError:
        return ""


def _driver_mib(reserved_b: object) -> int:
    """NVML's v2 ``reserved`` (driver and firmware), rounded up to whole MiB;
    0 where the driver gave none (the v1 API counts it as used)."""
    if not isinstance(reserved_b, int) or reserved_b <= 0:
        return 0
    return -(-reserved_b // MIB)
