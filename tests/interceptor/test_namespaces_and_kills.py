"""Processes in different pid namespaces (the containers of one pod) share
one accounting file, and no kill -9 at any instruction leaks quota."""

from __future__ import annotations

import os
import random
import select
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from .conftest import CLI, Env, GiB, MiB, parse

needs_unshare = pytest.mark.skipif(
    shutil.which("unshare") is None, reason="unshare (util-linux) is not installed"
)


def in_namespace(*ops: object, mount_proc: bool = False) -> list[str]:
    """Command line running hcs_cli as pid 1 of a new pid namespace, like a
    container's entrypoint; killing unshare kills it."""
    cmd = ["unshare", "--pid", "--fork", "--kill-child"]
    if mount_proc:
        cmd.append("--mount-proc")
    return [*cmd, str(CLI), *map(str, ops)]


def start(vram: Env, argv: list[str], ready: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        argv, env=vram.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith(ready):
            return proc
    proc.wait(timeout=10)
    raise AssertionError(f"{argv} exited early: {proc.stderr.read() if proc.stderr else ''}")


def kill_namespace(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the namespace's pid 1 and wait until it has exited (its open
    files are closed by then), not just for unshare."""
    children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()
    fds = [os.pidfd_open(int(pid)) for pid in children]
    try:
        proc.send_signal(signal.SIGKILL)
        for fd in fds:
            ready, _, _ = select.select([fd], [], [], 10)
            assert ready, "the namespace's pid 1 outlived unshare"
    finally:
        for fd in fds:
            os.close(fd)
        proc.wait(timeout=10)


def run(vram: Env, argv: list[str]) -> list[dict[str, str]]:
    proc = subprocess.run(argv, env=vram.env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return parse(proc.stdout)


def unshare_works() -> bool:
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--kill-child", "true"], capture_output=True
    )
    return probe.returncode == 0


@pytest.fixture
def namespaces(vram: Env) -> Env:
    if not unshare_works():
        pytest.skip("unshare --pid needs root or user namespaces, neither is available")
    return vram


@needs_unshare
@pytest.mark.parametrize("mount_proc", [False, True])
def test_containers_in_their_own_pid_namespaces_share_one_quota(
    namespaces: Env, mount_proc: bool
) -> None:
    # both run as pid 1 of their namespace: pids mean nothing across them
    first = start(
        namespaces,
        in_namespace("cu.alloc", "768Mi", "hold", mount_proc=mount_proc),
        "hold",
    )
    try:
        lines = run(
            namespaces,
            in_namespace(
                "cu.info", "cu.alloc", "768Mi", "cu.alloc", "256Mi", mount_proc=mount_proc
            ),
        )
        assert int(lines[0]["free"]) == GiB - 768 * MiB
        assert [line["rc"] for line in lines[1:]] == ["2", "0"]
    finally:
        kill_namespace(first)
    # the first container is gone: its usage comes back to the others
    lines = run(namespaces, in_namespace("cu.alloc", "768Mi", "cu.info"))
    assert lines[0]["rc"] == "0"
    assert int(lines[1]["free"]) == GiB - 768 * MiB


@needs_unshare
def test_a_live_container_is_never_reaped_by_another_namespace(namespaces: Env) -> None:
    holders = [
        start(namespaces, in_namespace("cu.alloc", "300Mi", "hold"), "hold") for _ in range(3)
    ]
    try:
        # each newcomer reaps whatever it thinks is dead, then sees all three
        for _ in range(3):
            lines = run(namespaces, in_namespace("cu.info", "cu.alloc", "200Mi"))
            assert int(lines[0]["free"]) == GiB - 900 * MiB
            assert lines[1]["rc"] == "2"
    finally:
        for proc in holders:
            proc.kill()
            proc.wait(timeout=10)


def test_hundreds_of_kills_during_allocation_and_free_leak_nothing(vram: Env) -> None:
    rng = random.Random(13)
    use_ns = shutil.which("unshare") is not None and unshare_works()
    kills = 0
    while kills < 300:
        batch = []
        for i in range(4):
            ops = ("churn", 2)
            ns = use_ns and i == 3
            argv = in_namespace(*ops) if ns else [str(CLI), *map(str, ops)]
            batch.append((start(vram, argv, "churn"), ns))
        for proc, ns in batch:
            # the stimulus: kill at an arbitrary point of the loops
            try:
                proc.wait(timeout=rng.uniform(0.0, 0.01))
            except subprocess.TimeoutExpired:
                pass
            if ns:
                kill_namespace(proc)
            else:
                proc.send_signal(signal.SIGKILL)
        for proc, _ in batch:
            proc.wait(timeout=10)
            assert proc.returncode == -signal.SIGKILL
            kills += 1
    r = vram.cli("cu.info", "cu.alloc", "1Gi", "cu.info")
    assert int(r.op(0)["free"]) == GiB, "quota leaked by killed processes"
    assert r.op(1)["rc"] == "0"
    assert int(r.op(2)["free"]) == 0


def test_accounting_file_is_readable_and_writable_only_by_owner_and_group(vram: Env) -> None:
    vram.cli("cu.alloc", "1Mi")
    mode = vram.shm.stat().st_mode & 0o777
    assert mode & 0o007 == 0, oct(mode)


def test_world_writable_accounting_file_of_ours_is_narrowed(vram: Env) -> None:
    vram.cli("cu.alloc", "1Mi")
    vram.shm.chmod(0o666)
    vram.cli("cu.alloc", "1Mi")
    assert vram.shm.stat().st_mode & 0o007 == 0


def test_world_writable_accounting_file_of_another_user_is_refused(vram: Env) -> None:
    vram.shm.write_bytes(b"")
    vram.shm.chmod(0o666)
    try:
        os.chown(vram.shm, 65534, 65534)
    except PermissionError:
        pytest.skip("changing a file's owner needs root")
    r = vram.cli("cu.alloc", "700Mi", "cu.alloc", "700Mi", HCS_INTERCEPTOR_LOG="error")
    assert "accessible to other users" in r.stderr
    assert r.rcs() == [0, 2]  # still enforced, per process
    assert vram.shm.stat().st_size == 0  # left alone


def test_a_child_without_the_quota_variable_keeps_the_pods_quota(vram: Env) -> None:
    holder = start(vram, [str(CLI), "cu.alloc", "600Mi", "hold"], "hold")
    try:
        r = vram.cli("cu.alloc", "600Mi", "cu.info", HCS_VRAM_QUOTA=None)
        assert r.op(0)["rc"] == "2"
        assert int(r.op(1)["total"]) == GiB
        # nor can a larger value widen it
        r = vram.cli("cu.alloc", "600Mi", HCS_VRAM_QUOTA="8Gi")
        assert r.op(0)["rc"] == "2"
    finally:
        holder.kill()
        holder.wait(timeout=10)
