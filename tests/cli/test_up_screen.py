"""``hcs up`` on a real terminal (a pseudo-terminal of 80×24): the live
screen is drawn, no log line runs across it, and a part's failure is still
told after the screen is gone."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import socket
import struct
import termios
import time

from tests.cli.running import HCS


def _run_on_terminal(*args: str, timeout_s: float, until: str = "") -> tuple[int, str]:
    """Run ``hcs ARGS`` on a terminal; once ``until`` is on screen, stop it (SIGTERM)."""
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
            os.kill(pid, signal.SIGTERM)
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


def test_a_failing_part_is_told_after_the_screen_is_gone() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        code, screen = _run_on_terminal(
            "up", "--for", "60", "--no-demo-job", "--webhook", f"127.0.0.1:{busy}", timeout_s=90
        )
    assert code == 1, screen[-2000:]
    told = screen[screen.rindex("hcs up: part injector exited") :]
    assert "address already in use" in told.splitlines()[0].lower(), told
