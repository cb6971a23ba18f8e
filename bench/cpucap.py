"""Hold one process to a share of one core: the benchmarks' overloaded replica.

A CPU cgroup of its own (cgroup v2 ``cpu.max``, else v1's
``cpu.cfs_quota_us``), made under the mounted hierarchy, the process moved
in, moved back out and the cgroup removed on ``close``. The kernel then lets
the process run ``cores`` × 100 ms of each 100 ms period and stops it for the
rest: it falls behind under a burst as a replica short of CPU would. Needs
root and a mounted CPU controller; anything missing is a ``CapError`` that
names it.
"""

from __future__ import annotations

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")
PERIOD_US = 100_000


class CapError(Exception):
    """The cap cannot be set here (why, in one line)."""


class CpuCap:
    """``pid`` held to ``cores`` of a core until ``close``."""

    def __init__(self, pid: int, cores: float, *, root: Path = CGROUP) -> None:
        if not 0.01 <= cores <= 64:
            raise CapError(f"cores {cores}: want 0.01 to 64")
        self.pid, self.cores = pid, cores
        quota = max(1000, round(cores * PERIOD_US))
        v2 = root / "cgroup.controllers"
        if v2.exists():
            if "cpu" not in v2.read_text().split():
                raise CapError(f"cgroup v2 at {root} has no cpu controller")
            self.parent, self.version = root, 2
            self.dir = root / f"hcs-bench-{os.getpid()}-{pid}"
            self._write(root / "cgroup.subtree_control", "+cpu")
            self._make()
            self._write(self.dir / "cpu.max", f"{quota} {PERIOD_US}")
        elif (root / "cpu" / "cpu.cfs_quota_us").exists():
            self.parent, self.version = root / "cpu", 1
            self.dir = self.parent / f"hcs-bench-{os.getpid()}-{pid}"
            self._make()
            self._write(self.dir / "cpu.cfs_period_us", str(PERIOD_US))
            self._write(self.dir / "cpu.cfs_quota_us", str(quota))
        else:
            raise CapError(f"no CPU cgroup controller mounted under {root}")
        try:
            self._write(self.dir / "cgroup.procs", str(pid))
        except CapError:
            self.dir.rmdir()
            raise

    def _make(self) -> None:
        try:
            self.dir.mkdir()
        except OSError as exc:
            raise CapError(f"cannot make cgroup {self.dir}: {exc.strerror or exc}") from exc

    @staticmethod
    def _write(path: Path, text: str) -> None:
        try:
            path.write_text(text)
        except OSError as exc:
            raise CapError(f"cannot write {text!r} to {path}: {exc.strerror or exc}") from exc

    def throttled(self) -> int:
        """Periods the process was stopped in for having used its share."""
        for line in (self.dir / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "nr_throttled":
                return int(value)
        return 0

    def close(self) -> None:
        """The process moved back (if it still runs) and the cgroup removed."""
        if not self.dir.exists():
            return
        for pid in (self.dir / "cgroup.procs").read_text().split():
            try:
                (self.parent / "cgroup.procs").write_text(pid)
            except OSError:
                pass  # it exited meanwhile
        try:
            self.dir.rmdir()
        except OSError:
            pass  # a process still in it: the directory stays, empty once it exits

    def __str__(self) -> str:
        return f"{self.cores:g} of a core (cgroup v{self.version}, {self.dir})"
