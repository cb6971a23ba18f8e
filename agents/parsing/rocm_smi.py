"""AMD ``rocm-smi --json`` output (AMD Instinct, and Hygon DCUs whose DTK ships it).

The detector runs ``rocm-smi`` with :data:`ARGS`. With ``--json`` the tool
prints ONE line: a JSON object with a ``cardN`` entry per device (``N`` is
the tool's device index), each a flat object of strings named as in its text
output — only metrics the device supports appear::

    {"card0": {"Unique ID": "0x...", "Temperature (Sensor junction) (C)": "41.0",
               "Current Socket Graphics Package Power (W)": "139.0",
               "GPU use (%)": "0", "PCI Bus": "0000:0C:00.0",
               "VRAM Total Memory (B)": "205822885888",
               "VRAM Total Used Memory (B)": "295059456",
               "Card Series": "AMD Instinct MI300X", "Card Model": "0x74a1",
               "Card Vendor": "Advanced Micro Devices, Inc. [AMD/ATI]", ...}}

Differences between releases and devices, all accepted:

* ROCm 5 spells ``Card series``/``Card model``/``Card vendor``, ROCm 6
  ``Card Series``/``Card Model``/``Card Vendor``; ``Card Model`` is the PCI
  device id (``0x74a1``), not a name, so the model comes from the series;
* power is ``Current Socket Graphics Package Power (W)`` on MI300 and
  ``Average Graphics Package Power (W)`` before; the second die of an MI250X
  says ``N/A (Secondary die)`` (the first die reports the package);
* MI300 have no edge sensor: the junction temperature is used, else edge;
* some builds print a warning line before the JSON; a Hygon DTK's tool
  names the vendor ``Chengdu Haiguang IC Design Co., Ltd.``, and HyHAL's
  says ``HCU use (%)`` and leaves out commas after some power readings.

A device is vendor ``hygon`` when the vendor string or a hygon profile says
so, else ``amd``. The profile database has no AMD model yet: such a device
keeps the tool's series name (label-safe) with zero profile compute, and
``Parsed.notes`` says why, rather than numbers guessed from a datasheet.
Output with no JSON object or no card is a ValueError (the tool exits 0 when
it finds no device); a card with missing or unreadable readings is a broken
device and the others stay usable.
"""

from __future__ import annotations

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

TOOL = "rocm-smi"
ARGS = (
    "--showproductname",
    "--showmeminfo",
    "vram",
    "--showuse",
    "--showtemp",
    "--showpower",
    "--showmaxpower",
    "--showbus",
    "--showuniqueid",
    "--json",
)
_HYGON_WORDS = ("haiguang", "hygon")

Card = dict[str, str]


def parse(text: str, *, db: ProfileDB) -> Parsed:
    """Devices from ``rocm-smi`` :data:`ARGS` output (ValueError: see
    :func:`agents.parsing.cards_of`)."""
    errors: list[ParseError] = []
    notes: list[str] = []
    devices: list[DeviceFingerprint] = []
    for index, fields in sorted(cards_of(text, tool=TOOL).items()):
        try:
            device = _device(index, fields, db=db)
        except ValueError as exc:
            errors.append(ParseError(tool=TOOL, device=index, reason=str(exc)))
            bus = _first(fields, "PCI Bus")
            devices.append(
                broken_device(
                    vendor=_vendor(fields, name=_name(fields) or "", db=db),
                    index=index,
                    error=f"{TOOL}: {exc}",
                    pci_bus_id=_bus_or_blank(bus),
                )
            )
            continue
        if db.match(device.vendor, _name(fields) or "") is None:
            note = (
                f"{device.vendor}/{device.model}: no such model in the profile database; "
                "model kept as the tool names it, compute unknown (VRAM offered only)"
            )
            if note not in notes:
                notes.append(note)
        devices.append(device)
    return Parsed(devices=tuple(devices), errors=tuple(errors), notes=tuple(notes))


def _first(fields: Card, *keys: str) -> str | None:
    """The first present reading among ``keys``; ``N/A…`` counts as absent."""
    for key in keys:
        value = fields.get(key, "").strip()
        if value and not value.upper().startswith("N/A"):
            return value
    return None


def _name(fields: Card) -> str | None:
    return _first(fields, "Card Series", "Card series")


def _vendor(fields: Card, *, name: str, db: ProfileDB) -> str:
    maker = (_first(fields, "Card Vendor", "Card vendor") or "").lower()
    if any(word in maker for word in _HYGON_WORDS):
        return "hygon"
    if not maker and name and db.match("hygon", name) is not None:
        return "hygon"
    return "amd"


def _bus_or_blank(bus: str | None) -> str:
    try:
        return normalize_bus_id(bus) if bus else ""
    except ValueError:
        return ""


def _memory_mib(fields: Card, *, used: bool) -> int:
    """VRAM in MiB from ``VRAM Total [Used ]Memory (B)`` (or a DTK's ``(MiB)``)."""
    want = "vram total used memory" if used else "vram total memory"
    for key, value in fields.items():
        lowered = key.lower()
        if lowered.startswith(want + " ("):
            amount = number(value, what=key)
            return int(amount) >> 20 if lowered.endswith("(b)") else int(amount)
    raise ValueError(f"no '{want}' reading (run with --showmeminfo vram)")


def _device(index: int, fields: Card, *, db: ProfileDB) -> DeviceFingerprint:
    name = _name(fields)
    if name is None:
        raise ValueError("no 'Card Series' reading (run with --showproductname)")
    vendor = _vendor(fields, name=name, db=db)
    total = _memory_mib(fields, used=False)
    used = _memory_mib(fields, used=True)
    bus = _first(fields, "PCI Bus")
    unique = _first(fields, "Unique ID")
    pci = normalize_bus_id(bus) if bus else ""
    return device_from(
        db=db,
        vendor=vendor,
        name=name,
        index=index,
        uuid=f"{vendor}-{unique or pci or index}",
        vram_total_mib=total,
        vram_free_mib=total - used,
        pci_bus_id=pci,
        telemetry=_telemetry(fields),
    )


def _telemetry(fields: Card) -> Telemetry:
    def read(*keys: str) -> float:
        raw = _first(fields, *keys)
        return number(raw, what=keys[0]) if raw is not None else 0.0

    return Telemetry(
        utilisation_pct=read("GPU use (%)", "DCU use (%)", "HCU use (%)"),
        power_w=read(
            "Current Socket Graphics Package Power (W)", "Average Graphics Package Power (W)"
        ),
        power_limit_w=read("Max Graphics Package Power (W)"),
        temperature_c=read("Temperature (Sensor junction) (C)", "Temperature (Sensor edge) (C)"),
    )
