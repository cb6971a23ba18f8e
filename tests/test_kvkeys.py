"""A KV bucket's keys as the server counts them (``hcs_bus.kvkeys``), on a
real nats-server, and the replay that waits for them."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest

from hcs_bus import kvkeys, streams
from hcs_bus.bus import Bus
from hcs_bus.errors import BusUnavailable


async def test_the_stored_keys_are_every_key_written_deleted_ones_included(bus: Bus) -> None:
    assert await kvkeys.stored_keys(bus, streams.KV_ALLOC) == set()
    kv = await bus.js.key_value(streams.KV_ALLOC)
    for key in ("gpu-0", "gpu-1", "pledges=ml=ab12"):
        await kv.put(key, b"{}")
    await kv.put("gpu-0", b'{"again":1}')
    await kv.delete("gpu-1")  # a delete marker is still a message of its key
    other = await bus.js.key_value(streams.KV_CKPT)
    await other.put("ml.job", b"{}")
    assert await kvkeys.stored_keys(bus, streams.KV_ALLOC) == {"gpu-0", "gpu-1", "pledges=ml=ab12"}
    # compacted away (what purge_deletes does to an old marker): gone from the list
    await bus.js.purge_stream(
        streams.kv_stream(streams.KV_ALLOC), subject=streams.kv_subject(streams.KV_ALLOC, "gpu-1")
    )
    assert await kvkeys.stored_keys(bus, streams.KV_ALLOC) == {"gpu-0", "pledges=ml=ab12"}


async def test_a_bucket_that_does_not_exist_is_named_in_the_error(bus: Bus) -> None:
    with pytest.raises(BusUnavailable, match="keys of no_such_bucket: stream not found"):
        await kvkeys.stored_keys(bus, "no_such_bucket")


class _PagingServer:
    """Answers ``STREAM.INFO`` as nats-server does past its page limit
    (100,000 subjects): ``total``, ``offset`` and one page of ``subjects``."""

    def __init__(self, subjects: list[str], *, limit: int) -> None:
        self.subjects, self.limit = sorted(subjects), limit
        self.offsets: list[int] = []

    async def request(self, subject: str, payload: bytes, **_: float) -> Any:
        asked = json.loads(payload)
        offset = asked["offset"]
        self.offsets.append(offset)
        page = self.subjects[offset : offset + self.limit]
        answer = {
            "type": "io.nats.jetstream.api.v1.stream_info_response",
            "total": len(self.subjects),
            "offset": offset,
            "limit": self.limit,
            "state": {"messages": len(self.subjects), "subjects": dict.fromkeys(page, 1)},
        }
        return SimpleNamespace(data=json.dumps(answer).encode())


async def test_every_page_of_a_large_bucket_is_read() -> None:
    keys = {f"gpu-{i}" for i in range(7)}
    server = _PagingServer([f"$KV.hcs_alloc.{k}" for k in keys], limit=3)
    found = await kvkeys.stored_keys(SimpleNamespace(nc=server), "hcs_alloc")  # type: ignore[arg-type]
    assert found == keys
    assert server.offsets == [0, 3, 6]


def test_a_replay_is_done_once_each_stored_key_is_seen_and_keys_purged_meanwhile_are_let_go() -> (
    None
):
    replay = kvkeys.Replay({"a", "b", "c"})
    assert not replay.done
    assert replay.saw("new-since") is False  # written after the listing: counts for nothing
    assert replay.saw("a") is False
    assert replay.keep_only({"a", "b", "later"}) is False  # c was purged meanwhile
    assert replay.waiting == {"b"}
    assert replay.saw("b") is True and replay.done
    assert replay.saw("b") is False  # done once only
    assert kvkeys.Replay(()).done
