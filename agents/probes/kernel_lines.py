"""Kernel log lines -> ProbeEvent (pure). Mirrors ``ebpf/classify.c``.

``classify`` understands NVIDIA Xid/SXid/"fallen off the bus", PCIe AER
reports, amdgpu-style (Hygon DCU), Ascend and Cambricon driver fault lines.
``parse_kmsg_record`` parses the ``/dev/kmsg`` record format
``pri,seq,ts_usec,flags[,...];message`` plus its `` KEY=value`` lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec

from agents.probes.events import CONTRACT_VERSION, Kind, ProbeEvent, Severity, Source, Vendor
from agents.probes.tables import vendor_of_driver, xid_severity

_BDF = re.compile(
    r"(?<![0-9A-Fa-f])([0-9A-Fa-f]{4}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2})(?![0-9A-Fa-f])(\.[0-7])?"
)
_DIGITS = re.compile(r"[0-9]+")
_RING_TIMEOUT = re.compile(r"(?<![A-Za-z0-9])ring \S+ timeout")
_AMD_PREFIXES = ("amdgpu ", "hydcu ", "hycu ", "[drm:amdgpu", "[drm:hydcu", "[drm:hycu")
_ASCEND_PREFIXES = ("[ascend]", "devdrv", "davinci")
_ASCEND_WORDS = ("heartbeat", "heart beat", "fatal", "timeout", "ecc", "hbm", "fault")
_FATAL_WORDS = (
    "heartbeat lost",
    "heart beat lost",
    "lost heartbeat",
    "heartbeat timeout",
    "fallen off",
)
_CRITICAL_WORDS = ("timeout", "timed out", "ecc", "hbm", "reset", "hang", "uncorrect")
_AER_KINDS: tuple[tuple[str, Kind, Severity], ...] = (
    ("Uncorrected (Fatal)", "aer_fatal", "fatal"),
    ("Uncorrected (Non-Fatal)", "aer_nonfatal", "critical"),
    ("Corrected", "aer_correctable", "info"),
)


@dataclass(frozen=True)
class Match:
    """What a rule found in a line; becomes a ProbeEvent."""

    kind: Kind
    vendor: Vendor | None
    severity: Severity
    pci_bus_id: str | None = None
    device_index: int | None = None
    code: int | None = None
    evidence: dict[str, str | int] = field(default_factory=dict)


def find_bdf(text: str) -> str | None:
    """First PCI address in text, normalised to ``dddd:bb:dd.f`` (lowercase)."""
    m = _BDF.search(text)
    if m is None:
        return None
    return (m.group(1) + (m.group(2) or ".0")).lower()


def _int_after(text: str, marker: str) -> int | None:
    """Digits right after the FIRST occurrence of marker (as classify.c does)."""
    at = text.find(marker)
    if at < 0:
        return None
    m = _DIGITS.match(text, at + len(marker))
    return int(m.group(0)) if m else None


def escalate(line: str, default: Severity) -> Severity:
    """Severity from keywords, for vendors without a numeric code catalogue."""
    low = line.lower()
    if any(w in low for w in _FATAL_WORDS) or ("fatal" in low and "non-fatal" not in low):
        return "fatal"
    if any(w in low for w in _CRITICAL_WORDS):
        return "critical"
    return default


def _selftest(line: str) -> Match | None:
    if not line.startswith("hcs-probe: selftest"):
        return None
    return Match("test_probe", None, "info")


def _sxid(line: str) -> Match | None:
    at = line.find("SXid (")
    if at < 0:
        return None
    tail = line[at:]
    code = _int_after(tail, "): ")
    index = _int_after(line, "nvidia-nvswitch") if line.startswith("nvidia-nvswitch") else None
    severity: Severity = "fatal" if ", Fatal" in tail else "warning"
    return Match("sxid", "nvidia", severity, find_bdf(tail), index, code)


def _xid(line: str) -> Match | None:
    at = line.find("NVRM: Xid (")
    if at < 0:
        return None
    tail = line[at:]
    code = _int_after(tail, "): ")
    severity = xid_severity(code) if code is not None else "warning"
    kind: Kind = "xid"
    if code == 79 or "fallen off the bus" in line:
        kind, severity = "fallen_off_bus", "fatal"
    evidence: dict[str, str | int] = {"xid": code} if code is not None else {}
    return Match(kind, "nvidia", severity, find_bdf(tail), None, code, evidence)


def _fallen(line: str) -> Match | None:
    if "fallen off the bus" not in line or not ("NVRM" in line or line.startswith("nvidia")):
        return None
    return Match("fallen_off_bus", "nvidia", "fatal", find_bdf(line))


def _aer_kind(text: str) -> tuple[Kind, Severity] | None:
    for prefix, kind, severity in _AER_KINDS:
        if text.startswith(prefix):
            return kind, severity
    return None


def _aer_bus_error(line: str) -> Match | None:
    marker = "PCIe Bus Error: severity="
    at = line.find(marker)
    found = _aer_kind(line[at + len(marker) :]) if at >= 0 else None
    if found is None:
        return None
    evidence: dict[str, str | int] = {"aer_line": "bus_error"}
    return Match(found[0], vendor_of_driver(line), found[1], find_bdf(line), evidence=evidence)


def _aer_received(line: str) -> Match | None:
    at, received = line.find("AER: "), line.find(" error received: ")
    if at < 0 or received < at:
        return None
    text = line[at + len("AER: ") :].removeprefix("Multiple ")
    found = _aer_kind(text)
    if found is None:
        return None
    evidence: dict[str, str | int] = {"aer_line": "received"}
    port = find_bdf(line)
    if port is not None:
        evidence["reporting_port"] = port
    return Match(found[0], None, found[1], find_bdf(line[received:]), evidence=evidence)


def _amd_severity(line: str) -> tuple[Severity, int | None] | None:
    if any(w in line for w in ("reset failed", "recovery failed", "VRAM is lost")):
        return "fatal", None
    if "GPU fault detected" in line:
        return "warning", _int_after(line, "GPU fault detected: ")
    if "page fault (src_id" in line:
        return "warning", None
    critical = ("GPU reset begin", "MODE1 reset", "MODE2 reset", "device wedged")
    if _RING_TIMEOUT.search(line) or any(w in line for w in critical):
        return "critical", None
    if "reset succeeded" in line:
        return "warning", None
    return None


def _hygon(line: str) -> Match | None:
    if not line.startswith(_AMD_PREFIXES):
        return None
    found = _amd_severity(line)
    if found is None:
        return None
    return Match("hygon_fault", "hygon", found[0], find_bdf(line), code=found[1])


def _ascend(line: str) -> Match | None:
    if not line.startswith(_ASCEND_PREFIXES):
        return None
    low = line.lower()
    if "[ERROR]" not in line and not any(w in low for w in _ASCEND_WORDS):
        return None
    index = _int_after(line, "devid=")
    if index is None:
        index = _int_after(line, "dev_id=")
    module = re.search(r"^\[ascend\] (?:\[ERROR\] )?\[(\w+)\]", line)
    evidence: dict[str, str | int] = {"module": module.group(1)} if module else {}
    return Match(
        "ascend_fault",
        "huawei",
        escalate(line, "warning"),
        find_bdf(line),
        index,
        evidence=evidence,
    )


def _cambricon(line: str) -> Match | None:
    tagged = re.match(r"(?:ERROR|WARNING): \[Card(\d+)", line)
    low = line.lower()
    driver = line.startswith("cambricon") and any(
        w in low for w in ("error", "fail", "timeout", "heartbeat")
    )
    if tagged is None and not driver:
        return None
    index = int(tagged.group(1)) if tagged else _int_after(line, "[Card")
    return Match("cambricon_fault", "cambricon", escalate(line, "warning"), find_bdf(line), index)


_RULES: tuple[Callable[[str], Match | None], ...] = (
    _selftest,
    _sxid,
    _xid,
    _fallen,
    _aer_bus_error,
    _aer_received,
    _hygon,
    _ascend,
    _cambricon,
)


def match_line(line: str) -> Match | None:
    """The first rule that recognises the line, or None."""
    text = line.rstrip("\r\n")
    if not text.strip():
        return None
    for rule in _RULES:
        found = rule(text)
        if found is not None:
            return found
    return None


def classify(line: str, *, ts_ns: int = 0, source: Source = "kmsg") -> ProbeEvent | None:
    """A ProbeEvent for a known driver/PCIe fault line, else None. Never raises."""
    if not isinstance(line, str):
        return None
    found = match_line(line)
    if found is None:
        return None
    return ProbeEvent(
        v=CONTRACT_VERSION,
        source=source,
        kind=found.kind,
        vendor=found.vendor,
        pci_bus_id=found.pci_bus_id,
        device_index=found.device_index,
        code=found.code,
        severity=found.severity,
        message=line.rstrip("\r\n"),
        ts_ns=ts_ns,
        evidence=dict(found.evidence),
    )


# --- /dev/kmsg records ------------------------------------------------------

_HEX_ESCAPE = re.compile(rb"\\x([0-9a-fA-F]{2})")


@dataclass(frozen=True)
class KmsgRecord:
    """One /dev/kmsg record (Documentation/ABI/testing/dev-kmsg)."""

    facility: int
    level: int
    seq: int
    ts_usec: int
    flags: str
    message: str
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def pci_bus_id(self) -> str | None:
        """The ``DEVICE=+pci:...`` dictionary entry, when the kernel gave one."""
        device = self.fields.get("DEVICE", "")
        return find_bdf(device) if device.startswith("+pci:") else None


def _unescape(message: str) -> str:
    """Undoes the kernel's ``\\xNN`` escaping of non-printable bytes."""
    raw = message.encode("utf-8", "surrogateescape")
    return _HEX_ESCAPE.sub(lambda m: bytes([int(m.group(1), 16)]), raw).decode("utf-8", "replace")


def _parse_prefix(prefix: str) -> tuple[int, int, int, str] | None:
    parts = prefix.split(",")
    if len(parts) < 4 or not all(_DIGITS.fullmatch(p) for p in parts[:3]):
        return None
    return int(parts[0]), int(parts[1]), int(parts[2]), parts[3]


def parse_kmsg_record(raw: str | bytes) -> KmsgRecord | None:
    """Parses ``pri,seq,ts_usec,flags[,..];message`` (+ `` KEY=value`` lines); None if garbled."""
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    head, sep, rest = text.partition(";")
    prefix = _parse_prefix(head) if sep else None
    if prefix is None:
        return None
    pri, seq, ts_usec, flags = prefix
    message, *extra = rest.rstrip("\n").split("\n")
    fields: dict[str, str] = {}
    for line in extra:
        key, eq, value = line[1:].partition("=")
        if line.startswith(" ") and eq:
            fields[key] = value
    return KmsgRecord(
        facility=pri >> 3,
        level=pri & 7,
        seq=seq,
        ts_usec=ts_usec,
        flags=flags,
        message=_unescape(message),
        fields=fields,
    )


def split_kmsg_records(chunk: str) -> list[str]:
    """Splits text holding several records (a saved kmsg dump) into records."""
    records: list[str] = []
    for line in chunk.splitlines():
        if line.startswith(" ") and records:
            records[-1] += "\n" + line
        elif line.strip():
            records.append(line)
    return records


def classify_kmsg_record(record: KmsgRecord) -> ProbeEvent | None:
    """classify() on the record's message, with kmsg timestamp and DEVICE= bus id."""
    event = classify(record.message, ts_ns=record.ts_usec * 1000, source="kmsg")
    if event is None:
        return None
    evidence = {**event.evidence, "kmsg_seq": record.seq, "kmsg_level": record.level}
    bus = event.pci_bus_id or record.pci_bus_id
    return msgspec.structs.replace(event, pci_bus_id=bus, evidence=evidence)
