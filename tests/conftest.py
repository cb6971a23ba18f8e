"""Shared fixtures: a real nats-server -js per test session on a free port
(docs/architecture.md#testing), a fresh bus connection per test with streams initialised, and a
guard that fails a test which leaks tasks."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from nats.js.errors import NotFoundError

from hcs_bus import streams
from hcs_bus.bus import Bus, connect
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings, TelemetrySettings
from hcs_bus.telemetry import configure


@pytest.fixture(scope="session", autouse=True)
def telemetry() -> None:
    """Tracing and metrics on, as in production; logs for humans."""
    configure(TelemetrySettings(log_format="console", log_level="warning"), service="hcs-test")


@pytest.fixture(scope="session")
def nats_server() -> Iterator[NatsServer]:
    """Our own nats-server (or NATS_TEST_URL when given)."""
    server = NatsServer().start()
    yield server
    server.cleanup()


@pytest.fixture
def nats_url(nats_server: NatsServer) -> str:
    return os.environ.get("NATS_TEST_URL", nats_server.url)


@pytest.fixture
def bus_settings(nats_url: str) -> BusSettings:
    return BusSettings(url=nats_url, name="hcs-test", reconnect_wait_s=0.2)


@pytest.fixture
async def bus(bus_settings: BusSettings) -> AsyncIterator[Bus]:
    """A connection on fresh streams: every HCS stream and bucket is deleted and
    created again (a purge would keep the duplicate window, so a test reusing a
    message id would silently lose it)."""
    b = await connect(bus_settings)
    names = [c.name for c in streams.stream_configs(bus_settings)]
    names += [streams.kv_stream(kv.bucket) for kv in streams.kv_configs(bus_settings)]
    for name in names:
        with contextlib.suppress(NotFoundError):
            await b.js.delete_stream(name)
    await streams.init(b, bus_settings)
    yield b
    await b.nc.close()


@pytest.fixture(autouse=True)
async def no_leaked_tasks() -> AsyncIterator[None]:
    """A test must not leave tasks running behind it."""
    before = set(asyncio.all_tasks())
    yield
    await asyncio.sleep(0)
    leaked = [
        t
        for t in asyncio.all_tasks() - before
        if not t.done() and t is not asyncio.current_task() and not _is_library_task(t)
    ]
    for task in leaked:
        task.cancel()
    assert not leaked, f"test leaked tasks: {[t.get_name() for t in leaked]}"


def _is_library_task(task: asyncio.Task[object]) -> bool:
    coro = task.get_coro()
    name = getattr(coro, "__qualname__", "")
    if any(part in name for part in ("Client.", "_read_loop", "_flusher", "_ping_interval")):
        return True
    # nats-py cancels a JetStream subscription's heartbeat and flow-control
    # tasks on unsubscribe only: after its connection closed they run until
    # their next check of it (seen: 1 test in 8 failed on them)
    if "_JSI." not in name:
        return False
    owner = getattr(getattr(coro, "cr_frame", None), "f_locals", {}).get("self")
    return bool(getattr(getattr(owner, "_conn", None), "is_closed", False))


# Kubernetes: the API-server double and a Kube client on it (tests/apiserver.py).
from tests.apiserver import apiserver, kube  # noqa: E402, F401
