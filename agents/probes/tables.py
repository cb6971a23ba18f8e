"""Static lookup tables (pure): Xid severity, accelerator vendor ids.

The Xid table is the one in ``hcs_bus.vocabulary`` (``hcs_bus/data/xids.json``),
which the healer classifies by too. The eBPF loader is compiled from its
projection ``xid_severity.json`` next to this module (``ebpf/Makefile``); a test
keeps the projection equal to the table, so every reader gives the same answer.
"""

from __future__ import annotations

from typing import Final

from agents.probes.events import Severity, Vendor
from hcs_bus import vocabulary

XID_FATAL: Final = vocabulary.XID_FATAL
XID_INFO: Final = vocabulary.XID_INFO

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
    """Severity of an NVIDIA Xid code, from the one table."""
    return vocabulary.xid_severity(code)


def vendor_of_pci_id(vendor_id: int) -> Vendor | None:
    return PCI_VENDORS.get(vendor_id)


def vendor_of_driver(line: str) -> Vendor | None:
    for prefix, vendor in DRIVER_PREFIXES:
        if line.startswith(prefix):
            return vendor
    return None
