"""Builds interceptor_c once per session (make) and runs its tools under
LD_PRELOAD with a private accounting file per test."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "interceptor_c"
BUILD = SRC / "build"
LIB = BUILD / "libhcs_interceptor.so"
STUBS = BUILD / "stubs"
CLI = BUILD / "tests" / "hcs_cli"

GiB = 1 << 30
MiB = 1 << 20


@pytest.fixture(scope="session")
def built() -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is not installed: cannot build interceptor_c")
    proc = subprocess.run(["make", "-C", str(SRC), "-j2"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return BUILD


@dataclass
class Result:
    rc: int
    stdout: str
    stderr: str
    lines: list[dict[str, str]] = field(default_factory=list)

    def op(self, index: int) -> dict[str, str]:
        return self.lines[index]

    def ops(self, name: str) -> list[dict[str, str]]:
        return [line for line in self.lines if line["op"] == name]

    def rcs(self) -> list[int]:
        return [int(line["rc"]) for line in self.lines]


def parse(stdout: str) -> list[dict[str, str]]:
    lines = []
    for raw in stdout.splitlines():
        parts = raw.split()
        if not parts:
            continue
        entry = {"op": parts[0]}
        for part in parts[1:]:
            if "=" in part:
                key, value = part.split("=", 1)
                entry[key] = value
        lines.append(entry)
    return lines


class Env:
    """Environment of one test: a fresh accounting file, the stub libraries
    and the interceptor preloaded."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.shm = tmp_path / "vram.shm"
        self.base = {
            k: v for k, v in os.environ.items() if not k.startswith(("HCS_", "STUB_", "CUDA_"))
        }
        self.base.update(
            LD_LIBRARY_PATH=str(STUBS),
            LD_PRELOAD=str(LIB),
            HCS_SHM_PATH=str(self.shm),
            HCS_VRAM_QUOTA="1Gi",
            STUB_TOTAL_BYTES=str(8 * GiB),
        )

    def env(self, **overrides: str | None) -> dict[str, str]:
        env = dict(self.base)
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def cli(self, *ops: object, timeout: float = 60, **overrides: str | None) -> Result:
        proc = subprocess.run(
            [str(CLI), *map(str, ops)],
            env=self.env(**overrides),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, (
            f"hcs_cli failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}"
        )
        return Result(proc.returncode, proc.stdout, proc.stderr, parse(proc.stdout))

    def spawn(self, *ops: object, **overrides: str | None) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [str(CLI), *map(str, ops)],
            env=self.env(**overrides),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(self, code: str, timeout: float = 60, **overrides: str | None) -> Result:
        proc = subprocess.run(
            [sys.executable, "-c", code],
            env=self.env(**overrides),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, (
            f"python probe failed ({proc.returncode}): {proc.stdout}\n{proc.stderr}"
        )
        return Result(proc.returncode, proc.stdout, proc.stderr, parse(proc.stdout))


@pytest.fixture
def vram(built: Path, tmp_path: Path) -> Env:
    return Env(tmp_path)
