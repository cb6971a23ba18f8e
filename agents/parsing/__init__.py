"""Pure parsers: raw vendor-tool output or NVML readings → DeviceFingerprints.

No I/O here (no subprocess, files or network): each parser takes the text (or
dict) a tool produced and returns :class:`Parsed` — the devices it could read
and one :class:`ParseError` per problem. A device whose lines are broken is
still reported, with ``DeviceFingerprint.error`` set, so the other devices on
the node stay schedulable and the broken one is visible. ``Parsed.notes`` are
facts worth one log line that are not errors (a model the profile database
does not know).
"""

from __future__ import annotations

import re

import msgspec

from agents.labels import label_safe
from hcs_bus.messages import Compute, DeviceFingerprint, Telemetry
from hcs_bus.profiles import Profile, ProfileDB

__all__ = [
    "ParseError",
    "Parsed",
    "broken_device",
    "compute_of",
    "device_from",
    "normalize_bus_id",
    "number",
]


class ParseError(msgspec.Struct, frozen=True, kw_only=True):
    """One problem in a tool's output: which tool, which device (if known), why."""

    tool: str
    reason: str
    device: int | None = None

    def __str__(self) -> str:
        where = f" device {self.device}" if self.device is not None else ""
        return f"{self.tool}{where}: {self.reason}"


class Parsed(msgspec.Struct, frozen=True, kw_only=True):
    devices: tuple[DeviceFingerprint, ...] = ()
    errors: tuple[ParseError, ...] = ()
    notes: tuple[str, ...] = ()


_NO_TELEMETRY = Telemetry()
_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{4,8}):)?([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])$")


def normalize_bus_id(raw: str) -> str:
    """``00000000:07:00.0`` / ``0000:C1:00.0`` / ``C1:00.0`` → ``0000:c1:00.0``
    (the sysfs spelling, so NVML, vendor tools and kernel probes agree)."""
    found = _BUS_ID.match(raw.strip())
    if found is None:
        raise ValueError(f"not a PCI bus id: {raw!r}")
    domain, bus, dev, fn = found.groups()
    domain = (domain or "0000")[-4:]
    return f"{domain}:{bus}:{dev}.{fn}".lower()


_NUMBER = re.compile(r"[-+]?\d+(?:\.\d+)?")


def number(raw: str, *, what: str) -> float:
    """The first number in ``raw`` (``"46C"`` → 46.0); ValueError naming ``what``."""
    found = _NUMBER.search(raw)
    if found is None:
        raise ValueError(f"{what} is not a number: {raw.strip()!r}")
    return float(found.group())


def compute_of(profile: Profile | None) -> Compute:
    if profile is None:
        return Compute(acu_profile=0.0, tflops_fp16_profile=0.0)
    return Compute(acu_profile=round(profile.acu, 2), tflops_fp16_profile=profile.tflops_fp16)


def device_from(
    *,
    db: ProfileDB,
    vendor: str,
    name: str,
    index: int,
    uuid: str,
    vram_total_mib: int,
    vram_free_mib: int,
    vram_driver_mib: int = 0,
    pci_bus_id: str = "",
    telemetry: Telemetry = _NO_TELEMETRY,
    health_score: int = 100,
) -> DeviceFingerprint:
    """A device named as its tool names it, resolved against the profile DB.

    An unknown model keeps the tool's name, made a valid Kubernetes label
    value (it becomes ``hcs.io/model`` and a node-affinity value), and zero
    profile compute (the scheduler offers its VRAM only), never a guess."""
    profile = db.match(vendor, name)
    return DeviceFingerprint(
        index=index,
        uuid=uuid,
        vendor=vendor,
        model=profile.model if profile else (label_safe(name) or "unknown"),
        vram_total_mib=vram_total_mib,
        vram_free_mib=max(0, vram_free_mib),
        vram_driver_mib=min(max(0, vram_driver_mib), vram_total_mib),
        compute=compute_of(profile),
        pci_bus_id=pci_bus_id,
        telemetry=telemetry,
        health_score=health_score,
    )


def broken_device(
    *, vendor: str, index: int, error: str, pci_bus_id: str = ""
) -> DeviceFingerprint:
    """A device the tool listed but whose readings could not be parsed."""
    return DeviceFingerprint(
        index=index,
        uuid="",
        vendor=vendor,
        model="unknown",
        vram_total_mib=0,
        vram_free_mib=0,
        compute=compute_of(None),
        pci_bus_id=pci_bus_id,
        health_score=0,
        error=error,
    )
