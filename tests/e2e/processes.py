"""Child processes of the test cluster: started in their own session with a log
file each, stopped with SIGTERM then SIGKILL (whole process group), and a
failure that names the binary and the last lines of its log."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path


class ClusterError(RuntimeError):
    """A component of the test cluster failed to start or died."""


def tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


class Process:
    """One running component with its log file."""

    def __init__(
        self,
        name: str,
        argv: list[str],
        *,
        logs: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = argv
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"{name}.log"
        with self.log.open("ab") as out:
            try:
                self.popen = subprocess.Popen(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                    cwd=cwd,
                    start_new_session=True,
                )
            except OSError as exc:
                raise ClusterError(f"{name}: cannot start {argv[0]}: {exc}") from exc

    @property
    def alive(self) -> bool:
        return self.popen.poll() is None

    def failure(self, what: str) -> ClusterError:
        code = self.popen.poll()
        state = "running" if code is None else f"exited with {code}"
        return ClusterError(
            f"{self.name} ({self.argv[0]}) {what}; it is {state}. Last lines of {self.log}:\n"
            + tail(self.log)
        )

    def wait_until(self, check: Callable[[], bool], *, what: str, timeout_s: float) -> None:
        """Poll ``check`` until true; fail naming this binary when it dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        delay = 0.05
        while True:
            if not self.alive:
                raise self.failure(f"died before {what}")
            with contextlib.suppress(Exception):
                if check():
                    return
            if time.monotonic() > deadline:
                raise self.failure(f"not {what} within {timeout_s:.0f} s")
            time.sleep(delay)
            delay = min(delay * 1.5, 0.5)

    def stop(self, *, grace_s: float = 10.0) -> None:
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait(timeout=10)

    def kill(self) -> None:
        """``kill -9`` the whole process group (crash tests). Not once reaped:
        its id, and so its group's, may then be another process's."""
        if self.popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(timeout=10)


def why_dead(processes: Iterable[Process]) -> str:
    """Each process that is not running, its exit status and last log lines
    (for failure messages); "" when all run."""
    return "\n".join(str(p.failure("stopped")) for p in processes if not p.alive)


def stop_all(processes: list[Process]) -> None:
    """SIGTERM everyone at once, then wait: tear-down in seconds, not N × grace."""
    for p in processes:
        if p.alive:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.popen.pid, signal.SIGTERM)
    for p in processes:
        p.stop(grace_s=8.0)
