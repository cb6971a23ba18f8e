"""A newcomer's first minutes with ``hcs up``: it starts whatever ports other
programs hold, every other ``hcs`` command finds it through the context file,
a port asked for and taken is one line naming its flag, and when it stops it
says where it ran, what happened and where its logs stay."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcs_bus.natsserver import NatsServer, free_port
from tests.cli.running import CEILING_S, HCS, hcs

USUAL_PORTS = (8888, 8443, 8889, 4222)  # extender, webhook, console, NATS


@contextlib.contextmanager
def _listening(ports: tuple[int, ...]) -> Iterator[None]:
    """Other programs listening on ``ports`` (one already in use is taken anyway)."""
    held = []
    for port in ports:
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            sock.close()
            continue
        held.append(sock)
    try:
        yield
    finally:
        for sock in held:
            sock.close()


def _env(context: Path) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("HCS_", "NATS_"))}
    return {**base, "HCS_CONTEXT": str(context)}


def _wait_for(path: Path, proc: subprocess.Popen[str], *, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"hcs up exited early: {proc.communicate()}"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.1)


def _port(url: str) -> int:
    found = re.search(r":(\d+)(/|$)", url)
    assert found, url
    return int(found.group(1))


def test_up_takes_free_ports_when_the_usual_ones_are_taken_and_top_finds_it(tmp_path: Path) -> None:
    context = tmp_path / "context.json"
    with _listening(USUAL_PORTS):
        up = subprocess.Popen(
            [HCS, "up", "--for", "60", "--no-demo-job"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(context),
        )
        try:
            _wait_for(context, up, timeout_s=30)
            found = json.loads(context.read_text())
            assert oct(context.stat().st_mode & 0o777) == "0o600"  # it holds the console token
            ports = {
                _port(found[k]) for k in ("bus_url", "extender_url", "webhook_url", "console_url")
            }
            assert len(ports) == 4 and not ports & set(USUAL_PORTS), found
            assert (
                found["console_token"]
                and f"token={found['console_token']}" in (found["console_url"])
            )
            # no --nats-url: `hcs top` reads the context
            deadline = time.monotonic() + 30  # the agents report within seconds of starting
            while True:
                top = hcs("top", "--once", env={"HCS_CONTEXT": str(context)}, timeout_s=60)
                assert top.code == 0, top.err
                if re.search(r"^FLEET  nodes 6  devices 48/48 healthy", top.out, re.M):
                    break
                assert time.monotonic() < deadline, top.out
                time.sleep(0.5)
        finally:
            up.send_signal(signal.SIGINT)
            out, err = up.communicate(timeout=60)
    assert up.returncode == 0, err[-3000:]
    assert not context.exists(), "the context outlived hcs up"
    *_, stopped, nats, console, logs = out.strip().splitlines()
    assert re.fullmatch(
        r"hcs up: stopped after \d+ s: faults \d+, verdicts \d+, actions \d+, "
        r"moves \d+, checkpoints \d+",
        stopped,
    ), stopped
    assert nats.startswith(f"hcs up: NATS {found['bus_url']} | extender"), nats
    assert console.startswith(f"hcs up: console {found['console_url']} "), console
    assert logs == f"hcs up: logs kept in {found['logs']}"
    kept = Path(found["logs"])
    assert {p.name for p in kept.iterdir()} >= {f"{n}.log" for n in ("agents", "scheduler")}
    assert kept.is_relative_to(Path(os.environ["XDG_STATE_HOME"]) / "hcs" / "logs")


@pytest.mark.parametrize("flag", ["--extender", "--webhook", "--console"])
def test_a_port_asked_for_and_taken_is_one_line_naming_its_flag(flag: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        done = hcs("up", "--for", "60", "--no-demo-job", flag, f"127.0.0.1:{busy}")
    assert done.code == 2, done.err
    assert done.seconds < CEILING_S, done.seconds
    [line] = done.err_lines
    assert line.startswith(f"hcs: error: hcs up: {flag} 127.0.0.1:{busy}: "), line
    assert "in use" in line and f"give {flag} another HOST:PORT" in line, line


def test_a_part_that_dies_stops_the_stack_with_its_reason_and_last_log_lines(
    tmp_path: Path,
) -> None:
    context = tmp_path / "context.json"
    up = subprocess.Popen(
        [HCS, "up", "--for", "90", "--no-demo-job"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=_env(context),
    )
    try:
        _wait_for(context, up, timeout_s=30)
        children = subprocess.run(
            ["ps", "-o", "pid=,args=", "--ppid", str(up.pid)], capture_output=True, text=True
        ).stdout
        injector = next(line for line in children.splitlines() if "-m injector" in line)
        os.kill(int(injector.split()[0]), signal.SIGKILL)
        _, err = up.communicate(timeout=60)
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert up.returncode == 1, err[-3000:]
    said = err[err.index("hcs up: part injector exited with code -9") :]
    _, *rest = said.splitlines()
    assert rest[0] == "last lines of its log:" and len(rest) > 1, said
    assert "Traceback" not in err


def test_a_server_without_hcs_streams_is_said_to_be_no_hcs_bus() -> None:
    bare = NatsServer().start()
    try:
        for command in (("top", "--once"), ("watch", "--last", "3")):
            done = hcs("--nats-url", bare.url, *command, timeout_s=60)
            assert done.code == 1, done.err
            [line] = done.err_lines
            assert f"NATS at {bare.url} is not an HCS bus" in line, line
            assert "bus init" not in line
    finally:
        bare.cleanup()


def test_a_stale_context_is_ignored(tmp_path: Path) -> None:
    """hcs up killed outright leaves its context; no command follows it."""
    context = tmp_path / "context.json"
    gone = subprocess.Popen(["true"])
    gone.wait()
    url = f"nats://127.0.0.1:{free_port()}"
    context.write_text(json.dumps({"bus_url": url, "pid": gone.pid, "started": "then"}))
    done = hcs("top", "--once", "--connect-timeout", "1", env={"HCS_CONTEXT": str(context)})
    assert done.code == 1
    assert url not in done.err, done.err  # the default bus, not the dead stack's
