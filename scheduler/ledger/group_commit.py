"""Group commit per key: the changes of one key that arrive while a write of
it is on its way wait for it, then go together in the next write.

Node documents (``booking``) and namespace pledges (``pledging``) use it.
Under a burst many binds land on the same node (kube-scheduler ranks the
same node first until it fills). One write per change made each bind's
compare-and-set race the others' and retry; one write per batch turns that
contention into fewer, larger writes and no self-inflicted conflicts.

A change that may wait (``defer``: a bound pod's mark, which expiry and the
reconcile would make anyway) is not written on its own at once: it rides
the key's next write, or is written ``after_s`` later if none comes first.
``settle`` writes every deferred change now (a replica that stops).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from hcs_bus.errors import BusUnavailable

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")  # one change, as the caller describes it
R = TypeVar("R")  # its result

RECHECK_S = 0.05  # a deferred change due during a write of its key waits this much more

# commit(key, changes) -> one result (or the error) per change, in order
Commit = Callable[[K, list[C]], Awaitable[list[R | BaseException]]]


class Batches(Generic[K, C, R]):
    """Submit changes per key; ``commit`` writes each batch once."""

    def __init__(self, commit: Commit[K, C, R]) -> None:
        self._commit = commit
        self._waiting: dict[K, list[tuple[C, asyncio.Future[R]]]] = {}
        self._deferred: dict[K, list[tuple[C, asyncio.Future[R]]]] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._flushing: set[K] = set()
        self._due_tasks: set[asyncio.Task[None]] = set()
        self.batches = 0  # batches committed
        self.changes = 0  # changes in them

    async def submit(self, key: K, change: C) -> R:
        """The result of ``change``, once the batch holding it is committed."""
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((change, done))
        if key not in self._flushing:
            try:
                await self._drain(key)
            except asyncio.CancelledError:
                if done.done() and not done.cancelled():
                    done.exception()  # retrieved: this task is cancelled, not failed
                raise
        return await done

    def defer(self, key: K, change: C, *, after_s: float) -> asyncio.Future[R]:
        """Queue ``change`` for the key's next write, or for one ``after_s``
        from now if none comes first; the future holds its result."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[R] = loop.create_future()
        self._deferred.setdefault(key, []).append((change, done))
        if key not in self._timers:
            self._timers[key] = loop.call_later(after_s, self._due, key)
        return done

    async def settle(self) -> None:
        """Write every deferred change now."""
        for key in list(self._deferred):
            if key not in self._flushing:
                await self._drain(key, force=True)
        if self._due_tasks:
            await asyncio.gather(*self._due_tasks, return_exceptions=True)

    def _due(self, key: K) -> None:
        self._timers.pop(key, None)
        if not self._deferred.get(key):
            return  # a write took them
        loop = asyncio.get_running_loop()
        if key in self._flushing:  # a write is on its way: look again once it is done
            self._timers[key] = loop.call_later(RECHECK_S, self._due, key)
            return
        task = loop.create_task(self._drain(key, force=True))
        self._due_tasks.add(task)
        task.add_done_callback(self._due_tasks.discard)

    def _take(self, key: K, *, force: bool) -> list[tuple[C, asyncio.Future[R]]]:
        """The next batch: the deferred changes first (they came before),
        then the waiting ones; deferred ones alone only when ``force``."""
        waiting = self._waiting.pop(key, [])
        if not waiting and not force:
            return []
        deferred = self._deferred.pop(key, [])
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        return deferred + waiting

    async def _drain(self, key: K, *, force: bool = False) -> None:
        self._flushing.add(key)
        try:
            while batch := self._take(key, force=force):
                force = False
                await self._flush(key, batch)
        finally:
            self._flushing.discard(key)
            for _change, fut in self._waiting.pop(key, []):  # the flusher was cancelled
                if not fut.done():
                    fut.set_exception(BusUnavailable("hcs: interrupted; retry"))

    async def _flush(self, key: K, batch: list[tuple[C, asyncio.Future[R]]]) -> None:
        self.batches += 1
        self.changes += len(batch)
        try:
            results = await self._commit(key, [change for change, _fut in batch])
        except asyncio.CancelledError:  # the others of the batch are not cancelled
            for _change, fut in batch:
                if not fut.done():
                    fut.set_exception(BusUnavailable("hcs: interrupted; retry"))
            raise
        except Exception as exc:  # every change of the batch gets the failure
            results = [exc] * len(batch)
        for (_change, fut), result in zip(batch, results, strict=True):
            if fut.done():
                continue
            if isinstance(result, BaseException):
                fut.set_exception(result)
            else:
                fut.set_result(result)
