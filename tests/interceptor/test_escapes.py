"""The escape suite: one small C program per way around the quota
(interceptor_c/tests/escapes/*.c). Each tries to hold more than its 1 GiB
slice through one path and prints what the driver held and what the ledger
saw. Every path must be blocked (the driver never held more than the quota)
and counted (whatever the driver still holds shows in the quota view),
except the ones listed as the node-side backstop's job."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from .conftest import BUILD, SRC, Env, GiB, parse

# name -> what the result line must also say
BLOCKED: dict[str, dict[str, str]] = {
    "cu_alloc": {},
    "cu_alloc_v1": {},
    "cu_managed": {},
    "cu_pitch": {},
    "cu_arrays": {},
    "cu_async": {},
    "cu_pool_retained": {"second": "2"},
    "cu_vmm_release_mapped": {},
    "cu_graph_memnode": {},
    "gpa_old_version": {},
    "gpa_internal_entry": {},
    "dlsym_dlopen": {},
    "rt_malloc": {},
    "hip_paths": {},
    "hip_vmm_release_mapped": {"second": "2"},
    "acl_paths": {},
    "cnrt_paths": {},
    "fork_child": {"child_ok": "0"},
    "child_without_quota": {"child_ok": "0"},
    "kill9_loop": {"full": "0"},
    "pid_namespaces": {"first_ok": "1", "second_ok": "0"},
    "file_other_user": {"opened": "0"},
}
# In-process doors no LD_PRELOAD library can close: the process reaches the
# driver's own entry points. agents/backstopping.py catches them on the node.
BACKSTOP = {"dlsym_real"}
# Programs whose processes must share the stub driver's physical counters.
SHARED_DRIVER = {"fork_child", "child_without_quota", "pid_namespaces"}


def test_every_escape_program_has_an_expected_verdict() -> None:
    programs = {p.stem for p in (SRC / "tests" / "escapes").glob("*.c")}
    assert programs == set(BLOCKED) | BACKSTOP


def run_escape(vram: Env, name: str) -> dict[str, str]:
    env = {}
    if name in SHARED_DRIVER:
        env["STUB_SHM_PATH"] = str(vram.tmp_path / "driver.shm")
    # another user must be able to reach the file for its mode to matter
    # (pytest's own temporary directories are private)
    public = Path(tempfile.mkdtemp(prefix="hcs-escape-"))
    public.chmod(0o755)
    if name == "file_other_user":
        env["HCS_SHM_PATH"] = str(public / "vram.shm")
    try:
        proc = subprocess.run(
            [str(BUILD / "escapes" / name)],
            env=vram.env(**env),
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        shutil.rmtree(public)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    last = parse(proc.stdout)[-1]
    if last["op"] == "skip":
        pytest.skip(proc.stdout.strip())
    assert last["op"] == "result", proc.stdout
    return last


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_escape_path_is_blocked_and_counted(vram: Env, name: str) -> None:
    result = run_escape(vram, name)
    assert int(result["quota"]) == GiB
    assert int(result["peak"]) <= GiB, f"{name}: the driver held more than the quota"
    assert int(result["seen"]) >= int(result["held"]), f"{name}: held memory not in the ledger"
    for key, value in BLOCKED[name].items():
        assert result[key] == value, (name, key, result)


@pytest.mark.parametrize("name", sorted(BACKSTOP))
def test_in_process_doors_are_left_to_the_node_side_backstop(vram: Env, name: str) -> None:
    # kept honest: if one of these ever gets blocked, move it to BLOCKED
    result = run_escape(vram, name)
    assert int(result["peak"]) > GiB
