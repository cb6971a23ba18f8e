"""Static lookup tables (pure): Xid severity, accelerator vendor ids.

The Xid table lives in ``xid_severity.json`` next to this module; the eBPF
loader is compiled from the same file (``ebpf/Makefile``), so both sides give
the same first estimate. The healer applies its own rules afterwards.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Final

from agents.probes.events import Severity, Vendor


def _load_xid_table() -> tuple[frozenset[int], frozenset[int]]:
    text = resources.files(__package__).joinpath("xid_severity.json").read_text("utf-8")
    raw = json.loads(text)
    return frozenset(int(c) for c in raw["fatal"]), frozenset(int(c) for c in raw["info"])


XID_FATAL, XID_INFO = _load_xid_table()

PCI_VENDORS: Final[dict[int, Vendor]] = {
    0x10DE: "nvidia",
    0x19E5: "huawei",
    0x1D94: "hygon",
    0xCABC: "cambricon",
}

# dev_printk() lines start with the driver name: which vendor it implies.
DRIVER_PREFIXES: Final[tuple[tuple[str, Vendor], ...]] = (
    ("nvidia", "nvidia"),
    ("NVRM", "nvidia"),
    ("amdgpu ", "hygon"),
    ("hydcu ", "hygon"),
    ("hycu ", "hygon"),
    ("devdrv", "huawei"),
    ("[ascend]", "huawei"),
    ("davinci", "huawei"),
    ("cambricon", "cambricon"),
)


def xid_severity(code: int) -> Severity:
    """First-estimate severity of an NVIDIA Xid code."""
    if code in XID_FATAL:
        return "fatal"
    if code in XID_INFO:
        return "info"
    return "warning"


def vendor_of_pci_id(vendor_id: int) -> Vendor | None:
    return PCI_VENDORS.get(vendor_id)


def vendor_of_driver(line: str) -> Vendor | None:
    for prefix, vendor in DRIVER_PREFIXES:
        if line.startswith(prefix):
            return vendor
    return None
