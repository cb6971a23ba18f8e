"""Group commit per key: the changes of one key that arrive while a write of
it is on its way wait for it, then go together in the next write.

Node documents (``booking``) and namespace pledges (``pledging``) use it.
Under a burst many binds land on the same node (kube-scheduler ranks the
same node first until it fills). One write per change made each bind's
compare-and-set race the others' and retry; one write per batch turns that
contention into fewer, larger writes and no self-inflicted conflicts, and a
bind's mark rides along with the next pod's reserve.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from hcs_bus.errors import BusUnavailable

K = TypeVar("K", bound=Hashable)
C = TypeVar("C")  # one change, as the caller describes it
R = TypeVar("R")  # its result

# commit(key, changes) -> one result (or the error) per change, in order
Commit = Callable[[K, list[C]], Awaitable[list[R | BaseException]]]


class Batches(Generic[K, C, R]):
    """Submit changes per key; ``commit`` writes each batch once."""

    def __init__(self, commit: Commit[K, C, R]) -> None:
        self._commit = commit
        self._waiting: dict[K, list[tuple[C, asyncio.Future[R]]]] = {}
        self._flushing: set[K] = set()
        self.batches = 0  # batches committed
        self.changes = 0  # changes in them

    async def submit(self, key: K, change: C) -> R:
        """The result of ``change``, once the batch holding it is committed."""
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._waiting.setdefault(key, []).append((change, done))
        if key not in self._flushing:
            self._flushing.add(key)
            try:
                while batch := self._waiting.pop(key, None):
                    await self._flush(key, batch)
            except asyncio.CancelledError:
                if done.done() and not done.cancelled():
                    done.exception()  # retrieved: this task is cancelled, not failed
                raise
            finally:
                self._flushing.discard(key)
                for _change, fut in self._waiting.pop(key, []):  # the flusher was cancelled
                    if not fut.done():
                        fut.set_exception(BusUnavailable("hcs: interrupted; retry"))
        return await done

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
