"""Every command that talks to NATS answers within seconds, in one line,
when NATS cannot be reached — never a hang, never a traceback."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hcs_bus.natsserver import NatsServer, free_port
from tests.cli.running import CEILING_S, Done, hcs, nats_server_binary

BUS_COMMANDS = [
    ["top", "--once"],
    ["top", "--once", "--json"],
    ["place", "--vram", "16Gi"],
    ["watch", "hcs.health.*"],
    ["bus", "init"],
    ["up", "--no-demo-job"],
    ["usage", "--since", "1h"],
]


def _assert_one_line_failure(done: Done, *, naming: str) -> None:
    assert done.code == 1, (done.code, done.err)
    assert len(done.err_lines) == 1, done.err
    assert naming in done.err, done.err
    assert "Traceback" not in done.err + done.out
    assert done.seconds < CEILING_S, f"took {done.seconds:.1f} s"


@pytest.fixture
def closed_url() -> str:
    """A port nothing listens on."""
    return f"nats://127.0.0.1:{free_port()}"


@pytest.fixture
def silent_url() -> Iterator[str]:
    """A port that accepts connections and never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield f"nats://127.0.0.1:{listener.getsockname()[1]}"


@pytest.fixture
def no_jetstream_url() -> Iterator[str]:
    """A real nats-server started without -js."""
    port = free_port()
    proc = subprocess.Popen(
        [nats_server_binary(), "-a", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def empty_jetstream_url() -> Iterator[str]:
    """A real nats-server -js of its own, on which no stream exists yet."""
    server = NatsServer().start()
    try:
        yield server.url
    finally:
        server.cleanup()


def _wait_listening(port: int) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nats-server never listened on {port}"
            time.sleep(0.05)


@pytest.mark.parametrize("command", BUS_COMMANDS, ids=" ".join)
def test_a_bus_command_on_a_closed_port_fails_in_one_line_within_seconds(
    command: list[str], closed_url: str
) -> None:
    done = hcs("--nats-url", closed_url, *command)
    _assert_one_line_failure(done, naming=closed_url)
    assert "connection refused" in done.err


@pytest.mark.parametrize("command", BUS_COMMANDS[:5], ids=" ".join)
def test_the_nats_url_may_follow_the_command(command: list[str], closed_url: str) -> None:
    done = hcs(*command, "--nats-url", closed_url)
    _assert_one_line_failure(done, naming=closed_url)


def test_the_hint_hcs_up_prints_is_a_command_that_works(closed_url: str) -> None:
    done = hcs("watch", "hcs.health.*", "--nats-url", closed_url)
    _assert_one_line_failure(done, naming=closed_url)


def test_a_server_that_never_answers_is_given_up_on_after_the_connect_timeout(
    silent_url: str,
) -> None:
    done = hcs("top", "--once", "--nats-url", silent_url, "--connect-timeout", "2")
    _assert_one_line_failure(done, naming=silent_url)
    assert "gave up after 2 s" in done.err


def test_a_host_that_does_not_resolve_is_named(closed_url: str) -> None:
    done = hcs("bus", "init", "--nats-url", "nats://no-such-host.invalid:4222")
    _assert_one_line_failure(done, naming="no-such-host.invalid")


@pytest.mark.parametrize("command", [["bus", "init"], ["top", "--once"]], ids=" ".join)
def test_a_nats_without_jetstream_is_told_to_start_with_js(
    command: list[str], no_jetstream_url: str
) -> None:
    done = hcs("--nats-url", no_jetstream_url, *command)
    _assert_one_line_failure(done, naming=no_jetstream_url)
    assert "-js" in done.err


def test_top_on_a_nats_without_hcs_streams_says_it_is_not_an_hcs_bus(
    empty_jetstream_url: str,
) -> None:
    done = hcs("top", "--once", "--nats-url", empty_jetstream_url)
    _assert_one_line_failure(done, naming=empty_jetstream_url)
    assert f"NATS at {empty_jetstream_url} is not an HCS bus" in done.err
    assert "bus init" not in done.err  # it may be someone else's server


@pytest.fixture
def auth_url(tmp_path: Path) -> Iterator[str]:
    """A real nats-server -js that wants user ``hcs`` with password ``s3cret``."""
    port = free_port()
    listen = ["-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path)]
    proc = subprocess.Popen(
        [nats_server_binary(), *listen, "--user", "hcs", "--pass", "s3cret"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_wrong_credentials_are_named_and_the_password_never_printed(auth_url: str) -> None:
    done = hcs("bus", "init", "--nats-url", f"nats://hcs:wrong@{auth_url}")
    _assert_one_line_failure(done, naming=f"nats://hcs:***@{auth_url}")
    assert "Authorization Violation" in done.err
    assert "wrong" not in done.err


def test_the_right_credentials_in_the_url_work(auth_url: str) -> None:
    done = hcs("bus", "init", "--nats-url", f"nats://hcs:s3cret@{auth_url}")
    assert done.code == 0, done.err
    assert "s3cret" not in done.out + done.err
