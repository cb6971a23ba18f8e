"""Helpers shared by the probe tests: paths, recorded fixtures, a fake /sys."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
EBPF_DIR = REPO / "ebpf"
FIXTURES = Path(__file__).resolve().parent / "fixtures"
APT_PACKAGES = "clang llvm libbpf-dev bpftool libelf-dev zlib1g-dev make gcc pkg-config"


def load_line_cases() -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FIXTURES / "kernel_lines.json").read_text("utf-8"))
    return data


class FakeSysfs:
    """A /sys tree with PCI devices placed under their upstream ports."""

    def __init__(self, root: Path) -> None:
        self.root = root
        (root / "bus" / "pci" / "devices").mkdir(parents=True)

    def add(self, *chain: str, vendor: int = 0x8086, aer: bool = True) -> Path:
        """Adds the last BDF of chain under pci0000:xx/<chain...> and links it."""
        path = self.root / "devices" / f"pci{chain[0][:7]}"
        for bdf in chain:
            path = path / bdf
        path.mkdir(parents=True, exist_ok=True)
        (path / "vendor").write_text(f"0x{vendor:04x}\n")
        if aer:
            for name in ("aer_dev_correctable", "aer_dev_nonfatal", "aer_dev_fatal"):
                self.set(path, name)
        link = self.root / "bus" / "pci" / "devices" / chain[-1]
        if not link.exists():
            link.symlink_to(os.path.relpath(path, link.parent))
        return path

    @staticmethod
    def set(device: Path, name: str, **counters: int) -> None:
        base = {
            "aer_dev_correctable": ("RxErr", "BadTLP", "BadDLLP", "Timeout"),
            "aer_dev_nonfatal": ("DLP", "CmpltTO", "UnsupReq"),
            "aer_dev_fatal": ("DLP", "SDES", "MalfTLP"),
        }[name]
        total_name = {
            "aer_dev_correctable": "TOTAL_ERR_COR",
            "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
            "aer_dev_fatal": "TOTAL_ERR_FATAL",
        }[name]
        values = {k: counters.get(k, 0) for k in base}
        lines = [f"{k} {v}" for k, v in values.items()]
        lines.append(f"{total_name} {sum(values.values())}")
        (device / name).write_text("\n".join(lines) + "\n")


def write_kmsg(message: str, *, level: int = 6) -> None:
    """Writes one line into the kernel log (root only)."""
    with open("/dev/kmsg", "w") as kmsg:
        kmsg.write(f"<{level}>{message}\n")
