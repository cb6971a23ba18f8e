"""Secrets never reach logs: NATS URLs with credentials are redacted wherever
they are logged, and passwords and tokens in settings are never printed."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator, MutableMapping
from pathlib import Path
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from hcs_bus import bus as bus_module
from hcs_bus.bus import connect
from hcs_bus.errors import BusUnavailable
from hcs_bus.natsserver import NatsServer
from hcs_bus.redacting import redact_event, redact_text, redact_url
from hcs_bus.settings import BusSettings, load, redacted

PASSWORD = "pa55-w0rd-7f3c"
TOKEN = "t0ken-91ab2e"
Logs = list[MutableMapping[str, Any]]


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("nats://hcs:s3cret@bus:4222", "nats://hcs:***@bus:4222"),
        ("nats://t0ken@bus", "nats://***@bus"),
        ("tls://hcs:p@ss@bus:4222", "tls://hcs:***@bus:4222"),
        ("nats://a:b@h1:4222,nats://tok@h2:4222", "nats://a:***@h1:4222,nats://***@h2:4222"),
        ("nats://bus:4222", "nats://bus:4222"),
    ],
)
def test_redact_url_masks_a_password_or_a_token_and_keeps_the_rest(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_credentials_inside_free_text_and_a_parsed_url_are_masked() -> None:
    text = "nats: error from nats://hcs:s3cret@bus:4222, ParseResult(netloc='hcs:s3cret@bus')"
    assert "s3cret" not in redact_text(text)
    assert "hcs:***@bus" in redact_text(text)


def test_settings_never_print_a_password_a_token_or_a_url_s_credentials() -> None:
    settings = load(
        env={
            "NATS_URL": f"nats://hcs:{PASSWORD}@bus:4222",
            "HCS_BUS__PASSWORD": PASSWORD,
            "HCS_BUS__TOKEN": TOKEN,
        }
    )
    assert settings.bus.password == PASSWORD and settings.bus.token == TOKEN  # still usable
    for shown in (repr(settings), str(settings), f"{settings.bus}", str(redacted(settings))):
        assert PASSWORD not in shown and TOKEN not in shown
    assert redacted(settings)["bus"]["url"] == "nats://hcs:***@bus:4222"


def test_the_log_processor_masks_urls_secret_keys_and_tracebacks() -> None:
    log = structlog.get_logger("hcs.test.secrets")
    with capture_logs(processors=[structlog.processors.format_exc_info, redact_event]) as logs:
        try:
            raise ConnectionError(f"lost nats://hcs:{PASSWORD}@bus:4222")
        except ConnectionError as exc:
            log.error("bus_lost", url=f"nats://{TOKEN}@bus", password=PASSWORD, exc_info=exc)
    assert logs and "bus_lost" == logs[0]["event"]
    assert PASSWORD not in repr(logs) and TOKEN not in repr(logs)
    assert logs[0]["url"] == "nats://***@bus"


def test_the_configured_renderer_writes_no_credentials() -> None:
    script = textwrap.dedent(
        f"""
        from hcs_bus.settings import TelemetrySettings
        from hcs_bus.telemetry import configure, logger
        configure(TelemetrySettings(log_format="json"))
        logger("t").warning("nats_reconnected", url="nats://hcs:{PASSWORD}@bus:4222")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert "nats_reconnected" in done.stderr and "hcs:***@bus" in done.stderr
    assert PASSWORD not in done.stderr + done.stdout


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Logs]:
    """Captured log entries of hcs.bus at every level, before any processor."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as entries:
            # a fresh proxy: the cached module logger would bypass the capture
            monkeypatch.setattr(bus_module, "_log", structlog.get_logger("hcs.bus"))
            yield entries
    finally:
        structlog.configure(**saved)


def _server(tmp_path: Path, authorization: str) -> NatsServer:
    conf = tmp_path / "auth.conf"
    conf.write_text(f"authorization {{ {authorization} }}\n")
    return NatsServer(config_file=conf)


@pytest.fixture
async def password_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    server = await _server(tmp_path, f'user: hcs, password: "{PASSWORD}"').astart()
    yield server
    await asyncio.to_thread(server.cleanup)


@pytest.fixture
async def token_server(tmp_path: Path) -> AsyncIterator[NatsServer]:
    server = await _server(tmp_path, f'token: "{TOKEN}"').astart()
    yield server
    await asyncio.to_thread(server.cleanup)


async def _until_logged(logs: Logs, event: str) -> None:
    async with asyncio.timeout(10):
        while not any(e["event"] == event for e in logs):
            await asyncio.sleep(0.02)


async def test_a_password_in_the_nats_url_reaches_no_log_line_through_a_reconnect(
    password_server: NatsServer, logs: Logs
) -> None:
    port = password_server.port
    bus = await connect(
        BusSettings(url=f"nats://hcs:{PASSWORD}@127.0.0.1:{port}", reconnect_wait_s=0.1)
    )
    try:
        await bus.nc.publish("t.secrets", b"authenticated")  # the credentials worked
        await asyncio.to_thread(password_server.stop)  # the bus goes away ...
        await _until_logged(logs, "nats_disconnected")
        await password_server.astart()  # ... and comes back on the same port
        await _until_logged(logs, "nats_reconnected")
    finally:
        await bus.nc.close()
    events = {e["event"] for e in logs}
    assert {"nats_connected", "nats_disconnected", "nats_reconnected"} <= events
    connected = next(e for e in logs if e["event"] == "nats_connected")
    assert connected["url"] == f"nats://hcs:***@127.0.0.1:{port}"
    assert PASSWORD not in repr(logs)


async def test_a_wrong_password_is_logged_as_refused_without_the_password(
    password_server: NatsServer, logs: Logs
) -> None:
    wrong = f"not-{PASSWORD}"
    url = f"nats://hcs:{wrong}@127.0.0.1:{password_server.port}"
    with pytest.raises(TimeoutError):  # connect retries a refused login forever
        async with asyncio.timeout(1.0):
            await connect(BusSettings(url=url, reconnect_wait_s=0.1))
    refused = [e for e in logs if e["event"] == "nats_error"]
    assert refused and "uthorization" in refused[0]["error"]
    assert wrong not in repr(logs)


async def test_a_token_only_url_reaches_no_log_line_and_no_error(
    token_server: NatsServer, logs: Logs
) -> None:
    port = token_server.port
    bus = await connect(BusSettings(url=f"nats://{TOKEN}@127.0.0.1:{port}"))
    await bus.nc.close()
    connected = next(e for e in logs if e["event"] == "nats_connected")
    assert connected["url"] == f"nats://***@127.0.0.1:{port}"
    with pytest.raises(BusUnavailable) as caught:
        await connect(BusSettings(url=f"nats://{TOKEN}@127.0.0.1:not-a-port"))
    assert TOKEN not in str(caught.value) and "nats://***@127.0.0.1" in str(caught.value)
    assert TOKEN not in repr(logs)


async def test_a_token_from_settings_authenticates(token_server: NatsServer) -> None:
    bus = await connect(BusSettings(url=token_server.url, token=TOKEN))
    try:
        assert bus.connected
        await bus.nc.flush(timeout=2)
    finally:
        await bus.nc.close()
