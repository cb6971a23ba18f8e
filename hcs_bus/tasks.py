"""Every long-lived coroutine starts here: named, kept, and its failure logged."""

from __future__ import annotations

import asyncio
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
    """Cancel tasks and wait until they have finished."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def running() -> set[asyncio.Task[Any]]:
    return set(_running)
