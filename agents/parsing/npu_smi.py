"""Huawei Ascend ``npu-smi info`` table and ``npu-smi info -t <type> -i N`` key/value output.

The table has, per NPU, a name row (``| 0  910B2 | OK | 93.6  40  0 / 0 |``)
followed by one row per chip (``| 0 | 0000:C1:00.0 | 0  0 / 0  3161 / 65536 |``).
Each chip becomes one device; on 910B cards there is one chip per NPU. The
processes table after the devices (``| 2  0 | 184536 | python3.9 | 31568 |``:
NPU, chip, pid, name, MB) tells what of a chip's HBM processes hold; the
rest of what it uses is the driver's and firmware's (about 3 GiB of a
910B's 64 at rest), which no tenant can be promised.

Layouts recorded by users, all read:

* 310P3 Duo cards: two chips per NPU, ``Chip  Device`` (the device id is the
  index), both chips on one Bus-Id (the second chip's uuid names its chip);
  NPU ids such as 96 or 32768;
* Atlas A3 (910C): each die a device, ``Chip  Phy-ID``, named ``Ascend910``
  (read as a 910C die, not the first-generation 910), the second die's
  Power ``-``; the die's bin is in ``npu-smi info -t board -i N -c C``
  (``NPU Name : 9392`` beside ``Chip Name : Ascend910``: CANN's SoC
  ``Ascend910_9392``), which :func:`a3_dies`, :func:`a3_soc` and
  :func:`with_soc` read;
* 310B (Atlas 200I A2): Bus-Id ``NA``;
* Ascend 950 (npu-smi 25.6): ``NPU ID | Name | Health`` in cells of their
  own, the second row's id cells empty, Bus-Id ``NA``;
* npu-smi 25.5 and later: a ``Process id in container`` column after the
  memory in the processes table.

``npu-smi info -t topo`` prints a matrix of how each pair of NPUs is joined
(:func:`parse_topo`): a header of ``NPU<i>`` (A3: ``Phy-ID<i>``, the die's
device index) cells and usually ``CPU Affinity``, one row per NPU with ``X``
on the diagonal, then a ``Legend``. :func:`with_links` turns it into each
device's links, as NVML's NVLink and PCIe links are (one per peer):

* ``HCCS`` (910B's full mesh): ``hccs``, the device's interconnect shared by
  its HCCS peers (7 × 56 GB/s on an 8-NPU 910B board);
* ``HCCS_SW`` (A3, through the HCCS switch) and ``SIO`` (A3, the two dies of
  one package): ``hccs`` at the device's whole interconnect, as NVSwitch;
* ``UB`` (Ascend 950's UnifiedBus, which ``LinkType`` names ``hccs`` as the
  profiles do): ``hccs``, shared like HCCS;
* ``PIX``/``PXB``/``PHB``/``SYS``: ``pcie``, a PCIe 4.0 x16 link scaled by how
  far the path goes (npu-smi reports no link speed);
* ``NA`` and words not known here: no link.

A device without the command (``This device does not support querying
topo.``: Atlas 200I A2) prints no matrix: no links, no error.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple

import msgspec

from agents.parsing import (
    Parsed,
    ParseError,
    broken_device,
    compute_of,
    device_from,
    normalize_bus_id,
    number,
)
from hcs_bus.messages import DeviceFingerprint, Link, LinkType, Telemetry
from hcs_bus.profiles import ProfileDB

TOOL = "npu-smi"
VENDOR = "huawei"
_PAIR = re.compile(r"(?<![\w.])(\d+)\s*/\s*(\d+)(?![\w.])")
HEALTH_SCORES = {"ok": 100, "warning": 70, "alarm": 40, "critical": 0}
_UNREPORTED = ("NA", "-")  # "-": the Power of an A3 package's second die
# npu-smi names an A3 die as it named the first 910; the Phy-ID column tells them apart
A3_DIE = "Ascend910C-die"
_BARE_910 = ("Ascend910", "910")


class NpuProcess(NamedTuple):
    """One row of the processes table; ``device`` is the index of its chip's
    device (the NPU id where the device table does not list that chip)."""

    npu: int
    chip: int
    pid: int
    name: str
    memory_mib: int
    device: int


def processes(text: str) -> list[NpuProcess]:
    """The processes table of ``npu-smi info`` (empty when it lists none):
    NPU and chip, pid, name, MB; later cells (npu-smi 25.5's ``Process id in
    container``) are not read."""
    return _processes(text, _devices(_blocks(text)[0]))


def _processes(text: str, devices: dict[tuple[int, int], int]) -> list[NpuProcess]:
    out = []
    in_table = False
    for line in text.splitlines():
        if "Process id" in line and "Process memory" in line:
            in_table = True
            continue
        cells = _cells(line) if in_table else None
        if cells is None or len(cells) < 4:
            continue
        ids, pid, name, mib = cells[0].split(), cells[1], cells[2], cells[3]
        if len(ids) == 1:  # the Ascend 950's table: an NPU ID, one chip
            ids.append("0")
        if len(ids) == 2 and all(i.isdigit() for i in (*ids, pid, mib)):
            npu, chip = int(ids[0]), int(ids[1])
            device = devices.get((npu, chip), npu)
            out.append(NpuProcess(npu, chip, int(pid), name, int(mib), device))
    return out


class _Block:
    """The name row of one NPU and its chip rows, as table cells; ``a3``
    when the table is an A3's (its chip header names a ``Phy-ID``)."""

    def __init__(self, npu: int, head: list[str], *, a3: bool) -> None:
        self.npu = npu
        self.head = head
        self.a3 = a3
        self.chips: list[list[str]] = []


def parse_info(text: str, *, db: ProfileDB) -> Parsed:
    """Parse ``npu-smi info``; a broken row spoils only its own device."""
    blocks, errors = _blocks(text)
    if not blocks and not errors:
        errors.append(ParseError(tool=TOOL, reason="no NPU rows found in the output"))
    held: dict[int, int] = {}
    for process in _processes(text, _devices(blocks)):
        held[process.device] = held.get(process.device, 0) + process.memory_mib
    devices: list[DeviceFingerprint] = []
    for block in blocks:
        if not block.chips:
            reason = "name row without a chip row (output truncated?)"
            errors.append(ParseError(tool=TOOL, device=block.npu, reason=reason))
            devices.append(broken_device(vendor=VENDOR, index=block.npu, error=f"{TOOL}: {reason}"))
            continue
        for chip in block.chips:
            index = _chip_index(block, chip)
            try:
                processes_mib = held.get(index, 0)
                devices.append(
                    _device(block, chip, index=index, db=db, processes_mib=processes_mib)
                )
            except ValueError as exc:
                errors.append(ParseError(tool=TOOL, device=index, reason=str(exc)))
                devices.append(broken_device(vendor=VENDOR, index=index, error=f"{TOOL}: {exc}"))
    return Parsed(devices=tuple(devices), errors=tuple(errors))


def _cells(line: str) -> list[str] | None:
    line = line.strip()
    if not line.startswith("|") or not line.endswith("|"):
        return None
    return [cell.strip() for cell in line[1:-1].split("|")]


def _blocks(text: str) -> tuple[list[_Block], list[ParseError]]:
    blocks: list[_Block] = []
    errors: list[ParseError] = []
    in_devices = a3 = wide = False
    for number_, line in enumerate(text.splitlines(), start=1):
        cells = _cells(line)
        if cells is None or len(cells) < 3:
            if cells is not None and blocks and "process" in line.lower():
                break
            continue
        if cells[:2] == ["NPU ID", "Name"] and not blocks:
            in_devices = wide = True
            continue
        if wide:
            cells = _narrow(cells)
        first = cells[0].split()
        if first[:2] == ["NPU", "Name"]:
            in_devices = True
            continue
        if first[:2] == ["Chip", "Phy-ID"]:
            a3 = True
        if not in_devices or not first or first[0] in ("Chip", "NPU"):
            if first[:1] == ["NPU"] and blocks:
                break  # the processes table starts
            continue
        if len(first) >= 2 and not first[1].isdigit():
            if not first[0].isdigit():
                errors.append(
                    ParseError(tool=TOOL, reason=f"line {number_}: bad NPU id {first[0]!r}")
                )
                continue
            blocks.append(_Block(int(first[0]), cells, a3=a3))
        elif blocks:
            blocks[-1].chips.append(cells)
    return blocks, errors


def _devices(blocks: list[_Block]) -> dict[tuple[int, int], int]:
    """Each chip's device index by (NPU id, chip)."""
    return {(b.npu, _chip_no(chip)): _chip_index(b, chip) for b in blocks for chip in b.chips}


def _narrow(cells: list[str]) -> list[str]:
    """A row of the ``NPU ID | Name | Health | ...`` layout (Ascend 950) as
    the usual three cells: ``NPU Name`` in the name row, chip 0 in the other
    (whose id cells are empty)."""
    if len(cells) < 4:
        return cells
    if cells[0].isdigit():
        return [f"{cells[0]} {cells[1]}", *cells[2:]]
    if not cells[0] and not cells[1]:
        return ["0", *cells[2:]]
    return cells


def _chip_no(chip: list[str]) -> int:
    tokens = chip[0].split()
    return int(tokens[0]) if tokens and tokens[0].isdigit() else 0


def _chip_index(block: _Block, chip: list[str]) -> int:
    tokens = chip[0].split()
    # 310P cards list "Chip  Device": the logical device id is the second token.
    if len(tokens) >= 2 and tokens[1].isdigit():
        return int(tokens[1])
    return block.npu


def _device(
    block: _Block, chip: list[str], *, index: int, db: ProfileDB, processes_mib: int
) -> DeviceFingerprint:
    """One chip; the HBM it uses that its processes do not hold is the
    driver's (none when they seem to hold more than is used: a torn reading)."""
    name = block.head[0].split(maxsplit=1)[1]
    if _a3_die(block):
        name = A3_DIE
    health = block.head[1].split()[0] if block.head[1] else "unknown"
    bus_id = "" if chip[1].upper() in _UNREPORTED else normalize_bus_id(chip[1])
    chip_no = _chip_no(chip)
    # two chips of a 310P Duo share a Bus-Id; a 310B has none
    where = bus_id or f"npu{block.npu}"
    uuid = f"ascend-{where}-{chip_no}" if chip_no or not bus_id else f"ascend-{where}"
    power_temp = block.head[2].split()
    if len(power_temp) < 2:
        raise ValueError(f"power/temperature cell is incomplete: {block.head[2]!r}")
    pairs = [(int(a), int(b)) for a, b in _PAIR.findall(chip[2])]
    memory = [p for p in pairs if p[1] > 0]
    if not memory:
        raise ValueError(f"no memory usage 'used / total' in {chip[2]!r}")
    used, total = memory[-1]  # HBM-Usage when present, else Memory-Usage
    util = chip[2].split()[0] if chip[2].split() else ""
    telemetry = Telemetry(
        utilisation_pct=number(util, what="AICore(%)"),
        power_w=_optional(power_temp[0], what="Power(W)"),
        temperature_c=number(power_temp[1], what="Temp(C)"),
    )
    return device_from(
        db=db,
        vendor=VENDOR,
        name=name,
        index=index,
        uuid=uuid,
        vram_total_mib=total,
        vram_free_mib=total - used,
        vram_driver_mib=used - processes_mib,
        pci_bus_id=bus_id,
        telemetry=telemetry,
        health_score=HEALTH_SCORES.get(health.lower(), 50),
    )


def _optional(raw: str, *, what: str) -> float:
    return 0.0 if raw.upper() in _UNREPORTED else number(raw, what=what)


class TopoCell(NamedTuple):
    """One cell of the ``-t topo`` matrix: how ``device`` reaches ``peer``
    (npu-smi's word: ``HCCS``, ``SIO``, ``PIX`` ...)."""

    device: int
    peer: int
    kind: str


_TOPO_ID = re.compile(r"^(?:NPU|Phy-ID)(\d+)$")
# npu-smi's words for a peer link, and whether the device's interconnect is
# shared among those peers (a mesh) or whole to each (a switch, a package)
PEER_WORDS: dict[str, bool] = {"HCCS": True, "UB": True, "HCCS_SW": False, "SIO": False}
# PCIe paths: share of a PCIe 4.0 x16 link (GB/s one direction), by how far they go
PCIE_GBPS = 31.5
PCIE_WORDS: dict[str, float] = {"PIX": 1.0, "PXB": 0.9, "PHB": 0.8, "SYS": 0.5}
_NO_LINK = ("X", "NA")


def parse_topo(text: str) -> tuple[list[TopoCell], list[ParseError]]:
    """The cells of ``npu-smi info -t topo`` off the diagonal. The header is
    the first line that starts with an NPU; a row with fewer cells than the
    header names NPUs is an error naming its line, and none of its cells is read."""
    header: list[int] | None = None
    cells: list[TopoCell] = []
    errors: list[ParseError] = []
    for number_, line in enumerate(text.splitlines(), start=1):
        tokens = line.split()
        if tokens[:1] == ["Legend:"]:
            break
        ids = _leading_ids(tokens)
        if not ids:
            continue
        if header is None:
            header = ids
            continue
        row = [t.upper() for t in tokens[1 : 1 + len(header)]]
        if len(row) < len(header):
            reason = f"topo line {number_}: {len(row)} cells for {len(header)} NPUs"
            errors.append(ParseError(tool=TOOL, device=ids[0], reason=reason))
            continue
        cells.extend(
            TopoCell(ids[0], peer, kind)
            for peer, kind in zip(header, row, strict=True)
            if peer != ids[0] and kind not in _NO_LINK
        )
    return cells, errors


def _leading_ids(tokens: list[str]) -> list[int]:
    """The device indices a line starts with (``NPU3``, ``Phy-ID12``)."""
    out = []
    for token in tokens:
        found = _TOPO_ID.match(token)
        if found is None:
            break
        out.append(int(found.group(1)))
    return out


def with_links(
    devices: Sequence[DeviceFingerprint], cells: Sequence[TopoCell], *, db: ProfileDB
) -> tuple[tuple[DeviceFingerprint, ...], tuple[str, ...]]:
    """``devices`` with their links from the ``-t topo`` cells (see the module
    docstring), and notes on the cells not read: a kind not known here, or a
    device or peer ``npu-smi info`` does not list."""
    by_index = {d.index: d for d in devices}
    mine: dict[int, list[TopoCell]] = {}
    notes: set[str] = set()
    for cell in cells:
        if cell.device not in by_index or cell.peer not in by_index:
            notes.add(f"topo names NPU {cell.device} or {cell.peer}, not listed by npu-smi info")
        elif cell.kind not in PEER_WORDS and cell.kind not in PCIE_WORDS:
            notes.add(f"topo link kind {cell.kind!r} is not known: no link read")
        else:
            mine.setdefault(cell.device, []).append(cell)
    out = tuple(
        d
        if d.error or d.index not in mine
        else msgspec.structs.replace(d, links=_links_of(d, mine[d.index], by_index, db=db))
        for d in devices
    )
    return out, tuple(sorted(notes))


def _links_of(
    device: DeviceFingerprint,
    cells: list[TopoCell],
    by_index: dict[int, DeviceFingerprint],
    *,
    db: ProfileDB,
) -> tuple[Link, ...]:
    """One link per peer; a mesh's links share the device's interconnect."""
    profile = db.find(f"{VENDOR}/{device.model}")
    total = profile.interconnect_bandwidth_gbps if profile is not None else 0.0
    sharing = sum(1 for c in cells if PEER_WORDS.get(c.kind, False))
    links = []
    for cell in sorted(cells, key=lambda c: c.peer):
        kind: LinkType = "pcie"
        if cell.kind in PEER_WORDS:
            kind, gbps = "hccs", total / sharing if PEER_WORDS[cell.kind] else total
        else:
            gbps = PCIE_GBPS * PCIE_WORDS[cell.kind]
        bus = by_index[cell.peer].pci_bus_id or None
        links.append(
            Link(peer_index=cell.peer, type=kind, bandwidth_gbps=round(gbps, 1), peer_bus_id=bus)
        )
    return tuple(links)


def parse_kv(text: str) -> dict[str, str]:
    """``npu-smi info -t board|health|memory -i N``: ``Key : value`` lines."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out.setdefault(key.strip(), value.strip())
    return out


class A3Die(NamedTuple):
    """An A3 die of ``npu-smi info``: where ``-t board`` finds it (``-i npu -c
    chip``) and its device index."""

    npu: int
    chip: int
    device: int


def a3_dies(text: str) -> list[A3Die]:
    """The dies of an A3's ``npu-smi info`` (none for any other table)."""
    blocks, _ = _blocks(text)
    return [
        A3Die(block.npu, _chip_no(chip), _chip_index(block, chip))
        for block in blocks
        if _a3_die(block)
        for chip in block.chips
    ]


def _a3_die(block: _Block) -> bool:
    """An A3's NPU: named as the first 910, under a ``Phy-ID`` header."""
    name = block.head[0].split(maxsplit=1)[1:]
    return block.a3 and bool(name) and name[0] in _BARE_910


def a3_soc(board: dict[str, str]) -> str | None:
    """An A3 die's SoC as CANN names its platform file, from ``npu-smi info
    -t board -i N -c C`` (:func:`parse_kv`): ``Chip Name`` and ``NPU Name``
    joined (``Ascend910`` and ``9392``: ``Ascend910_9392``); None when the
    board names no NPU (an A2's has ``Chip Type`` instead)."""
    chip, npu = board.get("Chip Name", ""), board.get("NPU Name", "")
    if not chip or not npu.isalnum() or npu.upper() == "NA":
        return None
    return f"{chip}_{npu}"


def with_soc(device: DeviceFingerprint, soc: str, *, db: ProfileDB) -> DeviceFingerprint | None:
    """``device`` as the profile of ``soc`` (model and compute); None when
    no profile has that name."""
    profile = db.match(VENDOR, soc)
    if profile is None:
        return None
    return msgspec.structs.replace(device, model=profile.model, compute=compute_of(profile))


def with_board(device: DeviceFingerprint, board: dict[str, str]) -> DeviceFingerprint:
    """Use the board serial number as the device's stable id where given."""
    serial = board.get("Serial Number", "")
    if not serial or serial.upper() == "NA" or device.error:
        return device
    return msgspec.structs.replace(device, uuid=f"ascend-{serial}")


def health_of(health: dict[str, str]) -> tuple[str, str]:
    """``-t health``: (status, error code) — e.g. ("Warning", "80E18005")."""
    return health.get("Health Status", "unknown"), health.get("Error Code", "NA")
