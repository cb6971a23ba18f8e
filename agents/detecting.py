"""Detectors, chosen by what the host has: NVML, npu-smi, hy-smi, cnmon, rocm-smi.

Each detector yields :class:`agents.parsing.Parsed`. Vendor tools run as
asyncio subprocesses under ``settings.agent.vendor_tool_timeout_s``; a tool
that hangs, exits non-zero or prints garbage becomes ONE ``detector_error``
HealthEvent (source ``agent``, severity ``warning``) when it starts failing —
and a ``detector_recovered`` when it works again — while the other detectors
carry on. A device two detectors both report (same PCI bus id: a Hygon host
whose DTK ships hy-smi and rocm-smi) counts once, from the first detector in
:func:`choose`'s order. A parser's notes are logged once per detector.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from agents import nvml
from agents.parsing import Parsed, cnmon, hy_smi, npu_smi, nvml_readings, rocm_smi
from hcs_bus.messages import DeviceFingerprint, HealthEvent
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger
from hcs_bus.vocabulary import Kind

_log = logger("hcs.agent.detecting")
# how long an A3 die whose board could not be read waits before it is asked again
BOARD_RETRY_S = 600.0


class DetectorFailure(Exception):
    """The detector itself failed (timeout, exit status, unreadable output)."""


async def run_tool(argv: Sequence[str], *, timeout_s: float) -> str:
    """stdout of ``argv``; DetectorFailure on a hang, a bad exit or no output."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            start_new_session=True,  # its own process group: a hang is killed whole
        )
    except OSError as exc:
        raise DetectorFailure(f"{argv[0]}: cannot start: {exc.strerror}") from exc
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError as exc:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        raise DetectorFailure(f"{' '.join(argv)}: no answer within {timeout_s}s") from exc
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip()[-200:]
        raise DetectorFailure(f"{' '.join(argv)}: exit status {proc.returncode}: {tail}")
    return out.decode(errors="replace")


Detect = Callable[[], Awaitable[Parsed]]


@dataclass
class Detector:
    name: str
    detect: Detect
    failing: str | None = None
    noted: set[str] = field(default_factory=set)


def npu_smi_detector(
    *,
    db: ProfileDB,
    timeout_s: float,
    tool: str = "npu-smi",
    board_retry_s: float = BOARD_RETRY_S,
) -> Detector:
    """``npu-smi info``; on an Atlas A3, each die named by its bin, read once
    per die from ``npu-smi info -t board`` (a die whose board cannot be read
    stays an ``Ascend910C-die``, the least bin, and is asked again later);
    with two devices or more, their HCCS and PCIe links from ``npu-smi info
    -t topo``, read once for a set of devices (a run that fails leaves them
    without links, is a note, and is tried again after ``board_retry_s``)."""
    socs: dict[str, str | None] = {}  # die uuid -> its SoC (None: the board names none)
    failed: dict[str, float] = {}  # die uuid -> when its board could not be read
    topology = _Topology(tool=tool, timeout_s=timeout_s, retry_s=board_retry_s)

    async def soc_of(die: npu_smi.A3Die, uuid: str, notes: list[str]) -> str | None:
        if uuid in socs:
            return socs[uuid]
        if time.monotonic() - failed.get(uuid, -board_retry_s) < board_retry_s:
            return None
        argv = [tool, "info", "-t", "board", "-i", str(die.npu), "-c", str(die.chip)]
        try:
            board = npu_smi.parse_kv(await run_tool(argv, timeout_s=timeout_s))
        except DetectorFailure as exc:
            failed[uuid] = time.monotonic()
            notes.append(f"A3 die {die.device}: its bin is unknown ({exc})")
            return None
        socs[uuid] = npu_smi.a3_soc(board)
        return socs[uuid]

    async def detect() -> Parsed:
        text = await run_tool([tool, "info"], timeout_s=timeout_s)
        named = await named_dies(text, npu_smi.parse_info(text, db=db))
        return await linked(named)

    async def linked(parsed: Parsed) -> Parsed:
        """The devices with their links from ``npu-smi info -t topo``."""
        if sum(1 for d in parsed.devices if not d.error) < 2:
            return parsed
        cells, notes = await topology.cells(parsed.devices)
        devices, unread = npu_smi.with_links(parsed.devices, cells, db=db)
        return Parsed(devices=devices, errors=parsed.errors, notes=(*parsed.notes, *notes, *unread))

    async def named_dies(text: str, parsed: Parsed) -> Parsed:
        if not any(d.model == npu_smi.A3_DIE for d in parsed.devices):
            return parsed  # no A3 here: its table is not read a second time
        dies = {die.device: die for die in npu_smi.a3_dies(text)}
        devices, notes = list(parsed.devices), list(parsed.notes)
        for i, device in enumerate(devices):
            die = dies.get(device.index)
            if die is None or device.error:
                continue
            soc = await soc_of(die, device.uuid, notes)
            named = npu_smi.with_soc(device, soc, db=db) if soc else None
            if named is not None:
                devices[i] = named
            elif soc:
                notes.append(f"A3 die bin {soc} has no profile: read as the least bin")
        return Parsed(devices=tuple(devices), errors=parsed.errors, notes=tuple(notes))

    return Detector("npu-smi", detect)


class _Topology:
    """``npu-smi info -t topo``, read once for a set of devices (their uuids)
    and again when the set changes; a run that fails is a note, its devices
    have no links, and it is tried again after ``retry_s``. A row it cannot
    read is a note too (logged once, not at every poll)."""

    def __init__(self, *, tool: str, timeout_s: float, retry_s: float) -> None:
        self.tool = tool
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.read_for: tuple[str, ...] | None = None
        self.cells_read: list[npu_smi.TopoCell] = []
        self.notes_read: list[str] = []
        self.failed_at = -retry_s

    async def cells(
        self, devices: Sequence[DeviceFingerprint]
    ) -> tuple[list[npu_smi.TopoCell], list[str]]:
        """The cells for ``devices`` and notes on what could not be read."""
        uuids = tuple(sorted(d.uuid for d in devices))
        if uuids == self.read_for:
            return self.cells_read, self.notes_read
        if time.monotonic() - self.failed_at < self.retry_s:
            return [], []
        try:
            text = await run_tool([self.tool, "info", "-t", "topo"], timeout_s=self.timeout_s)
        except DetectorFailure as exc:
            self.failed_at = time.monotonic()
            return [], [f"no NPU links: {exc}"]
        cells, errors = npu_smi.parse_topo(text)
        self.read_for, self.cells_read = uuids, cells
        self.notes_read = [f"{e.tool} -t topo: {e.reason}" for e in errors]
        return self.cells_read, self.notes_read


def hy_smi_detector(*, db: ProfileDB, timeout_s: float, tool: str = "hy-smi") -> Detector:
    async def detect() -> Parsed:
        table, errors = hy_smi.parse_table(await run_tool([tool], timeout_s=timeout_s))
        details = await run_tool(
            [tool, "--showproductname", "--showbus", "--showuniqueid", "--showmeminfo", "vram"],
            timeout_s=timeout_s,
        )
        return hy_smi.parse(
            hy_smi.merge(table, hy_smi.parse_details(details)), db=db, errors=errors
        )

    return Detector("hy-smi", detect)


def cnmon_detector(*, db: ProfileDB, timeout_s: float, tool: str = "cnmon") -> Detector:
    async def detect() -> Parsed:
        info = cnmon.parse_info(await run_tool([tool, "info"], timeout_s=timeout_s))
        return cnmon.parse_table(await run_tool([tool], timeout_s=timeout_s), db=db, info=info)

    return Detector("cnmon", detect)


def rocm_smi_detector(*, db: ProfileDB, timeout_s: float, tool: str = "rocm-smi") -> Detector:
    async def detect() -> Parsed:
        text = await run_tool([tool, *rocm_smi.ARGS], timeout_s=timeout_s)
        try:
            return rocm_smi.parse(text, db=db)
        except ValueError as exc:  # no card at all: the tool exits 0 when it finds none
            raise DetectorFailure(str(exc)) from exc

    return Detector("rocm-smi", detect)


def nvml_detector(*, db: ProfileDB, timeout_s: float) -> Detector:
    async def detect() -> Parsed:
        try:
            readings = await asyncio.wait_for(asyncio.to_thread(nvml.read_all), timeout_s)
        except TimeoutError as exc:
            raise DetectorFailure(f"NVML: no answer within {timeout_s}s") from exc
        except Exception as exc:  # pynvml raises its own NVMLError tree
            raise DetectorFailure(f"NVML: {exc}") from exc
        return nvml_readings.convert(readings, db=db)

    return Detector("nvml", detect)


def choose(*, db: ProfileDB, timeout_s: float) -> list[Detector]:
    """The detectors this host can run (a host may have none: a CPU node)."""
    found: list[Detector] = []
    if nvml.available():
        found.append(nvml_detector(db=db, timeout_s=timeout_s))
    tools = {
        "npu-smi": npu_smi_detector,
        "hy-smi": hy_smi_detector,
        "cnmon": cnmon_detector,
        "rocm-smi": rocm_smi_detector,  # after hy-smi: on a DCU host hy-smi's devices win
    }
    for tool, make in tools.items():
        path = shutil.which(tool)
        if path:
            found.append(make(db=db, timeout_s=timeout_s, tool=path))
    _log.info("detectors_chosen", detectors=[d.name for d in found])
    return found


@dataclass
class Detection:
    devices: list[DeviceFingerprint] = field(default_factory=list)
    events: list[HealthEvent] = field(default_factory=list)


async def detect_all(detectors: Sequence[Detector], *, node: str, now: float) -> Detection:
    """Run every detector concurrently; one failing never hides another's devices."""
    results = await asyncio.gather(*(d.detect() for d in detectors), return_exceptions=True)
    out = Detection()
    buses: set[str] = set()
    for detector, result in zip(detectors, results, strict=True):
        if isinstance(result, BaseException):
            reason = str(result) if isinstance(result, DetectorFailure) else repr(result)
            if detector.failing is None:
                out.events.append(_event(node, detector.name, Kind.DETECTOR_ERROR, reason, now=now))
                _log.warning("detector_failed", detector=detector.name, error=reason)
            detector.failing = reason
            continue
        if detector.failing is not None:
            out.events.append(_event(node, detector.name, Kind.DETECTOR_RECOVERED, "ok", now=now))
            detector.failing = None
        for device in result.devices:
            if device.pci_bus_id and device.pci_bus_id in buses:
                continue
            buses.add(device.pci_bus_id)
            out.devices.append(device)
        for error in result.errors:
            _log.warning("detector_parse_error", detector=detector.name, error=str(error))
        for note in set(result.notes) - detector.noted:
            _log.info("detector_note", detector=detector.name, note=note)
            detector.noted.add(note)
    return out


def _event(node: str, detector: str, kind: str, message: str, *, now: float) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind=kind,
        severity="warning" if kind == Kind.DETECTOR_ERROR else "info",
        source="agent",
        time_s=now,
        message=f"{detector}: {message}",
        evidence={"detector": detector},
    )
