"""Every long-lived coroutine starts here: named, kept, and its failure logged."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Coroutine
from typing import Any

from hcs_bus.telemetry import logger

_log = logger("hcs.tasks")
_running: set[asyncio.Task[Any]] = set()


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
