"""Group commit per key (``scheduler.ledger.group_commit``): changes that arrive while a
write is on its way go together in the next one, each gets its own result,
and a failure or a cancellation reaches exactly the changes it concerns."""

from __future__ import annotations

import asyncio

import pytest

from hcs_bus.errors import BusUnavailable, CasConflict
from scheduler.ledger.group_commit import Batches


class Store:
    """A commit that records each batch and holds it until its gate opens."""

    def __init__(self) -> None:
        self.batches: list[tuple[str, list[str]]] = []
        self.gates: list[asyncio.Event] = []
        self.fail: dict[int, Exception] = {}  # batch number -> the error it raises

    async def commit(self, key: str, changes: list[str]) -> list[str | BaseException]:
        self.batches.append((key, changes))
        gate = asyncio.Event()
        self.gates.append(gate)
        await gate.wait()
        if (error := self.fail.get(len(self.batches))) is not None:
            raise error
        return [f"{key}:{c}" if c != "bad" else CasConflict("bad one") for c in changes]

    async def opened(self, count: int) -> None:
        """Wait until ``count`` batches are held, then open the last one."""
        while len(self.gates) < count:
            await asyncio.sleep(0)
        self.gates[count - 1].set()


async def test_changes_that_arrive_during_a_write_go_together_in_the_next() -> None:
    store = Store()
    batches: Batches[str, str, str] = Batches(store.commit)
    first = asyncio.create_task(batches.submit("n1", "a"))
    await asyncio.sleep(0)  # "a" is being written
    later = [asyncio.create_task(batches.submit("n1", c)) for c in ("b", "c", "d")]
    other = asyncio.create_task(batches.submit("n2", "x"))  # another key: its own write
    await store.opened(1)
    await store.opened(2)
    await store.opened(3)
    assert await first == "n1:a"
    assert [await t for t in later] == ["n1:b", "n1:c", "n1:d"]
    assert await other == "n2:x"
    assert sorted(store.batches) == [("n1", ["a"]), ("n1", ["b", "c", "d"]), ("n2", ["x"])]
    assert (batches.batches, batches.changes) == (3, 5)


async def test_each_change_gets_its_own_error() -> None:
    store = Store()
    batches: Batches[str, str, str] = Batches(store.commit)
    first = asyncio.create_task(batches.submit("n1", "a"))
    await asyncio.sleep(0)
    good, bad = (asyncio.create_task(batches.submit("n1", c)) for c in ("b", "bad"))
    await store.opened(1)
    await store.opened(2)
    assert await first == "n1:a"
    assert await good == "n1:b"
    with pytest.raises(CasConflict, match="bad one"):
        await bad


async def test_a_failed_write_fails_its_batch_and_the_next_batch_goes_on() -> None:
    store = Store()
    store.fail[2] = BusUnavailable("hcs: cannot write n1")
    batches: Batches[str, str, str] = Batches(store.commit)
    first = asyncio.create_task(batches.submit("n1", "a"))
    await asyncio.sleep(0)
    failed = [asyncio.create_task(batches.submit("n1", c)) for c in ("b", "c")]
    await store.opened(1)
    while len(store.batches) < 2:
        await asyncio.sleep(0)
    after = asyncio.create_task(batches.submit("n1", "d"))  # during the failing write
    await store.opened(2)
    await store.opened(3)
    assert await first == "n1:a"
    for task in failed:
        with pytest.raises(BusUnavailable, match="cannot write n1"):
            await task
    assert await after == "n1:d"


async def test_cancelling_the_writer_fails_the_others_with_a_retryable_error() -> None:
    store = Store()
    batches: Batches[str, str, str] = Batches(store.commit)
    writer = asyncio.create_task(batches.submit("n1", "a"))
    await asyncio.sleep(0)
    riders = [asyncio.create_task(batches.submit("n1", c)) for c in ("b", "c")]
    await store.opened(1)
    while len(store.batches) < 2:  # the writer now writes "b" and "c" for them
        await asyncio.sleep(0)
    waiting = asyncio.create_task(batches.submit("n1", "d"))  # queued behind that write
    await asyncio.sleep(0)
    writer.cancel()
    for task in (*riders, waiting):
        with pytest.raises(BusUnavailable, match="interrupted"):
            await task
    assert writer.cancelled()
    # the key is free again: the next change is written at once
    fresh = asyncio.create_task(batches.submit("n1", "e"))
    await store.opened(3)
    assert await fresh == "n1:e"


class Open(Store):
    """A store whose writes are not held."""

    async def commit(self, key: str, changes: list[str]) -> list[str | BaseException]:
        self.batches.append((key, changes))
        return [f"{key}:{c}" for c in changes]


async def test_a_deferred_change_rides_the_next_write_of_its_key_first() -> None:
    store = Open()
    batches: Batches[str, str, str] = Batches(store.commit)
    marked = batches.defer("n1", "mark-a", after_s=60.0)
    other = batches.defer("n2", "mark-x", after_s=60.0)
    assert not store.batches and not marked.done() and not other.done()  # none written alone
    assert await batches.submit("n1", "reserve-b") == "n1:reserve-b"
    assert store.batches == [("n1", ["mark-a", "reserve-b"])]  # in the order they came
    assert marked.result() == "n1:mark-a" and not other.done()
    await batches.settle()  # a stopping replica writes the rest now
    assert store.batches[-1] == ("n2", ["mark-x"]) and other.result() == "n2:mark-x"


async def test_a_deferred_change_no_write_takes_is_written_alone_when_due() -> None:
    store = Open()
    batches: Batches[str, str, str] = Batches(store.commit)
    assert await batches.defer("n1", "mark-a", after_s=0.01) == "n1:mark-a"
    assert store.batches == [("n1", ["mark-a"])]


async def test_a_deferred_change_due_during_a_write_is_written_after_it() -> None:
    store = Store()
    batches: Batches[str, str, str] = Batches(store.commit)
    first = asyncio.create_task(batches.submit("n1", "a"))
    await asyncio.sleep(0)  # "a" is being written, and is held there
    marked = batches.defer("n1", "mark-b", after_s=0.0)
    for _ in range(3):  # due while "a" is held: it waits for that write to end
        await asyncio.sleep(0)
    assert len(store.batches) == 1 and not marked.done()
    await store.opened(1)
    assert await first == "n1:a"
    await store.opened(2)
    assert await marked == "n1:mark-b"
    assert store.batches == [("n1", ["a"]), ("n1", ["mark-b"])]
