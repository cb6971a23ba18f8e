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

import json
import re
from typing import Any

import msgspec

from agents.labels import label_safe
from hcs_bus.messages import Compute, DeviceFingerprint, Telemetry
from hcs_bus.profiles import Profile, ProfileDB

__all__ = [
    "ParseError",
    "Parsed",
    "broken_device",
    "cards_of",
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
    (the sysfs spelling, so NVML, vendor tools and kernel probes agree).
    HyHAL's hy-smi goes on after the address (``0000:05:00.0 --> SN: 25002386
    --> OAM ID: 3``): what follows `` --> `` is not part of it."""
    found = _BUS_ID.match(raw.split("-->", 1)[0].strip())
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


_CARD = re.compile(r"^card(\d+)$")
# HyHAL's hy-smi (and the rocm-smi of the same DTK) print no comma after some
# readings: ``"Average Graphics Package Power (W)": "91.0""Average GFX Core
# Power (W)": "20.0"``. Recorded by its users on BW1000 nodes; one such
# missing comma is put back each time the decoder stops where it expects one.
_MISSING_COMMA = "Expecting ',' delimiter"


def _smi_json(text: str, tool: str) -> Any:
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ValueError(f"no JSON object in {tool} --json output: {text.strip()[:120]!r}")
    doc = text[start : end + 1]
    for _ in range(doc.count('"') // 2 + 1):
        try:
            return json.loads(doc)
        except json.JSONDecodeError as exc:
            if exc.msg != _MISSING_COMMA or doc[exc.pos : exc.pos + 1] != '"':
                raise ValueError(f"{tool} --json output is not valid JSON: {exc}") from exc
            doc = f"{doc[: exc.pos]},{doc[exc.pos :]}"
    raise ValueError(f"{tool} --json output is not valid JSON")  # pragma: no cover


def cards_of(text: str, *, tool: str) -> dict[int, dict[str, str]]:
    """The ``cardN`` entries of a ``--json`` output (rocm-smi, hy-smi) by
    device index, every reading a string; text around the object (a warning
    line in front) is ignored. ValueError when there is no JSON object, or no
    card in it (other top-level keys, e.g. ``system``, are ignored)."""
    data = _smi_json(text, tool)
    if not isinstance(data, dict):
        raise ValueError(f"{tool} --json output is not an object")
    cards: dict[int, dict[str, str]] = {}
    for key, fields in data.items():
        found = _CARD.match(str(key))
        if found and isinstance(fields, dict):
            cards[int(found.group(1))] = {str(k): str(v) for k, v in fields.items() if k}
    if not cards:
        raise ValueError(f"no card in {tool} --json output")
    return cards
