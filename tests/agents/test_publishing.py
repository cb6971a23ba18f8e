"""A simulated fleet on a real nats-server; the outbox across a server restart."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from agents import fleet as fleet_file
from agents.reporting import Publisher, Reporter
from agents.running import run_fleet
from hcs_bus import messages, streams, subjects
from hcs_bus import settings as hcs_settings
from hcs_bus.bus import Bus, connect
from hcs_bus.messages import HealthEvent, NodeFingerprint
from hcs_bus.natsserver import NatsServer, free_port
from hcs_bus.settings import BusSettings
from tests.agents.test_changes import dev

FLEET = """
report_interval_s: 0.3
nodes:
  - name: sim-a100
    network_group: ng-a
    devices: {model: nvidia/A100-80G, count: 4}
    failures:
      - {at_s: 0.2, device: 2, kind: xid, code: 79}
      - {at_s: 0.2, device: 1, kind: slow, to: 0.6}
  - name: sim-910b.rack1
    network_group: ng-b
    devices: {model: huawei/Ascend910B2, count: 8}
    failures:
      - {at_s: 0.3, device: 0, kind: fall_off_bus}
"""


async def until(check: Callable[[], bool], *, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


async def collect(bus: Bus, subject: str, into: list) -> object:
    async def on(msg) -> None:
        kind = NodeFingerprint if msg.subject.startswith(subjects.FP_PREFIX) else HealthEvent
        into.append((msg.subject, messages.decode_strict(msg.data, kind), msg.headers or {}))

    return await bus.nc.subscribe(subject, cb=on)


async def test_a_simulated_fleet_publishes_every_node_and_its_scripted_failures(bus, db) -> None:
    spec = fleet_file.loads(FLEET, db=db)
    got: list = []
    sub_fp = await collect(bus, subjects.FP_ALL, got)
    sub_h = await collect(bus, subjects.HEALTH_ALL, got)
    settings = hcs_settings.Settings(kube=hcs_settings.KubeSettings(mode="none"))
    task = asyncio.get_running_loop().create_task(
        run_fleet(bus, spec, settings=settings, tick_s=0.05)
    )
    fps = lambda node: [m for s, m, _ in got if s == subjects.fp(node)]  # noqa: E731
    health = lambda node: [m for s, m, _ in got if s == subjects.health(node)]  # noqa: E731
    try:
        await until(
            lambda: (
                len(fps("sim-a100")) >= 3
                and len(fps("sim-910b.rack1")) >= 3
                and health("sim-a100")
                and health("sim-910b.rack1")
            )
        )
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub_fp.unsubscribe()
        await sub_h.unsubscribe()
    a100 = fps("sim-a100")
    assert [f.seq for f in a100] == sorted({f.seq for f in a100}) and a100[0].seq == 1
    assert len({f.boot_id for f in a100}) == 1 and a100[0].simulated
    assert a100[0].labels["hcs.io/network-group"] == "ng-a"
    assert a100[0].labels["hcs.io/model"] == "A100-80G"
    xid = health("sim-a100")[0]
    assert (xid.kind, xid.code, xid.severity, xid.device) == ("xid", 79, "fatal", 2)
    assert xid.id == f"sim-a100:{a100[0].boot_id}:h1"
    slow = a100[-1].devices[1].telemetry.achieved_tflops_fp16
    healthy = a100[-1].devices[0].telemetry.achieved_tflops_fp16
    assert slow is not None and healthy is not None and 0.55 < slow / healthy < 0.65
    lost = health("sim-910b.rack1")[0]
    assert (lost.kind, lost.severity, lost.device) == ("device_lost", "fatal", 0)
    assert fps("sim-910b.rack1")[-1].devices[0].error
    headers = [h for s, _, h in got if s == subjects.fp("sim-a100")]
    assert headers[0]["Nats-Msg-Id"] == f"sim-a100:{a100[0].boot_id}:1"
    stored = await bus.js.get_last_msg(streams.FP, subjects.fp("sim-910b.rack1"))
    assert messages.decode(stored.data, NodeFingerprint).node == "sim-910b.rack1"


async def test_no_health_event_is_lost_across_a_nats_server_restart(tmp_path) -> None:
    server = NatsServer(port=free_port(), store_dir=tmp_path / "store").start()
    settings = BusSettings(url=server.url, name="agent-restart", reconnect_wait_s=0.1)
    bus = await connect(settings)
    await streams.init(bus, settings)
    publisher = Publisher(bus, capacity=50, retry_s=0.05)
    reporter = Reporter(publisher, node="n-restart", report_interval_s=0.1)
    draining = asyncio.get_running_loop().create_task(publisher.run())
    event = HealthEvent(node="n-restart", kind="xid", severity="fatal", source="agent", time_s=1.0)
    try:
        reporter.offer([dev(0)], now=1.0, loop_s=0.0)
        reporter.health(event)
        assert await publisher.flush(timeout_s=5)
        server.stop()
        await until(lambda: not bus.connected, timeout_s=5)
        for n in range(2, 12):  # produced while the server is down
            reporter.health(event)
            reporter.offer([dev(0, vram_free_mib=n * 5000)], now=n, loop_s=float(n))
        await asyncio.sleep(0.3)
        assert len(publisher.outbox) > 0
        server.start()
        assert await publisher.flush(timeout_s=20), "outbox not drained after restart"
        info = await bus.js.stream_info(streams.HEALTH)
        assert info.state.messages == 11
        ids = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            stored = await bus.js.get_msg(streams.HEALTH, seq)
            ids.append(messages.decode(stored.data, HealthEvent).id)
        boot = reporter.boot_id
        assert ids == [f"n-restart:{boot}:h{n}" for n in range(1, 12)]
        last = await bus.js.get_last_msg(streams.FP, subjects.fp("n-restart"))
        assert messages.decode(last.data, NodeFingerprint).seq == reporter.seq
    finally:
        draining.cancel()
        await asyncio.gather(draining, return_exceptions=True)
        await bus.nc.close()
        server.cleanup()
