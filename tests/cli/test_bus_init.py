"""``hcs bus init`` says what it did to each stream and bucket, truthfully."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Iterator

import pytest
from nats.js.api import StorageType, StreamConfig

from hcs_bus import streams
from hcs_bus.bus import connect
from hcs_bus.natsserver import NatsCluster, NatsServer
from hcs_bus.settings import BusSettings
from tests.cli.running import CEILING_S, hcs

NAMES = ["HCS_FP", "HCS_HEALTH", "HCS_ALLOC", "HCS_DLQ", "KV_hcs_alloc", "KV_hcs_ckpt"]


@pytest.fixture
def empty_url() -> Iterator[str]:
    """A nats-server -js of this test's own: nothing created on it yet."""
    server = NatsServer().start()
    try:
        yield server.url
    finally:
        server.cleanup()


def _actions(out: str) -> dict[str, str]:
    return {line.split()[0]: line.split(maxsplit=1)[1] for line in out.strip().splitlines()}


def test_a_first_run_creates_everything_and_a_second_changes_nothing(empty_url: str) -> None:
    first = hcs("bus", "init", "--nats-url", empty_url)
    second = hcs("bus", "init", "--nats-url", empty_url)
    assert first.code == 0 and second.code == 0, first.err + second.err
    assert _actions(first.out) == dict.fromkeys(NAMES, "created")
    assert _actions(second.out) == dict.fromkeys(NAMES, "unchanged")
    assert second.seconds < CEILING_S


def test_a_stream_changed_by_hand_is_updated_back_and_named_with_the_change(
    empty_url: str,
) -> None:
    assert hcs("bus", "init", "--nats-url", empty_url).code == 0

    async def shrink_health() -> None:
        bus = await connect(BusSettings(url=empty_url))
        info = await bus.js.stream_info(streams.HEALTH)
        await bus.js.update_stream(dataclasses.replace(info.config, max_msgs_per_subject=5))
        await bus.nc.close()

    asyncio.run(shrink_health())
    done = hcs("bus", "init", "--nats-url", empty_url)
    assert done.code == 0, done.err
    actions = _actions(done.out)
    assert actions.pop("HCS_HEALTH") == "updated (max_msgs_per_subject 5 → 10000)"
    assert set(actions.values()) == {"unchanged"}


def test_replicas_are_applied_to_every_stream_and_bucket(nats_cluster: NatsCluster) -> None:
    urls = nats_cluster.urls
    assert hcs("bus", "init", "--nats-url", urls).code == 0
    done = hcs("bus", "init", "--replicas", "3", "--nats-url", urls)
    assert done.code == 0, done.err
    assert _actions(done.out) == dict.fromkeys(NAMES, "updated (num_replicas 1 → 3)")


def test_three_replicas_on_a_single_server_are_refused_with_the_servers_reason(
    empty_url: str,
) -> None:
    done = hcs("bus", "init", "--replicas", "3", "--nats-url", empty_url)
    assert done.code == 1
    assert set(_actions(done.out).values()) == {
        "refused (replicas > 1 not supported in non-clustered mode)"
    }


def test_a_change_the_server_refuses_is_reported_and_exits_1(empty_url: str) -> None:
    async def make_fp_in_memory() -> None:
        bus = await connect(BusSettings(url=empty_url))
        await bus.js.add_stream(
            StreamConfig(name=streams.FP, subjects=["hcs.fp.*"], storage=StorageType.MEMORY)
        )
        await bus.nc.close()

    asyncio.run(make_fp_in_memory())
    done = hcs("bus", "init", "--nats-url", empty_url)
    assert done.code == 1, done.out + done.err
    actions = _actions(done.out)
    assert actions.pop("HCS_FP").startswith("refused (")
    assert set(actions.values()) == {"created"}
    assert "Traceback" not in done.err


def test_compact_purges_the_ledgers_delete_markers_and_keeps_live_keys(empty_url: str) -> None:
    """Released claims and pledges leave delete markers that every watch
    replays; the operator's ``hcs bus compact`` purges them (no part may)."""
    assert hcs("bus", "init", "--nats-url", empty_url).code == 0

    async def stage() -> tuple[int, list[str]]:
        bus = await connect(BusSettings(url=empty_url), name="stage")
        try:
            kv = await bus.js.key_value(streams.KV_ALLOC)
            for i in range(5):
                await kv.put(f"claims=ml=p{i}", b"{}")
            for i in range(4):
                await kv.delete(f"claims=ml=p{i}")
            await kv.put("gpu-0", b"{}")
            return (await kv.status()).values, sorted(await kv.keys())
        finally:
            await bus.nc.close()

    before, keys = asyncio.run(stage())
    assert before == 6 and keys == ["claims=ml=p4", "gpu-0"]
    done = hcs("bus", "compact", "--older-than-s", "0", "--nats-url", empty_url)
    assert done.code == 0, done.err
    assert "hcs_alloc: 4 delete markers purged, 2 entries kept" in done.out
    assert asyncio.run(stage())[1] == ["claims=ml=p4", "gpu-0"]
