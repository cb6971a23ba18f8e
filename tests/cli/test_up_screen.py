"""``hcs up`` on a real terminal (a pseudo-terminal of 80×24): the live
screen is drawn, no log line runs across it, and a part's failure is still
told after the screen is gone."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time
from collections.abc import Callable

from tests.cli.running import HCS

LEAVE_SCREEN = "\x1b[?1049l"  # the terminal's own screen again (rich's Live(screen=True))


def _stop(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)


def _run_on_terminal(
    *args: str, timeout_s: float, until: str = "", then: Callable[[int], None] = _stop
) -> tuple[int, str]:
    """Run ``hcs ARGS`` on a terminal; once ``until`` is on screen, call ``then``
    with its process id (by default: stop it with SIGTERM)."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: a terminal of 80 columns and 24 rows
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HCS_", "NATS_"))}
        env["TERM"] = "xterm"
        os.execve(HCS, [HCS, *args], env)
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if not ready:
            continue
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
        if until and until in out.decode(errors="replace"):
            then(pid)
            until = ""
    else:
        os.kill(pid, 9)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), out.decode(errors="replace")


def test_the_live_screen_is_drawn_without_log_lines_across_it() -> None:
    code, screen = _run_on_terminal(
        "up", "--for", "120", "--no-demo-job", timeout_s=150, until="nodes 6  devices 48"
    )
    assert code == 0, screen[-2000:]
    assert "nodes 6  devices 48" in screen, screen[-2000:]
    assert '"event"' not in screen, screen[-2000:]  # no JSON log line on the terminal
    # under the screen, once it is gone: what happened, where it ran, where its logs stay
    after = screen[screen.rindex(LEAVE_SCREEN) :]
    for told in ("hcs up: stopped after", "hcs up: NATS nats://", "hcs up: console http://"):
        assert told in after, after
    assert "hcs up: logs kept in " in after, after


def _kill_the_injector(up: int) -> None:
    children = subprocess.run(
        ["ps", "-o", "pid=,args=", "--ppid", str(up)], capture_output=True, text=True
    ).stdout
    injector = next(line for line in children.splitlines() if "-m injector" in line)
    os.kill(int(injector.split()[0]), signal.SIGKILL)


def test_a_failing_part_is_told_after_the_screen_is_gone() -> None:
    code, screen = _run_on_terminal(
        "up", "--for", "60", "--no-demo-job", timeout_s=90,
        until="nodes 6  devices 48", then=_kill_the_injector,
    )  # fmt: skip
    assert code == 1, screen[-2000:]
    after = screen[screen.rindex(LEAVE_SCREEN) :]
    told = after[after.index("hcs up: part injector exited") :]
    assert told.splitlines()[0].startswith("hcs up: part injector exited with code -9"), told
