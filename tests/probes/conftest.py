"""Fixtures for the probe tests: eBPF build, root check, fake sysfs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.probes.helpers import APT_PACKAGES, EBPF_DIR, FakeSysfs


def _tool_missing(name: str) -> bool:
    return shutil.which(name) is None and not Path("/usr/sbin", name).exists()


@pytest.fixture(scope="session")
def hcs_probe_binary() -> Path:
    """Builds ebpf/ with make (BPF objects, skeleton, loader); fails naming missing tools."""
    missing = [t for t in ("clang", "bpftool", "make", "cc") if _tool_missing(t)]
    if not Path("/usr/include/bpf/libbpf.h").exists():
        missing.append("libbpf-dev")
    if missing:
        pytest.fail(
            f"eBPF build tools missing: {', '.join(missing)} (apt-get install -y {APT_PACKAGES})"
        )
    done = subprocess.run(
        ["make", "-C", str(EBPF_DIR)], capture_output=True, text=True, timeout=300, check=False
    )
    if done.returncode != 0:
        pytest.fail(f"make -C ebpf failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    binary = EBPF_DIR / "build" / "hcs-probe"
    assert binary.exists(), "make -C ebpf did not produce ebpf/build/hcs-probe"
    return binary


@pytest.fixture
def needs_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("loading BPF programs and writing /dev/kmsg need root (CAP_BPF, CAP_SYSLOG)")


@pytest.fixture
def fake_sysfs(tmp_path: Path) -> FakeSysfs:
    return FakeSysfs(tmp_path / "sys")
