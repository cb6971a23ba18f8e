"""Compare-and-set on one KV key with bounded retries (``hcs_bus.kvcas``), on a
real nats-server: concurrent writers never lose an update, a writer that
keeps losing gives up with ``KvContention`` naming the key, and "nothing to
write" is only answered on a value just read."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import msgspec
import pytest

from hcs_bus import kvcas, streams
from hcs_bus.bus import Bus, connect
from hcs_bus.errors import BadMessage, CasConflict, KvContention
from hcs_bus.settings import BusSettings

KEY = "counter-1"


class Tally(msgspec.Struct, frozen=True):
    """A test document: who added to it, in order."""

    writers: tuple[str, ...] = ()


_DECODE = msgspec.json.Decoder(Tally).decode
_ENCODE = msgspec.json.Encoder().encode


def _add(who: str) -> Callable[[Tally | None], kvcas.Change[Tally, int]]:
    def add(found: Tally | None) -> kvcas.Change[Tally, int]:
        before = found.writers if found is not None else ()
        return kvcas.Put(Tally((*before, who)), len(before) + 1)

    return add


async def _stored(kv: Any) -> Tally:
    entry = await kv.get(KEY)
    return _DECODE(entry.value)


class MeddledKV:
    """The real KV; ``meddle`` runs before every compare-and-set write it is
    given (another writer getting in first), and the writes are counted."""

    def __init__(self, kv: Any, meddle: Callable[[], Awaitable[None]] | None = None) -> None:
        self.kv, self.meddle = kv, meddle
        self.gets = self.writes = 0

    async def get(self, key: str) -> Any:
        self.gets += 1
        return await self.kv.get(key)

    async def _meddled(self) -> None:
        self.writes += 1
        if self.meddle is not None:
            await self.meddle()

    async def create(self, key: str, value: bytes) -> int:
        await self._meddled()
        return int(await self.kv.create(key, value))

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        await self._meddled()
        return int(await self.kv.update(key, value, last=last))

    async def delete(self, key: str, last: int | None = None) -> bool:
        await self._meddled()
        return bool(await self.kv.delete(key, last=last))


@pytest.fixture
async def writers(bus: Bus, bus_settings: BusSettings) -> AsyncIterator[list[Any]]:
    """The KV bucket seen through four connections of their own."""
    buses = [await connect(bus_settings) for _ in range(4)]
    yield [await b.js.key_value(streams.KV_ALLOC) for b in buses]
    for b in buses:
        with contextlib.suppress(Exception):
            await b.nc.close()


async def test_concurrent_writers_on_one_key_never_lose_an_update(writers: list[Any]) -> None:
    rounds = 15

    async def writer(index: int, kv: Any) -> None:
        for n in range(rounds):
            await kvcas.update(
                kv, KEY, _add(f"w{index}-{n}"), decode=_DECODE, encode=_ENCODE, attempts=200
            )

    await asyncio.wait_for(
        asyncio.gather(*(writer(i, kv) for i, kv in enumerate(writers))), timeout=60
    )
    stored = await _stored(writers[0])
    assert sorted(stored.writers) == sorted(
        f"w{i}-{n}" for i in range(len(writers)) for n in range(rounds)
    )
    for i in range(len(writers)):  # each writer's own updates land in its order
        mine = [w for w in stored.writers if w.startswith(f"w{i}-")]
        assert mine == [f"w{i}-{n}" for n in range(rounds)]


async def test_a_writer_that_keeps_losing_gives_up_after_the_bound_naming_the_key(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(KEY, _ENCODE(Tally(("first",))))
    rivals = 0

    async def rival_writes_first() -> None:
        nonlocal rivals
        rivals += 1
        entry = await kv.get(KEY)
        await kv.put(KEY, _ENCODE(Tally((*_DECODE(entry.value).writers, "rival"))))

    meddled = MeddledKV(kv, rival_writes_first)
    lost: list[int] = []
    with pytest.raises(KvContention, match=f"{KEY}: 5 compare-and-set conflicts") as caught:
        await kvcas.update(
            meddled,  # type: ignore[arg-type]
            KEY,
            _add("loser"),
            decode=_DECODE,
            encode=_ENCODE,
            lost=lambda: lost.append(1),
            attempts=5,
        )
    assert isinstance(caught.value, CasConflict)  # callers that retry a conflict still do
    assert (caught.value.key, caught.value.attempts) == (KEY, 5)
    assert meddled.writes == 5 and len(lost) == 5 and meddled.gets == 5
    assert (await _stored(kv)).writers == ("first", *["rival"] * rivals)


async def test_a_lost_race_is_decided_again_on_the_winners_value(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    rival_done = False

    async def rival_creates_first() -> None:
        nonlocal rival_done
        if not rival_done:
            rival_done = True
            await kv.create(KEY, _ENCODE(Tally(("rival",))))

    meddled = MeddledKV(kv, rival_creates_first)
    decided_on: list[Tally | None] = []

    def add(found: Tally | None) -> kvcas.Change[Tally, int]:
        decided_on.append(found)
        return _add("mine")(found)

    got = await kvcas.update(meddled, KEY, add, decode=_DECODE, encode=_ENCODE)  # type: ignore[arg-type]
    assert decided_on == [None, Tally(("rival",))]  # the lost create, then the winner's value
    assert got == 2
    assert (await _stored(kv)).writers == ("rival", "mine")


async def test_nothing_to_write_on_a_known_copy_is_decided_again_on_a_read(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    revision = await kv.put(KEY, _ENCODE(Tally(("a",))))
    await kv.put(KEY, _ENCODE(Tally(("a", "b"))))  # the caller's copy is now stale
    meddled = MeddledKV(kv)
    stale = kvcas.Read(Tally(("a",)), revision)

    def has_b(found: Tally | None) -> kvcas.Change[Tally, bool]:
        return kvcas.Keep(found is not None and "b" in found.writers)

    assert await kvcas.update(meddled, KEY, has_b, decode=_DECODE, encode=_ENCODE, known=stale)  # type: ignore[arg-type]
    assert meddled.gets == 1 and meddled.writes == 0


async def test_a_write_on_a_current_known_copy_reads_nothing(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    revision = await kv.put(KEY, _ENCODE(Tally(("a",))))
    meddled = MeddledKV(kv)
    seen: list[kvcas.Read[Tally]] = []
    got = await kvcas.update(
        meddled,  # type: ignore[arg-type]
        KEY,
        _add("b"),
        decode=_DECODE,
        encode=_ENCODE,
        known=kvcas.Read(Tally(("a",)), revision),
        seen=seen.append,
    )
    assert got == 2 and meddled.gets == 0 and meddled.writes == 1
    assert [s.value for s in seen] == [Tally(("a", "b"))]
    assert seen[0].revision == (await kv.get(KEY)).revision


async def test_a_delete_that_lost_its_race_is_decided_again(bus: Bus) -> None:
    """A delete's lost race comes back as the API error saying "wrong last
    sequence", not as ``KeyWrongLastSequenceError``: it is retried all the same."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(KEY, _ENCODE(Tally(("a",))))
    meddled = MeddledKV(kv)

    async def rival_adds() -> None:
        meddled.meddle = None
        await kv.put(KEY, _ENCODE(Tally(("a", "rival"))))

    meddled.meddle = rival_adds
    decided_on: list[Tally | None] = []

    def drop(found: Tally | None) -> kvcas.Change[Tally, int]:
        decided_on.append(found)
        return kvcas.Delete(len(found.writers) if found is not None else 0)

    assert await kvcas.update(meddled, KEY, drop, decode=_DECODE, encode=_ENCODE) == 2  # type: ignore[arg-type]
    assert decided_on == [Tally(("a",)), Tally(("a", "rival"))]
    assert (await kvcas.read(kv, KEY, decode=_DECODE)).revision is None  # deleted


async def test_an_absent_key_is_created_and_a_deleted_one_created_again(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    assert await kvcas.update(kv, KEY, _add("a"), decode=_DECODE, encode=_ENCODE) == 1
    await kv.delete(KEY)
    assert await kvcas.update(kv, KEY, _add("b"), decode=_DECODE, encode=_ENCODE) == 1
    assert (await _stored(kv)).writers == ("b",)


async def test_a_value_that_is_not_the_document_is_refused_naming_key_and_revision(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    revision = await kv.put(KEY, b"not json")
    with pytest.raises(BadMessage, match=f"{KEY} revision {revision} is corrupt"):
        await kvcas.update(kv, KEY, _add("a"), decode=_DECODE, encode=_ENCODE)
    assert (await kv.get(KEY)).value == b"not json"  # left as it was


async def test_a_decision_may_wait_on_something_else_but_is_made_again_on_a_lost_race(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(KEY, _ENCODE(Tally(("a",))))
    planned = asyncio.Event()
    calls = 0

    async def slow_add(found: Tally | None) -> kvcas.Change[Tally, int]:
        nonlocal calls
        calls += 1
        if calls == 1:
            planned.set()
            await asyncio.sleep(0)  # the rival writes while this one waits
            await asyncio.wait_for(rival, timeout=5)
        return _add("slow")(found)

    async def rival_write() -> None:
        await asyncio.wait_for(planned.wait(), timeout=5)
        await kvcas.update(kv, KEY, _add("rival"), decode=_DECODE, encode=_ENCODE)

    rival = asyncio.ensure_future(rival_write())
    assert await kvcas.update(kv, KEY, slow_add, decode=_DECODE, encode=_ENCODE) == 3
    assert calls == 2
    assert (await _stored(kv)).writers == ("a", "rival", "slow")
