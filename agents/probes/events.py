"""The probe JSON line contract (pure): one ``ProbeEvent`` object per line."""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import msgspec

Source: TypeAlias = Literal["ebpf", "kmsg", "sysfs-aer", "nvml"]
Vendor: TypeAlias = Literal["nvidia", "huawei", "hygon", "cambricon"]
Severity: TypeAlias = Literal["info", "warning", "critical", "fatal"]
Kind: TypeAlias = Literal[
    "xid",
    "sxid",
    "fallen_off_bus",
    "aer_correctable",
    "aer_nonfatal",
    "aer_fatal",
    "ascend_fault",
    "hygon_fault",
    "cambricon_fault",
    "test_probe",
]
EvidenceValue: TypeAlias = str | int | float

CONTRACT_VERSION: Final = 1


class ProbeEvent(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One health observation from a kernel-level source.

    ``ts_ns`` is the source's own clock (CLOCK_MONOTONIC for eBPF, the kmsg
    timestamp for /dev/kmsg, CLOCK_MONOTONIC at poll time for sysfs).
    """

    v: Literal[1]
    source: Source
    kind: Kind
    vendor: Vendor | None
    pci_bus_id: str | None
    device_index: int | None
    code: int | None
    severity: Severity
    message: str
    ts_ns: int
    evidence: dict[str, EvidenceValue]


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(ProbeEvent)


def encode_line(event: ProbeEvent) -> bytes:
    """The event as one JSON line, newline included."""
    return _ENCODER.encode(event) + b"\n"


def decode_line(line: bytes | str) -> ProbeEvent:
    """Parses one JSON line; raises ``ValueError`` naming what is wrong."""
    data = line.encode("utf-8", "replace") if isinstance(line, str) else line
    data = data.strip()
    if not data:
        raise ValueError("probe line is empty")
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError as exc:
        raise ValueError(f"probe line does not match the contract: {exc}") from exc
    except msgspec.DecodeError as exc:
        raise ValueError(f"probe line is not valid JSON: {exc}") from exc
