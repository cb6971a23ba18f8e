"""Start a local ``nats-server -js`` on a free port with a temporary store.

Used by ``hcs up`` (the embedded default), the tests and the benchmarks; the
binary comes from PATH (or ``NATS_SERVER_BIN``).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from hcs_bus.errors import ConfigError

PORT_FLOOR = 10000
_given: set[int] = set()  # ports handed out by this process


def free_port() -> int:
    """A port free on every address, below the kernel's ephemeral range: a
    port the kernel hands out (bind to 0) is one any outgoing connection may
    take before the server it was picked for listens on it (a hollow kubelet
    of bench.burst died of "address already in use" that way). Never the
    same port twice in one process: fifty kubelets started at once each get
    their own before any listens."""
    low = _ephemeral_low()
    for _ in range(200):
        port = random.randint(PORT_FLOOR, low - 1) if low - 1 > PORT_FLOOR else 0
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
            found = int(sock.getsockname()[1])
        if found not in _given:
            _given.add(found)
            return found
    raise OSError("no free port below the ephemeral range")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0  # unknown: let the kernel pick


def binary() -> str:
    found = os.environ.get("NATS_SERVER_BIN") or shutil.which("nats-server")
    if not found:
        raise ConfigError("nats-server not found on PATH (set NATS_SERVER_BIN or install it)")
    return found


@dataclass
class NatsServer:
    """A nats-server process owned by this process."""

    port: int = 0
    store_dir: Path | None = None
    config_file: Path | None = None
    extra_args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    log_tail: deque[str] = field(default_factory=lambda: deque(maxlen=200))
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, *, timeout_s: float = 10.0) -> NatsServer:
        if not self.port:
            self.port = free_port()
        if self.store_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hcs-nats-")
            self.store_dir = Path(self._tmp.name)
        args = [
            binary(),
            "-a",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-js",
            "-sd",
            str(self.store_dir),
        ]
        if self.config_file:
            args += ["-c", str(self.config_file)]
        self.process = subprocess.Popen(
            [*args, *self.extra_args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        self._wait_listening(timeout_s)
        threading.Thread(target=self._drain_log, name="nats-server-log", daemon=True).start()
        return self

    def _drain_log(self) -> None:
        """Read the server's log as it writes it, keeping the last lines: a
        pipe nobody reads fills (64 KiB of permission violations, say) and
        the server then blocks on its next log line, every client with it."""
        out = self.process.stderr if self.process else None
        if out is None:
            return
        try:
            for line in out:
                self.log_tail.append(line.decode(errors="replace").rstrip())
        except (ValueError, OSError):  # closed by stop()
            return

    def _wait_listening(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                raise ConfigError(f"nats-server exited at start: {err.strip()[-500:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.05)
        raise ConfigError(f"nats-server did not listen on {self.port} within {timeout_s}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process and self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def cleanup(self) -> None:
        self.stop()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def astart(self) -> NatsServer:
        return await asyncio.to_thread(self.start)
