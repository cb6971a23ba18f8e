"""Shared fixtures: a real nats-server -js per test session on a free port
(docs/architecture.md#testing), a fresh bus connection per test with streams initialised, and a
guard that fails a test which leaks tasks."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterator

import pytest
from nats.js.errors import APIError, NoStreamResponseError, NotFoundError

from hcs_bus import streams
from hcs_bus.bus import Bus, connect
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings, TelemetrySettings
from hcs_bus.telemetry import configure


@pytest.fixture(scope="session", autouse=True)
def own_state_home(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every ``hcs up`` a test runs keeps its context file and logs here, never in
    the user's own ~/.local/state/hcs (a real ``hcs up`` may be running there)."""
    os.environ["XDG_STATE_HOME"] = str(tmp_path_factory.mktemp("state"))
    os.environ.pop("HCS_CONTEXT", None)


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
    try:
        await _fresh_streams(b, bus_settings)
        yield b
    finally:
        await b.nc.close()


async def _fresh_streams(b: Bus, settings: BusSettings) -> None:
    names = [c.name for c in streams.stream_configs(settings)]
    names += [streams.kv_stream(kv.bucket) for kv in streams.kv_configs(settings)]
    for name in names:
        with contextlib.suppress(NotFoundError):
            await b.js.delete_stream(name)
    # A stream created again right after its deletion is now and then refused
    # ("error creating store for stream") while the server still removes the
    # old one's files; init creates what is missing, so it is asked again.
    for _ in range(50):
        refused = [o for o in await streams.init(b, settings) if o.action == "refused"]
        if not refused:
            break
        await asyncio.sleep(0.05)
    else:
        raise AssertionError(f"streams refused: {[(o.name, o.detail) for o in refused]}")
    subjects = [c.subjects[0] for c in streams.stream_configs(settings) if c.subjects]
    subjects += [streams.kv_subject(kv.bucket) for kv in streams.kv_configs(settings)]
    for subject in subjects:
        await _taking(b, subject.replace(">", "probe").replace("*", "probe"))


async def _taking(b: Bus, subject: str) -> None:
    """Until the stream of ``subject`` answers a publish: one it must refuse
    (the expected last sequence is far ahead), so nothing is stored. A stream
    created a moment ago can still answer "no responders", and a test's
    first publish would fail on it."""
    far = {"Nats-Expected-Last-Sequence": str(2**62)}
    for _ in range(100):
        try:
            await b.js.publish(subject, b"", headers=far, timeout=2.0)
        except NoStreamResponseError:
            await asyncio.sleep(0.02)
            continue
        except APIError:
            return  # refused: the stream takes messages on its subjects
        raise AssertionError(f"the probe on {subject} was stored")
    raise AssertionError(f"no stream answers on {subject}")


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

# A three-server JetStream cluster on loopback (tests/cluster_fixture.py).
from tests.cluster_fixture import cluster_bus, cluster_settings, nats_cluster  # noqa: E402, F401

# -- what did not run -------------------------------------------------------


def _tier(report: pytest.TestReport) -> str:
    """A test's tier: its folder under tests/ (``e2e``, ``cli``, ``scheduler`` …)."""
    parts = report.nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "tests"


def _reason(report: pytest.TestReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


def skipped_by_tier(reports: list[pytest.TestReport]) -> dict[str, dict[str, int]]:
    """tier → reason → how many tests it skipped."""
    found: dict[str, dict[str, int]] = {}
    for report in reports:
        if report.skipped and not hasattr(report, "wasxfail"):
            reasons = found.setdefault(_tier(report), {})
            reasons[_reason(report)] = reasons.get(_reason(report), 0) + 1
    return dict(sorted(found.items()))


def skipped_line(found: dict[str, dict[str, int]]) -> str:
    if not found:
        return "skipped tiers: none (every tier ran)"
    tiers = "; ".join(
        f"{tier} ({', '.join(f'{n} × {why}' for why, n in reasons.items())})"
        for tier, reasons in found.items()
    )
    return f"skipped tiers: {tiers}"


_SKIPPED_LINE = pytest.StashKey[str]()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name every tier that was skipped and why, one row per reason; the very
    last line of the run says it again (``pytest_unconfigure``)."""
    found = skipped_by_tier(terminalreporter.stats.get("skipped", []))
    if found:
        terminalreporter.section("skipped tiers")
        for tier, reasons in found.items():
            for why, count in reasons.items():
                terminalreporter.line(f"tests/{tier}: {count} skipped: {why}")
    terminalreporter.config.stash[_SKIPPED_LINE] = skipped_line(found)


def pytest_unconfigure(config: pytest.Config) -> None:
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    line = config.stash.get(_SKIPPED_LINE, None)
    if reporter is not None and line is not None:
        reporter.write_line(line)
