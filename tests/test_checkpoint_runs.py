"""KV ``hcs_ckpt`` on a real nats-server: an entry per job run, expiring after
``bus.checkpoint_ttl_s``, and ``streams.init`` brings an existing bucket's
TTL in line with the settings."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import pytest
from nats.js.errors import KeyNotFoundError

from hcs_bus import checkpoint, streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.natsserver import NatsServer
from hcs_bus.settings import BusSettings
from healer.checkpointing import Sidecar


@pytest.fixture
async def fresh() -> AsyncIterator[tuple[Bus, BusSettings]]:
    """A nats-server of this test's own, nothing created on it yet."""
    server = NatsServer().start()
    settings = BusSettings(url=server.url)
    bus = await connect(settings, name="test")
    try:
        yield bus, settings
    finally:
        await bus.nc.close()
        server.cleanup()


async def test_the_checkpoint_bucket_expires_entries_after_the_configured_ttl(
    fresh: tuple[Bus, BusSettings],
) -> None:
    bus, settings = fresh
    assert settings.checkpoint_ttl_s == 7 * 24 * 3600.0
    await streams.init(bus, settings)
    info = await bus.js.stream_info(streams.kv_stream(streams.KV_CKPT))
    assert info.config.max_age == settings.checkpoint_ttl_s
    assert info.config.max_msgs_per_subject == 1


async def test_init_sets_the_ttl_of_a_checkpoint_bucket_made_without_one(
    fresh: tuple[Bus, BusSettings],
) -> None:
    bus, settings = fresh
    [*_, ckpt] = streams.kv_configs(settings)
    assert ckpt.bucket == streams.KV_CKPT
    await bus.js.create_key_value(dataclasses.replace(ckpt, ttl=None))
    outcomes = {o.name: o for o in await streams.init(bus, settings)}
    done = outcomes[streams.kv_stream(streams.KV_CKPT)]
    assert done.action == "updated" and "max_age 0s → 604800s" in done.detail
    again = {o.name: o.action for o in await streams.init(bus, settings)}
    assert again[streams.kv_stream(streams.KV_CKPT)] == "unchanged"


async def test_a_run_checkpoint_is_gone_once_its_ttl_passes(
    fresh: tuple[Bus, BusSettings],
) -> None:
    bus, settings = fresh
    short = msgspec.structs.replace(settings, checkpoint_ttl_s=1.0)
    await streams.init(bus, short)
    await checkpoint.report(bus, namespace="ml", job="llama", run="r1", uri="s3://c/1", step=1)
    kv = await bus.js.key_value(streams.KV_CKPT)
    await kv.get(subjects.ckpt_key("ml", "llama", "r1"))  # there now
    async with asyncio.timeout(10):
        while True:
            try:
                await kv.get(subjects.ckpt_key("ml", "llama", "r1"))
            except KeyNotFoundError:
                break
            await asyncio.sleep(0.1)
    assert await checkpoint.latest(bus, namespace="ml", job="llama") is None


async def test_each_run_keeps_its_own_checkpoint_and_the_newest_of_any_run_is_found(
    fresh: tuple[Bus, BusSettings],
) -> None:
    bus, settings = fresh
    await streams.init(bus, settings)
    await checkpoint.report(bus, namespace="ml", job="llama", run="r1", uri="s3://r1/9", step=9)
    await checkpoint.report(bus, namespace="ml", job="llama", run="r2", uri="s3://r2/1", step=1)
    one = await checkpoint.latest(bus, namespace="ml", job="llama", run="r1")
    two = await checkpoint.latest(bus, namespace="ml", job="llama", run="r2")
    assert one is not None and (one.uri, one.run) == ("s3://r1/9", "r1")
    assert two is not None and (two.uri, two.run) == ("s3://r2/1", "r2")
    assert await checkpoint.latest(bus, namespace="ml", job="llama", run="r3") is None
    newest = await checkpoint.latest(bus, namespace="ml", job="llama")
    assert newest is not None and newest.uri == "s3://r2/1"  # the last written, of any run
    assert subjects.ckpt_key("ml", "llama") == "ml.llama._"  # no run known: one placeholder


async def test_the_sidecar_reports_what_it_finds_under_its_jobs_run(
    fresh: tuple[Bus, BusSettings], tmp_path: Path
) -> None:
    bus, settings = fresh
    await streams.init(bus, settings)
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text("{}")
    sidecar = Sidecar(bus, root=tmp_path, namespace="ml", job="llama", run="uid-9")
    found = await sidecar.scan_once()
    assert found is not None and found.step == 5
    got = await checkpoint.latest(bus, namespace="ml", job="llama", run="uid-9")
    assert got is not None and got.step == 5 and got.run == "uid-9"
    assert await checkpoint.latest(bus, namespace="ml", job="llama", run="") is None
