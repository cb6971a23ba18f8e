"""Cambricon ``cnmon`` table and ``cnmon info`` blocks.

Table, two rows per MLU::

    | 0     /   MLU370-X8    v1.1.4 |         0000:4F:00.0 | 0%          0         |
    | 0%   34C         75 W/ 250 W  |     0 MiB/ 23374 MiB | N/A           Default |

Drivers before v5 (CNMON v4, and 1.x on MLU220) print ``Inited  Driver`` where
later ones print ``Bus-Id`` (``| 0  /  MLU370-X4  v1.1.6 | On  v4.20.11 | ...``):
the bus then comes from ``cnmon info`` when it has one. A cell the device does
not report is ``N/A`` (Ecc-Error on MLU370 with v5.10 drivers): read as 0.

``cnmon info`` prints a ``Card N`` block of ``Key : value`` lines with indented
sub-sections (``Physical Memory Usage`` → ``Total``/``Used``); it supplies the
UUID. Its top-level keys are indented too in recordings of real output (four
spaces), so levels are told apart by indentation relative to the block's first
line. The processes table is ignored.
"""

from __future__ import annotations

import re

from agents.parsing import (
    Parsed,
    ParseError,
    broken_device,
    device_from,
    normalize_bus_id,
    number,
)
from hcs_bus.messages import DeviceFingerprint, Telemetry
from hcs_bus.profiles import ProfileDB

TOOL = "cnmon"
VENDOR = "cambricon"
_MEMORY = re.compile(r"(\d+)\s*MiB\s*/\s*(\d+)\s*MiB")
_POWER = re.compile(r"([\d.]+|N/A)\s*W\s*/\s*([\d.]+|N/A)\s*W")
_CARD = re.compile(r"^Card\s+(\d+)\s*$")
_UNREPORTED = "N/A"


def _cells(line: str) -> list[str] | None:
    line = line.strip()
    if not line.startswith("|") or not line.endswith("|"):
        return None
    cells = [cell.strip() for cell in line[1:-1].split("|")]
    return cells if len(cells) == 3 else None


def _rows(text: str) -> tuple[list[str], list[tuple[list[str], list[str] | None]]]:
    """The table's header cells, and (first row, second row or None) per MLU."""
    pairs: list[tuple[list[str], list[str] | None]] = []
    header: list[str] = []
    in_table = False
    for line in text.splitlines():
        if line.startswith("|=") and not in_table:
            in_table = True
            continue
        if in_table and not line.strip():
            break  # a blank line ends the device table; processes follow
        cells = _cells(line)
        if cells is None:
            continue
        if not in_table:
            header = header or cells  # its first row names the columns
            continue
        head = cells[0].split()
        if head and head[0].isdigit() and len(head) >= 3:
            pairs.append((cells, None))
        elif pairs and pairs[-1][1] is None:
            pairs[-1] = (pairs[-1][0], cells)
    return header, pairs


def parse_table(
    text: str, *, db: ProfileDB, info: dict[int, dict[str, str]] | None = None
) -> Parsed:
    """Devices from the ``cnmon`` table, enriched with ``cnmon info`` blocks."""
    info = info or {}
    errors: list[ParseError] = []
    devices: list[DeviceFingerprint] = []
    header, rows = _rows(text)
    has_bus = not header or "Bus-Id" in header[1]  # v4 and before: "Inited  Driver"
    if not rows:
        errors.append(ParseError(tool=TOOL, reason="no MLU rows found in the output"))
    for first, second in rows:
        index = int(first[0].split()[0])
        try:
            if second is None:
                raise ValueError("first row without its second row (output truncated?)")
            card = info.get(index, {})
            devices.append(_device(index, first, second, card, has_bus=has_bus, db=db))
        except ValueError as exc:
            errors.append(ParseError(tool=TOOL, device=index, reason=str(exc)))
            devices.append(broken_device(vendor=VENDOR, index=index, error=f"{TOOL}: {exc}"))
    return Parsed(devices=tuple(devices), errors=tuple(errors))


def _device(
    index: int,
    first: list[str],
    second: list[str],
    info: dict[str, str],
    *,
    has_bus: bool,
    db: ProfileDB,
) -> DeviceFingerprint:
    head = first[0].split()
    name = head[2]
    bus_id = normalize_bus_id(first[1]) if has_bus else _info_bus(info)
    memory = _MEMORY.search(second[1])
    if memory is None:
        raise ValueError(f"no 'used MiB/ total MiB' in {second[1]!r}")
    used, total = int(memory.group(1)), int(memory.group(2))
    util = first[2].split()
    status = second[0].split()
    if len(status) < 2 or not util:
        raise ValueError(f"fan/temperature/utilisation cells incomplete: {second[0]!r}")
    power = _POWER.search(second[0])
    telemetry = Telemetry(
        utilisation_pct=_reading(util[0], what="Util"),
        temperature_c=_reading(status[1], what="Temp"),
        power_w=_watts(power.group(1) if power else _UNREPORTED),
        power_limit_w=_watts(power.group(2) if power else _UNREPORTED),
        ecc_uncorrected=int(_reading(util[1], what="Ecc-Error")) if len(util) > 1 else 0,
    )
    return device_from(
        db=db,
        vendor=VENDOR,
        name=name,
        index=index,
        uuid=f"mlu-{info.get('UUID') or bus_id or index}",
        vram_total_mib=total,
        vram_free_mib=total - used,
        pci_bus_id=bus_id,
        telemetry=telemetry,
    )


def _reading(raw: str, *, what: str) -> float:
    """A table cell's number; 0 where the device does not report it (``N/A``)."""
    return 0.0 if raw == _UNREPORTED else number(raw, what=what)


def _info_bus(info: dict[str, str]) -> str:
    """The bus from ``cnmon info``'s PCI section (``PCIe`` in some releases), or ""."""
    for section in ("PCIe", "PCI"):
        parts = [
            info.get(f"{section}.{key}") for key in ("Domain ID", "Bus num", "Device", "Function")
        ]
        if all(parts):
            domain, bus, device, function = (str(part) for part in parts)
            try:
                return normalize_bus_id(
                    f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"
                )
            except ValueError:
                return ""
    return ""


def _watts(raw: str) -> float:
    return 0.0 if raw == _UNREPORTED else float(raw)


def parse_info(text: str) -> dict[int, dict[str, str]]:
    """``cnmon info``: per card, keys flattened as ``Section.Key`` for the
    lines indented below a section; the first line after ``Card N`` sets how
    far a top-level line is indented."""
    out: dict[int, dict[str, str]] = {}
    card: dict[str, str] | None = None
    section = ""
    top: int | None = None
    for line in text.splitlines():
        found = _CARD.match(line.strip())
        if found:
            card = out.setdefault(int(found.group(1)), {})
            section, top = "", None
            continue
        if card is None or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if top is None:
            top = indent
        key, sep, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if indent > top and sep:
            card[f"{section}.{key}"] = value
        elif sep and value:
            card[key] = value
        else:
            section = key
    return out
