"""``bench.cpucap``: a process held to a share of a core is stopped by the
kernel once it has used it, and let go again on ``close``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.cpucap import CapError, CpuCap
from tests.e2e.api import wait_for

SPIN = "while True: pass"


def cgroup_of(pid: int) -> str:
    return Path(f"/proc/{pid}/cgroup").read_text()


def test_a_spinning_process_is_throttled_in_its_cgroup_and_let_go_on_close() -> None:
    child = subprocess.Popen([sys.executable, "-c", SPIN])
    try:
        try:
            cap = CpuCap(child.pid, 0.05)
        except CapError as exc:
            pytest.skip(f"no writable CPU cgroup here (needs root): {exc}")
        try:
            assert cap.dir.name in cgroup_of(child.pid)
            wait_for(lambda: cap.throttled() >= 3, what="the spinner throttled", timeout_s=30)
        finally:
            cap.close()
        assert cap.dir.name not in cgroup_of(child.pid)
        assert not cap.dir.exists()
        assert child.poll() is None  # held back, never stopped for good
    finally:
        child.kill()
        child.wait()


@pytest.mark.parametrize("cores", [0.0, -1.0, 100.0])
def test_a_share_no_core_can_give_is_refused_with_the_number(cores: float) -> None:
    with pytest.raises(CapError, match=f"cores {cores}"):
        CpuCap(1, cores)


def test_a_host_without_a_cpu_controller_is_named(tmp_path: Path) -> None:
    with pytest.raises(CapError, match=f"no CPU cgroup controller mounted under {tmp_path}"):
        CpuCap(1, 0.5, root=tmp_path)
