"""``hcs_bus.quorum.LeaderWatch`` on a real nats-server of its own: a server
that stops answering is a lost quorum; this process stalled past the
question's timeout is not, while the server answers."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hcs_bus import streams
from hcs_bus.bus import Bus, connect
from hcs_bus.natsserver import NatsServer
from hcs_bus.quorum import LeaderWatch
from hcs_bus.settings import BusSettings

STREAM = streams.kv_stream(streams.KV_ALLOC)


@pytest.fixture
async def own_server() -> AsyncIterator[tuple[NatsServer, Bus]]:
    server = NatsServer().start()
    settings = BusSettings(url=server.url, name="hcs-quorum-test", reconnect_wait_s=0.2)
    bus = await connect(settings)
    await streams.init(bus, settings)
    try:
        yield server, bus
    finally:
        assert server.process is not None
        server.process.send_signal(signal.SIGCONT)
        await bus.nc.close()
        server.cleanup()


async def test_a_server_that_stops_answering_is_a_lost_quorum_and_its_return_ends_it(
    own_server: tuple[NatsServer, Bus],
) -> None:
    server, bus = own_server
    watch = LeaderWatch(bus, stream=STREAM, timeout_s=0.5, lost_after=2)
    assert await _told(watch) and not watch.lost
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)  # connected, silent
    await _stopped(server.process.pid)
    assert not await _told(watch) and not watch.lost  # one miss is not a loss
    assert not await _told(watch) and watch.lost
    assert "no answer within 0.5 s" in watch.reason
    server.process.send_signal(signal.SIGCONT)
    assert await _told(watch) and not watch.lost


async def _stopped(pid: int) -> None:
    """Until every thread of ``pid`` is stopped: a SIGSTOP is sent at once but
    each thread stops when it is next scheduled, and a loaded machine may let
    the server answer one more question first."""
    for _ in range(500):
        states = _states(pid)
        if states and all(state in ("T", "t") for state in states):
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"nats-server {pid} did not stop: thread states {states}")


def _states(pid: int) -> list[str]:
    return [_state(task / "stat") for task in Path(f"/proc/{pid}/task").iterdir()]


def _state(stat: Path) -> str:
    try:
        return stat.read_text().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return "T"  # a thread gone meanwhile stops nothing


async def _told(watch: LeaderWatch) -> bool:
    """``check`` until a question can tell: on a loaded machine this test's own
    event loop can run late enough for the watch to learn nothing (it says so
    in ``unsure``), which is the stall the next test is about."""
    for _ in range(20):
        leader = await watch.check()
        if not watch.unsure:
            return leader
    raise AssertionError("20 questions in a row could not tell: this process stalled throughout")


async def test_this_process_stalled_past_the_timeout_is_not_taken_for_a_lost_quorum(
    own_server: tuple[NatsServer, Bus],
) -> None:
    _server, bus = own_server
    watch = LeaderWatch(bus, stream=STREAM, timeout_s=0.5, lost_after=2)
    loop = asyncio.get_running_loop()
    for _ in range(4):  # twice the misses that would call it lost
        # the event loop blocked longer than the timeout while the question
        # is out (a replica short of CPU): the answer is read after the timer
        loop.call_soon(time.sleep, 0.8)
        assert await watch.check()
    assert not watch.lost
    # and it still counts real misses once the process keeps up again
    watch.timeout_s = 0.000_001
    assert not await watch.check() and not watch.lost
    assert not await watch.check() and watch.lost
