"""Hygon DCU ``hy-smi`` output (rocm-smi style).

Three shapes, all keyed by device index:

* the default table — a header row ``DCU Temp AvgPwr Perf PwrCap VRAM% DCU% Mode``
  and one row per device;
* detail lines from ``--showproductname --showbus --showuniqueid --showmeminfo vram``
  — ``DCU[3]   : vram Total Memory (MiB): 65520``;
* ``--json`` — ``{"card3": {"vram Total Memory (MiB)": "65520", ...}}``, which
  some releases prefix with a warning line.

HyHAL's hy-smi (the DTK 25/26 driver stack, BW1000 and K100-AI nodes) names
devices ``HCU``: the header row ``HCU Temp AvgPwr Perf PwrCap VRAM% HCU% Dec%
Enc% Mode``, ``HCU[3] : ...`` lines, ``HCU use (%)``; its ``--showbus`` line
goes on after the address (``PCI Bus: 0000:05:00.0 --> SN: 2500238601000586``)
and its ``--json`` leaves out some commas (see :func:`agents.parsing.cards_of`).
Both generations are read alike.

``merge`` folds them into one dict per device and ``parse`` builds the devices.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from agents.parsing import (
    Parsed,
    ParseError,
    broken_device,
    cards_of,
    device_from,
    normalize_bus_id,
    number,
)
from hcs_bus.messages import DeviceFingerprint, Telemetry
from hcs_bus.profiles import ProfileDB

TOOL = "hy-smi"
VENDOR = "hygon"
_DEVICE_WORDS = ("DCU", "HCU")  # the table's first column: before HyHAL, and since
_DETAIL = re.compile(r"^\s*(?:DCU|HCU|GPU)\[(\d+)\]\s*:\s*(.+?)\s*:\s*(.*?)\s*$")

_PID = re.compile(r"^\s*PID:\s*(\d+)\s*$")
_INDEX = re.compile(r"^\s*(?:HCU|DCU|GPU) Index:(.*)$")
_PID_VRAM = re.compile(r"^\s*VRAM USED\(MiB\):\s*(\d+)\s*$")

Readings = dict[int, dict[str, str]]


class HyProcess(NamedTuple):
    """One process of ``hy-smi --showpids``: its devices (host indices) and
    the VRAM it holds on all of them together (the tool gives no split)."""

    pid: int
    devices: tuple[int, ...]
    vram_mib: int


def processes(text: str) -> list[HyProcess]:
    """``hy-smi --showpids``: a ``PID: n`` block per process (``HCU Index:
    ['1']``, ``VRAM USED(MiB): 9649``); none for ``No KFD PIDs currently
    running!``. A block without both readings is left out."""
    out: list[HyProcess] = []
    pid: int | None = None
    devices: tuple[int, ...] = ()
    for line in text.splitlines():
        if found := _PID.match(line):
            pid, devices = int(found.group(1)), ()
        elif pid is not None and (found := _INDEX.match(line)):
            devices = tuple(int(d) for d in re.findall(r"'(\d+)'", found.group(1)))
        elif pid is not None and devices and (found := _PID_VRAM.match(line)):
            out.append(HyProcess(pid, devices, int(found.group(1))))
            pid = None
    return out


def parse_table(text: str) -> tuple[Readings, list[ParseError]]:
    """The default table: columns named by its header row."""
    out: Readings = {}
    errors: list[ParseError] = []
    header: list[str] | None = None
    for line in text.splitlines():
        tokens = line.split()
        if not tokens or set(line.strip()) <= {"=", " "} or line.lstrip().startswith("="):
            continue
        if tokens[0] in _DEVICE_WORDS and len(tokens) > 1:
            header = tokens
            continue
        if header is None:
            continue
        if not tokens[0].isdigit():
            errors.append(ParseError(tool=TOOL, reason=f"unexpected table row {line.strip()!r}"))
            continue
        index = int(tokens[0])
        if len(tokens) != len(header):
            reason = f"table row has {len(tokens)} columns, header has {len(header)}"
            errors.append(ParseError(tool=TOOL, device=index, reason=reason))
            out[index] = {"_error": reason}
            continue
        out[index] = dict(zip(header, tokens, strict=True))
    return out, errors


def parse_details(text: str) -> Readings:
    """``DCU[i] : key: value`` (or ``HCU[i]``) lines, keys as hy-smi prints them."""
    out: Readings = {}
    for line in text.splitlines():
        found = _DETAIL.match(line)
        if found:
            index, key, value = found.groups()
            out.setdefault(int(index), {})[key.strip()] = value.strip()
    return out


def parse_json(text: str) -> Readings:
    """``--json`` output (ValueError: see :func:`agents.parsing.cards_of`)."""
    return cards_of(text, tool=TOOL)


def merge(*parts: Readings) -> Readings:
    out: Readings = {}
    for part in parts:
        for index, fields in part.items():
            out.setdefault(index, {}).update(fields)
    return out


def parse(readings: Readings, *, db: ProfileDB, errors: list[ParseError] | None = None) -> Parsed:
    """Devices from merged readings; a device with missing fields is marked broken."""
    errors = list(errors or [])
    if not readings:
        errors.append(ParseError(tool=TOOL, reason="no DCU or HCU found in the output"))
    devices: list[DeviceFingerprint] = []
    for index in sorted(readings):
        fields = readings[index]
        try:
            if "_error" in fields:
                raise ValueError(fields["_error"])
            devices.append(_device(index, fields, db=db))
        except ValueError as exc:
            if "_error" not in fields:
                errors.append(ParseError(tool=TOOL, device=index, reason=str(exc)))
            devices.append(broken_device(vendor=VENDOR, index=index, error=f"{TOOL}: {exc}"))
    return Parsed(devices=tuple(devices), errors=tuple(errors))


def _first(fields: dict[str, str], *keys: str) -> str | None:
    for key in keys:
        if fields.get(key) not in (None, "", "N/A"):
            return fields[key]
    return None


def _vram_mib(fields: dict[str, str], *, used: bool) -> int:
    word = "Total Used Memory" if used else "Total Memory"
    for key, value in fields.items():
        lowered = key.lower()
        if lowered.startswith(f"vram {word.lower()}"):
            amount = number(value, what=key)
            return int(amount / (1 << 20)) if lowered.endswith("(b)") else int(amount)
    raise ValueError(f"no 'vram {word}' reading (run with --showmeminfo vram)")


def _device(index: int, fields: dict[str, str], *, db: ProfileDB) -> DeviceFingerprint:
    name = _first(fields, "Card Series", "Card series", "Card Model")
    if name is None:
        raise ValueError("no 'Card Series' reading (run with --showproductname)")
    total = _vram_mib(fields, used=False)
    used = _vram_mib(fields, used=True)
    bus = _first(fields, "PCI Bus")
    return device_from(
        db=db,
        vendor=VENDOR,
        name=name,
        index=index,
        uuid=f"hygon-{_first(fields, 'Unique ID') or bus or index}",
        vram_total_mib=total,
        vram_free_mib=total - used,
        pci_bus_id=normalize_bus_id(bus) if bus else "",
        telemetry=_telemetry(fields),
    )


def _telemetry(fields: dict[str, str]) -> Telemetry:
    def read(*keys: str) -> float:
        raw = _first(fields, *keys)
        return number(raw, what=keys[0]) if raw is not None else 0.0

    return Telemetry(
        utilisation_pct=read("DCU%", "HCU%", "DCU use (%)", "HCU use (%)"),
        power_w=read("AvgPwr", "Average Graphics Package Power (W)"),
        power_limit_w=read("PwrCap", "Max Graphics Package Power (W)"),
        temperature_c=read("Temp", "Temperature (Sensor junction) (C)"),
    )
