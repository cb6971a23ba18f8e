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

# a Go program's crash: its first line and the first frames of its goroutine
CRASH = re.compile(r"^(?:fatal error|panic): .*(?:\n.*){0,8}", re.MULTILINE)


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

    def this_run(self) -> str:
        """What this run has logged ("" when the log cannot be read)."""
        try:
            with self.log.open("rb") as log:
                log.seek(self.log_from)
                return log.read().decode(errors="replace")
        except OSError:
            return ""

    def failure(self, what: str) -> ClusterError:
        code = self.popen.poll()
        state = "running" if code is None else f"exited with {code}"
        crash = CRASH.search(self.this_run())  # a Go crash's head is far above its log's
        head = f"It crashed:\n{crash.group(0)}\n" if crash else ""  # end (every frame after it)
        return ClusterError(
            f"{self.name} ({self.argv[0]}) {what}; it is {state}. {head}"
            f"Last lines of {self.log}:\n" + tail(self.log)
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
# the test double, not of the kubelet: such a death is restarted. Its mark:
# every fatal error a concurrent map access, and the goroutine that crashed
# (the first one "running") in FakeOS. Two goroutines that catch the race at
# once each print their header, anywhere in the other's traceback (CI saw
# such a crash left for dead), so the headers are taken out first.
FATAL = re.compile(r"fatal error: ([^\n]*)\n")
RUNNING = re.compile(r"goroutine \d+ \[running\]:\s+(\S+)")
FAKE_OS_FRAME = re.compile(r"\S*kubelet/container/testing\.\(\*FakeOS\)\.")


def died_of_fake_os_race(process: Process) -> bool:
    """Whether ``process`` exited and this run's log holds kubemark's fake-OS map race."""
    if process.alive:
        return False
    lines = process.this_run()  # all of it: a Go crash may dump every goroutine after its own
    fatal = FATAL.findall(lines)
    if not fatal or not all(f.startswith("concurrent map ") for f in fatal):
        return False
    running = RUNNING.search(FATAL.sub("", lines))
    return running is not None and FAKE_OS_FRAME.match(running.group(1)) is not None


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
