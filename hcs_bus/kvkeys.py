"""Which keys a KV bucket holds, as the server counts them.

nats-py's KV watch marks the end of its initial replay with a ``None``, and
``KeyValue.keys()`` stops there. That marker can come early: before
messages already on their way have been handed over (nats-io/nats.py#842),
or on a stale per-message pending count (#995). A watch then looks
complete with keys missing, and ``keys()`` answers a partial list or none.
Either way a reader can miss keys the bucket holds.

So we ask the stream itself. One ``STREAM.INFO`` with a subject filter
lists every subject that has a message, paged by the server; for a KV
bucket that is every key written and not yet compacted away: those that
hold a value and those whose last word is a delete marker.
``Replay`` follows a watch against that list: the initial replay is done
once every listed key has been seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError

from hcs_bus import streams
from hcs_bus.bus import Bus
from hcs_bus.errors import BusUnavailable
from hcs_bus.permissions import JS_API


class _Error(msgspec.Struct):
    code: int = 0
    description: str = ""


class _State(msgspec.Struct):
    subjects: dict[str, int] | None = None


class _Info(msgspec.Struct):
    total: int = 0
    offset: int = 0
    state: _State | None = None
    error: _Error | None = None


_INFO = msgspec.json.Decoder(_Info)


async def stored_keys(bus: Bus, bucket: str, *, timeout_s: float = 5.0) -> set[str]:
    """Every key of ``bucket`` with a message in its stream (the latest may be
    a delete marker: read it before trusting a value is there)."""
    stream, prefix = streams.kv_stream(bucket), streams.kv_subject(bucket, "")
    keys: set[str] = set()
    offset = 0
    while True:
        request = msgspec.json.encode({"subjects_filter": f"{prefix}>", "offset": offset})
        try:
            reply = await bus.nc.request(
                f"{JS_API}.STREAM.INFO.{stream}", request, timeout=timeout_s
            )
            info = _INFO.decode(reply.data)
        except (NatsError, TimeoutError) as exc:
            raise BusUnavailable(f"hcs: cannot list the keys of {bucket}: {exc!r}") from exc
        except msgspec.DecodeError as exc:
            raise BusUnavailable(f"hcs: the keys of {bucket}: an unreadable answer: {exc}") from exc
        if info.error is not None:
            why = f"{info.error.description} ({info.error.code})"
            raise BusUnavailable(f"hcs: cannot list the keys of {bucket}: {why}")
        page = (info.state.subjects if info.state else None) or {}
        keys.update(subject.removeprefix(prefix) for subject in page)
        offset += len(page)
        if not page or offset >= info.total:
            return keys


async def stored_values(
    bus: Bus, bucket: str, *, wanted: Callable[[str], bool] = lambda _key: True
) -> list[tuple[str, bytes]]:
    """(key, value) of the ``wanted`` keys of ``bucket`` that hold a value
    (deleted ones left out), in key order."""
    kv = await bus.js.key_value(bucket)
    out: list[tuple[str, bytes]] = []
    for key in sorted(k for k in await stored_keys(bus, bucket) if wanted(k)):
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:  # deleted: its marker is still stored
            continue
        except NatsError as exc:
            raise BusUnavailable(f"hcs: cannot read {key} of {bucket}: {exc!r}") from exc
        if entry.value:
            out.append((key, entry.value))
    return out


class Replay:
    """A watch's initial replay, measured against the keys stored before the
    watch began: done once each has been seen (with a value or deleted).
    Keys created after that count for nothing; keys purged meanwhile are
    dropped by ``keep_only`` with a fresh ``stored_keys``."""

    def __init__(self, keys: Iterable[str]) -> None:
        self.waiting = set(keys)

    @property
    def done(self) -> bool:
        return not self.waiting

    def saw(self, key: str) -> bool:
        """Note ``key`` arrived; True when that finished the replay."""
        if not self.waiting:
            return False
        self.waiting.discard(key)
        return not self.waiting

    def keep_only(self, stored: Iterable[str]) -> bool:
        """Stop waiting for keys no longer stored; True when that finished it."""
        if not self.waiting:
            return False
        self.waiting &= set(stored)
        return not self.waiting
