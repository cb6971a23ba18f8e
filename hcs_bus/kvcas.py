"""Compare-and-set on one KV key, with bounded retries: the one
read → decide → write loop of HCS (node reservation documents and namespace
pledges in ``hcs_alloc``, job checkpoints in ``hcs_ckpt``)::

    def later(stored: CheckpointEvent | None) -> kvcas.Change[CheckpointEvent, bool]:
        if stored is not None and stored.step >= event.step:
            return kvcas.Keep(False)
        return kvcas.Put(event, True)

    stored = await kvcas.update(kv, key, later, decode=..., encode=messages.encode)

Each attempt reads the key with ``kv.get`` (its value and revision, or
absent), asks ``decide`` what to make of that value, and writes the answer
with a compare-and-set on the revision read: ``Put`` with ``kv.create`` when
the key is absent, else ``kv.update(last=revision)``; ``Delete`` with
``kv.delete(last=revision)``; ``Keep`` writes nothing. A write that lost the
race (the key changed since it was read: ``KeyWrongLastSequenceError``, or
the API error saying "wrong last sequence" that a delete, and a clustered
stream, answer) pauses a few milliseconds (jittered, so contenders spread
out), reads again and decides again, at most ``attempts`` writes in all;
then ``KvContention`` names the key.

``decide`` gets the decoded value (None: absent or empty) and decides
without I/O; it may run several times, once per value read, and only the
answer that is written (or kept) counts. It may be a coroutine function when
deciding waits on something other than the key (a plan awaits its quota),
but it never writes.

``known`` is the caller's copy of the key (its own last write, or what its
KV watch delivered) to decide on first, saving a read: a write decided on it
lands only if that revision is still the latest, and otherwise the key is
read; a ``Keep`` decided on it is decided again on a fresh read. So "nothing
to write" is only ever answered from a value ``kv.get`` returned, and every
write answered was decided on the key's latest value.

``seen`` hears every value read and every value written, with its revision
(a caller keeping a copy for ``known``); ``lost`` hears every lost race.
Read and write failures other than a lost race are ``BusUnavailable``; a
value ``decode`` cannot read (``msgspec``) is ``BadMessage``. ``read`` and
``write`` are the loop's two steps, for a caller that only reads, or writes
once (a create under a fresh key); ``lost_race`` tells a lost race apart
from other failures of a write.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Generic, TypeAlias, TypeVar

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from hcs_bus.errors import BadMessage, BusUnavailable, CasConflict, KvContention

T = TypeVar("T")  # the key's value, decoded
R = TypeVar("R")  # what the caller is answered

ATTEMPTS = 8  # writes tried before giving up
PAUSE_FIRST_S = 0.001  # the longest pause after the first lost race; doubles after each
PAUSE_MAX_S = 0.05


@dataclass(frozen=True, slots=True)
class Read(Generic[T]):
    """What a key held: its value (None: absent, or empty) and its revision
    (None: absent, never written or deleted)."""

    value: T | None
    revision: int | None


@dataclass(frozen=True, slots=True)
class Keep(Generic[R]):
    """Write nothing; answer ``result``."""

    result: R


@dataclass(frozen=True, slots=True)
class Put(Generic[T, R]):
    """Write ``value`` over the value decided on; answer ``result``."""

    value: T
    result: R


@dataclass(frozen=True, slots=True)
class Delete(Generic[R]):
    """Delete the key as it was when decided on; answer ``result``."""

    result: R


Change: TypeAlias = Put[T, R] | Keep[R] | Delete[R]
Decide: TypeAlias = Callable[[T | None], Change[T, R] | Awaitable[Change[T, R]]]


async def read(kv: KeyValue, key: str, *, decode: Callable[[bytes], T | None]) -> Read[T]:
    """The key's value and revision, read with ``kv.get``."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:  # never written, or deleted
        return Read(None, None)
    except NatsError as exc:  # timeouts, reconnects: a clear, retryable error
        raise BusUnavailable(f"hcs: cannot read {key}: {exc!r}") from exc
    revision = int(entry.revision or 0)
    if not entry.value:
        return Read(None, revision)
    try:
        return Read(decode(entry.value), revision)
    except msgspec.MsgspecError as exc:
        raise BadMessage(f"hcs: {key} revision {revision} is corrupt: {exc}") from exc


async def update(
    kv: KeyValue,
    key: str,
    decide: Decide[T, R],
    *,
    decode: Callable[[bytes], T | None],
    encode: Callable[[T], bytes],
    known: Read[T] | None = None,
    seen: Callable[[Read[T]], None] | None = None,
    lost: Callable[[], None] | None = None,
    attempts: int = ATTEMPTS,
    absent_first: bool = False,
) -> R:
    """Decide on the key's value and write the decision with compare-and-set,
    again on a lost race; ``decide``'s result once written (or kept).
    ``absent_first``: decide first as if the key were absent (no ``known``
    copy), for keys that usually are: a ``Put`` is then one create, and a
    key that exists after all is read when the create loses."""
    held = known if known is not None and known.revision is not None else None
    if held is None and absent_first:
        held = Read(None, None)
    fresh, lost_count = False, 0
    while True:
        if held is None:
            held, fresh = await read(kv, key, decode=decode), True
            if seen is not None:
                seen(held)
        got = decide(held.value)
        change = got if isinstance(got, Put | Keep | Delete) else await got
        if isinstance(change, Keep):
            if fresh:
                return change.result
            held = None  # nothing to write on the caller's copy: decide on a read
            continue
        data = encode(change.value) if isinstance(change, Put) else None
        try:
            written = await write(kv, key, data, revision=held.revision)
        except CasConflict:
            lost_count += 1
            if lost is not None:
                lost()
            if lost_count >= attempts:
                raise KvContention(key, attempts=attempts) from None
            await asyncio.sleep(_pause_s(lost_count))
            held = None
            continue
        if seen is not None and isinstance(change, Put) and written is not None:
            seen(Read(change.value, written))
        return change.result


async def write(kv: KeyValue, key: str, data: bytes | None, *, revision: int | None) -> int | None:
    """One compare-and-set write of ``data`` (None: delete the key) over
    ``revision`` (None: the key is absent, so a put creates it and a delete has
    nothing to do); the new revision of a put. ``CasConflict`` when another
    writer came first."""
    try:
        if data is None:
            if revision is not None:
                await kv.delete(key, last=revision)
            return None
        if revision is None:
            return int(await kv.create(key, data))
        return int(await kv.update(key, data, last=revision))
    except NatsError as exc:
        if lost_race(exc):
            raise CasConflict(f"hcs: {key} changed since revision {revision}") from exc
        raise BusUnavailable(f"hcs: cannot write {key}: {exc!r}") from exc


def lost_race(exc: BaseException) -> bool:
    """Whether a failed KV write lost to another writer: the key's revision was
    no longer the one given (``KeyWrongLastSequenceError``; the API error
    saying "wrong last sequence" that a delete, and a clustered stream,
    answer), or a create found the key gone again (``KeyNotFoundError``)."""
    if isinstance(exc, KeyWrongLastSequenceError | KeyNotFoundError):
        return True
    return isinstance(exc, NatsError) and "wrong last sequence" in str(exc).lower()


def _pause_s(lost: int) -> float:
    """A jittered pause after the ``lost``-th lost race in a row."""
    return random.uniform(0.0, min(PAUSE_FIRST_S * 2 ** min(lost - 1, 6), PAUSE_MAX_S))
