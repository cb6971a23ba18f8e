"""A three-server JetStream cluster on loopback (``hcs_bus.natsserver.NatsCluster``),
one per test: each server has its own store, client, route and monitoring port;
``nats_cluster.urls`` is the comma-separated list the parts connect with.
``cluster_bus`` is a connection on it with every stream and bucket at three
replicas, and ``leader_of`` names the server that leads a stream now."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from hcs_bus import streams
from hcs_bus.bus import Bus, connect
from hcs_bus.natsserver import NatsCluster
from hcs_bus.settings import BusSettings


@pytest.fixture
async def nats_cluster() -> AsyncIterator[NatsCluster]:
    cluster = await NatsCluster(size=3).astart()
    try:
        yield cluster
    finally:
        await asyncio.to_thread(cluster.cleanup)


@pytest.fixture
def cluster_settings(nats_cluster: NatsCluster) -> BusSettings:
    return BusSettings(
        url=nats_cluster.urls,
        name="hcs-test",
        replicas=3,
        reconnect_wait_s=0.2,
        connect_timeout_s=1.0,
        ping_interval_s=1.0,
    )


@pytest.fixture
async def cluster_bus(cluster_settings: BusSettings) -> AsyncIterator[Bus]:
    bus = await connect(cluster_settings)
    outcomes = await streams.init(bus, cluster_settings)
    assert all(o.action == "created" for o in outcomes), streams.render(outcomes)
    yield bus
    await bus.nc.close()


async def leader_of(bus: Bus, stream: str, *, timeout_s: float = 15.0) -> str:
    """The name of the server leading ``stream`` (waits out an election)."""
    async with asyncio.timeout(timeout_s):
        while True:
            try:
                info = await bus.js.stream_info(stream)
            except Exception:  # no leader to answer yet; the API times out
                await asyncio.sleep(0.2)
                continue
            if info.cluster is not None and info.cluster.leader:
                return info.cluster.leader
            await asyncio.sleep(0.2)
