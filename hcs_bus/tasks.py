"""Every long-lived coroutine starts here: named, kept, and its failure logged.

``supervise`` (or ``supervised`` inside a coroutine of one's own) runs a
loop again whenever it raises, with a growing back-off, and counts each
restart in ``hcs_task_restarts{task=<name>}``; cancellation still stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import uvloop

from hcs_bus.errors import ConfigError
from hcs_bus.telemetry import logger, meter

_log = logger("hcs.tasks")
RESTARTS = meter("hcs.tasks").create_counter(
    "hcs_task_restarts", description="long-lived loops started again after a crash"
)
_running: set[asyncio.Task[Any]] = set()
# allocations between two young collections (CPython's default is 700)
GC_YOUNG = 50_000


def long_lived() -> None:
    """Call once a part has started: what it holds by then (its imported
    libraries, above all, and its connections and replayed state) lives as
    long as the process, so ``gc.freeze`` takes it out of every collection;
    and a young collection comes every ``GC_YOUNG`` allocations, so the
    objects of one message or request are freed before a collection looks
    at them and fewer of them age into the generations that are scanned
    rarely but whole. Measured in bench.burst: the scheduler spent 11 % of
    its CPU in the cycle collector (three full collections of ~90 ms in 30 s
    of burst); after this, 1.5 %."""
    gc.freeze()
    gc.set_threshold(GC_YOUNG, 20, 10)


LOOP_SHARE = 0.05  # of a part's event loop, the most one periodic job's rounds take


def spacing_s(took_s: float, *, every_s: float, share: float = LOOP_SHARE) -> float:
    """How long a periodic job waits after a round that took ``took_s``:
    ``every_s``, or longer when the round was long, so that its rounds take
    at most ``share`` of the loop whatever the size of the fleet (a round
    that walks every node or pod grows with them; the requests the loop
    serves must not wait behind it)."""
    return max(every_s, took_s / share)


def start(coro: Coroutine[Any, Any, Any], *, name: str) -> asyncio.Task[Any]:
    """Start ``coro`` as a named task; a crash is logged, never swallowed silently."""
    task = asyncio.get_running_loop().create_task(coro, name=name)
    _running.add(task)
    task.add_done_callback(_finished)
    return task


def _finished(task: asyncio.Task[Any]) -> None:
    _running.discard(task)
    if task.cancelled():
        return
    exc = task.exception()
    if exc is not None:
        _log.error("task_failed", task=task.get_name(), error=repr(exc), exc_info=exc)


def supervise(
    run: Callable[[], Awaitable[Any]], *, name: str, backoff_s: float = 0.5
) -> asyncio.Task[Any]:
    """Start ``run()`` as a named task that is started again whenever it raises."""
    return start(supervised(run, name=name, backoff_s=backoff_s), name=name)


async def supervised(
    run: Callable[[], Awaitable[Any]],
    *,
    name: str,
    backoff_s: float = 0.5,
    max_backoff_s: float = 30.0,
    on_restart: Callable[[], None] | None = None,
) -> None:
    """Await ``run()`` until it returns; after a crash, log it, count it, wait
    and await a fresh ``run()``. The wait doubles with each crash in a row up
    to ``max_backoff_s``, and starts over after a run that lasted that long."""
    loop = asyncio.get_running_loop()
    delay = backoff_s
    while True:
        began = loop.time()
        try:
            await run()
            return
        except Exception as exc:  # the point: any crash, never a cancellation
            crashed = exc
        if loop.time() - began >= max_backoff_s:
            delay = backoff_s
        RESTARTS.add(1, {"task": name})
        if on_restart is not None:
            on_restart()
        _log.error(
            "task_restarting", task=name, delay_s=delay, error=repr(crashed), exc_info=crashed
        )
        await asyncio.sleep(delay)
        delay = min(delay * 2, max_backoff_s)


async def stop(*tasks: asyncio.Task[Any]) -> None:
    """Cancel tasks and wait until they have finished.

    Cancels again while a task is still running: a library call that swallows
    one cancellation (nats-py's pull fetch can) must not keep a part alive.
    """
    pending = {t for t in tasks if not t.done()}
    while pending:
        for task in pending:
            task.cancel()
        _done, pending = await asyncio.wait(pending, timeout=0.2)
    await asyncio.gather(*tasks, return_exceptions=True)


def running() -> set[asyncio.Task[Any]]:
    return set(_running)


def stop_event(*signals: signal.Signals) -> asyncio.Event:
    """An event set when the process is asked to stop (SIGTERM, SIGINT by default).

    Every part's ``__main__`` waits on it, then stops its tasks and drains
    its bus connection, so a rolling update loses nothing.
    """
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in signals or (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    return stop


async def run_until_stopped(coro: Coroutine[Any, Any, Any], *, name: str) -> None:
    """Run ``coro`` until it ends or the process is asked to stop, then stop it."""
    signalled = stop_event()
    work = start(coro, name=name)
    waiter = start(signalled.wait(), name=f"{name}:signals")
    try:
        await asyncio.wait({work, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        await stop(work, waiter)


def run_part(main: Callable[[], Coroutine[Any, Any, None]], *, service: str) -> int:
    """A part's process: ``main`` run to its end, and its exit status; bad
    settings are one line on stderr naming the setting (status 2), not a
    traceback. The loop is uvloop's (libuv's transports and scheduling, in
    C): in bench.burst the scheduler's CPU per pod went from 6.6 ms on
    asyncio's own loop to 5.2 to 5.7 ms, the injector's from 1.8 to 1.5 to
    1.7 ms."""
    try:
        uvloop.run(main())
    except ConfigError as exc:
        print(f"{service}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0
