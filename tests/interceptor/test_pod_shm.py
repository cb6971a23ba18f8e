"""The accounting file in the pod's own /dev/shm (no volume): a tmpfs the
workload fills too, sticky and world-writable, where another user of the pod
may have created the file first."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .conftest import CLI, Env, parse

PROTECTED_REGULAR = Path("/proc/sys/fs/protected_regular")


def test_a_full_tmpfs_leaves_no_file_and_the_quota_is_kept_per_process(vram: Env) -> None:
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "--mount", "--map-root-user", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("unshare --mount needs root or user namespaces, neither is available")
    small = vram.tmp_path / "shm"
    small.mkdir()
    script = f'mount -t tmpfs -o size=64k tmpfs {small} && exec "$@"'
    ops = ["cu.alloc", "700Mi", "cu.alloc", "700Mi"]
    proc = subprocess.run(
        ["unshare", "--mount", "--map-root-user", "sh", "-c", script, "sh", str(CLI), *ops],
        env=vram.env(HCS_SHM_PATH=str(small / "vram.shm"), HCS_INTERCEPTOR_LOG="error"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert "no room for it" in proc.stderr
    assert [int(op["rc"]) for op in parse(proc.stdout)] == [0, 2]  # still enforced


@pytest.fixture
def protected_regular() -> Iterator[None]:
    """fs.protected_regular on for the test, as systemd sets it on most hosts."""
    try:
        before = PROTECTED_REGULAR.read_text()
        PROTECTED_REGULAR.write_text("1")
    except OSError as exc:
        pytest.skip(f"setting fs.protected_regular needs root ({exc.strerror})")
    try:
        yield
    finally:
        PROTECTED_REGULAR.write_text(before)


def test_a_file_another_user_created_in_a_sticky_directory_is_shared(
    vram: Env, protected_regular: None
) -> None:
    shm = vram.tmp_path / "dev-shm"
    shm.mkdir()
    shm.chmod(0o1777)
    ledger = shm / "hcs-vram.shm"
    holder = vram.spawn("cu.alloc", "600Mi", "hold", HCS_SHM_PATH=str(ledger))
    try:
        assert holder.stdout is not None
        for line in holder.stdout:
            if line.startswith("hold"):
                break
        os.chown(ledger, 65534, 65534)  # as if the pod's other user made it
        r = vram.cli("cu.alloc", "600Mi", HCS_SHM_PATH=str(ledger), HCS_INTERCEPTOR_LOG="error")
        assert "open" not in r.stderr, r.stderr
        assert r.op(0)["rc"] == "2", "the second process did not see the first one's 600Mi"
    finally:
        holder.kill()
        holder.wait(timeout=10)
