"""The bus on a three-server JetStream cluster: R3 streams with a leader, a
connection that carries on when its server dies, compare-and-set that never
lets two writers win one revision, and a view that follows the ledger across a
change of leader."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from nats.js.errors import BadRequestError, KeyWrongLastSequenceError

from hcs_bus import messages, natsserver, settings, streams, subjects
from hcs_bus.bus import Bus, connect
from hcs_bus.errors import ConfigError
from hcs_bus.messages import NodeReservations
from hcs_bus.natsserver import NatsCluster
from hcs_bus.settings import BusSettings, SchedulerSettings
from scheduler.view.follow_loop import ClusterView
from tests.cli.running import hcs
from tests.cluster_fixture import leader_of
from tests.scheduler.helpers import node_fp, publish_fleet, until

NAMES = ["HCS_FP", "HCS_HEALTH", "HCS_ALLOC", "HCS_DLQ", "KV_hcs_alloc", "KV_hcs_ckpt"]


def _server_of(bus: Bus, cluster: NatsCluster) -> int:
    """The index of the server ``bus`` is connected to now."""
    url = bus.nc.connected_url
    assert url is not None
    return next(i for i, s in enumerate(cluster.servers) if s.port == url.port)


async def test_bus_init_with_three_replicas_puts_every_stream_on_three_servers_with_a_leader(
    nats_cluster: NatsCluster,
) -> None:
    done = await asyncio.to_thread(
        hcs, "bus", "init", "--replicas", "3", "--nats-url", nats_cluster.urls
    )
    assert done.code == 0, done.err
    assert {line.split()[0] for line in done.out.splitlines()} == set(NAMES)
    bus = await connect(BusSettings(url=nats_cluster.urls))
    try:
        for name in NAMES:
            info = await bus.js.stream_info(name)
            assert info.config.num_replicas == 3, name
            assert info.cluster is not None and info.cluster.leader, name
            peers = info.cluster.replicas or []
            assert len(peers) == 2 and all(p.current for p in peers), (name, peers)
    finally:
        await bus.nc.close()


async def test_the_ledger_bucket_is_read_from_its_leader_only(cluster_bus: Bus) -> None:
    info = await cluster_bus.js.stream_info(streams.kv_stream(streams.KV_ALLOC))
    assert info.config.allow_direct is False


async def test_a_connection_given_the_list_carries_on_when_its_server_is_killed(
    cluster_bus: Bus, nats_cluster: NatsCluster
) -> None:
    first = _server_of(cluster_bus, nats_cluster)
    nats_cluster.servers[first].signal(signal.SIGKILL)
    async with asyncio.timeout(15):
        while True:
            try:
                await cluster_bus.js.publish(
                    subjects.health("gpu-0"), b"{}", stream=streams.HEALTH, timeout=1.0
                )
                break
            except Exception:  # reconnecting, or the stream electing a leader
                await asyncio.sleep(0.1)
    assert _server_of(cluster_bus, nats_cluster) != first


async def test_two_writers_on_one_revision_of_the_replicated_ledger_never_both_win(
    cluster_bus: Bus, nats_cluster: NatsCluster
) -> None:
    # one writer per server: the revision check is the stream leader's, whoever asks
    writers = [
        await connect(BusSettings(url=s.url, name=f"writer-{i}"))
        for i, s in enumerate(nats_cluster.servers)
    ]
    try:
        kvs = [await w.js.key_value(streams.KV_ALLOC) for w in writers]
        revision = await kvs[0].put("gpu-0", b"0")
        wins = 0
        for round_ in range(30):
            tried = await asyncio.gather(
                *(
                    kv.update("gpu-0", f"{round_}:{i}".encode(), last=revision)
                    for i, kv in enumerate(kvs)
                ),
                return_exceptions=True,
            )
            won = [r for r in tried if isinstance(r, int)]
            lost = [r for r in tried if isinstance(r, KeyWrongLastSequenceError | BadRequestError)]
            assert len(won) == 1 and len(lost) == 2, tried
            wins += 1
            revision = won[0]
        assert wins == 30
    finally:
        for w in writers:
            await w.nc.close()


async def test_the_view_follows_the_ledger_across_a_change_of_leader(
    cluster_bus: Bus, cluster_settings: BusSettings, nats_cluster: NatsCluster
) -> None:
    await publish_fleet(cluster_bus, node_fp("gpu-0"))
    view = ClusterView(cluster_bus, settings=SchedulerSettings())
    await view.start()
    writer = await connect(cluster_settings, name="writer")
    try:
        await view.wait_ready(timeout_s=15)
        kv = await writer.js.key_value(streams.KV_ALLOC)
        doc = NodeReservations(node="gpu-0")
        before = await kv.put("gpu-0", messages.encode(doc))
        await until(lambda: view.state.revision_of("gpu-0") == before, timeout_s=10)
        leader = await leader_of(cluster_bus, streams.kv_stream(streams.KV_ALLOC))
        nats_cluster.by_name(leader).signal(signal.SIGKILL)
        assert await leader_of(writer, streams.kv_stream(streams.KV_ALLOC)) != leader
        after = 0
        async with asyncio.timeout(15):
            while not after:
                try:
                    after = await kv.update("gpu-0", messages.encode(doc), last=before)
                except Exception:  # the new leader not yet answering
                    await asyncio.sleep(0.2)
        await until(lambda: view.state.revision_of("gpu-0") == after, timeout_s=30)
        # and the server comes back without a restart of anything of ours
        nats_cluster.by_name(leader).start()
        await asyncio.to_thread(nats_cluster.wait_ready)
        again = await kv.update("gpu-0", messages.encode(doc), last=after)
        await until(lambda: view.state.revision_of("gpu-0") == again, timeout_s=30)
    finally:
        await view.stop()
        await writer.nc.close()


def test_a_server_list_in_the_environment_reaches_every_part_as_the_list() -> None:
    urls = "nats://10.0.0.1:4222,nats://10.0.0.2:4222,nats://10.0.0.3:4222"
    assert settings.load(env={"HCS_BUS__URL": urls}).bus.url == urls
    assert settings.load(env={"NATS_URL": urls}).bus.url == urls


def test_a_nats_server_older_than_two_ten_is_refused_naming_its_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    old = tmp_path / "nats-server"
    old.write_text("#!/bin/sh\necho 'nats-server: v2.9.10'\n")
    old.chmod(0o755)
    monkeypatch.setenv("NATS_SERVER_BIN", str(old))
    with pytest.raises(ConfigError, match=r"is nats-server 2\.9\.10; HCS needs 2\.10 or newer"):
        natsserver.binary()
