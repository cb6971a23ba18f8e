"""Child processes of the test cluster: started in their own session with a log
file each, stopped with SIGTERM then SIGKILL (whole process group), and a
failure that names the binary and the last lines of its log."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
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
        self.env, self.cwd = env, cwd
        logs.mkdir(parents=True, exist_ok=True)
        self.log = logs / f"{name}.log"
        with self.log.open("ab") as out:
            self.log_from = out.tell()  # where this run's lines begin
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

    def again(self) -> Process:
        """The same command started anew, logging on into the same file."""
        return Process(self.name, self.argv, logs=self.log.parent, env=self.env, cwd=self.cwd)

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


# kubemark's hollow kubelet (v1.26) runs containers on a fake OS whose file
# map has no lock: two containers started at once can crash the whole
# kubelet (seen in bench.burst with 40 pods starting on one node). A bug of
# the test double, not of the kubelet: such a death is restarted.
FAKE_OS_RACE = re.compile(
    r"fatal error: concurrent map (?:writes|read and map write)\s+"
    r"goroutine \d+ \[running\]:\s+\S*kubelet/container/testing\.\(\*FakeOS\)"
)


def died_of_fake_os_race(process: Process) -> bool:
    """Whether ``process`` exited and its log ends with kubemark's fake-OS map race."""
    if process.alive:
        return False
    try:
        with process.log.open("rb") as log:
            log.seek(process.log_from)
            lines = log.read().decode(errors="replace")  # this run's (a Go crash dumps
    except OSError:  # every goroutine after the one that crashed: read it all)
        return False
    crash = lines.find("fatal error:")
    return crash >= 0 and FAKE_OS_RACE.match(lines, crash) is not None


class Revive(threading.Thread):
    """Watches ``processes`` (name -> process, replaced in place) and starts
    again each one that ``revivable`` says died of a known test-double bug,
    recording it in ``revived``; any other death is left for the caller to
    see. ``replaced(old, new)`` hears of each restart."""

    def __init__(
        self,
        processes: dict[str, Process],
        *,
        revivable: Callable[[Process], bool] = died_of_fake_os_race,
        replaced: Callable[[Process, Process], None] = lambda _old, _new: None,
        every_s: float = 0.5,
    ) -> None:
        super().__init__(daemon=True, name="revive")
        self.processes, self.revivable, self.replaced = processes, revivable, replaced
        self.every_s = every_s
        self.revived: list[str] = []
        self.stopping = threading.Event()
        self._judged: set[int] = set()  # dead of something else: left as they are

    def run(self) -> None:
        while not self.stopping.wait(self.every_s):
            for name, process in list(self.processes.items()):
                if self.stopping.is_set() or process.alive or id(process) in self._judged:
                    continue
                if not self.revivable(process):
                    self._judged.add(id(process))
                    continue
                fresh = process.again()
                self.processes[name] = fresh
                self.replaced(process, fresh)
                self.revived.append(name)
                print(f"{name} died of kubemark's fake-OS map race; started again", file=sys.stderr)

    def stop(self) -> None:
        self.stopping.set()
        if self.is_alive():
            self.join(timeout=5)
