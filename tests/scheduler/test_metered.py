"""The metering service on a real nats-server: AllocationEvents published on
``hcs.alloc.<node>`` become ComputeQuota ``status.usage``, Prometheus
counters and a UsageAlert on ``hcs.usage.<namespace>``."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from hcs_bus import messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.messages import UsageAlert
from hcs_bus.telemetry import metrics_text
from scheduler.report.usage_service import Meter
from tests.allocations import allocation, publish
from tests.apiserver import ApiServer

T0 = 1_700_000_000.0


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


alloc = functools.partial(allocation, devices=2)  # two 16 GiB devices unless told


async def test_a_bound_pod_shows_up_in_its_quota_status_and_a_released_one_stops_counting(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    apiserver.add_quota("ml", "team", {"hard": {"acu": 1000, "vram": "320Gi"}})
    quota = apiserver.quotas[("ml", "team")]
    quota["status"] = {"used": {"acu": 5}}  # someone else's field: left alone
    await publish(
        bus,
        alloc("reserved", T0 - 1, pod="a"),
        alloc("bound", T0, pod="a"),
        alloc("bound", T0 + 50, pod="b", devices=1),
        alloc("released", T0 + 100, pod="a"),
    )
    clock = Clock(T0 + 200)
    meter = Meter(bus, kube, clock=clock, interval_s=3600)
    await meter.start()
    try:
        await asyncio.wait_for(meter.caught_up.wait(), 5)
        await meter.tick()
        usage = apiserver.quotas[("ml", "team")]["status"]["usage"]
        # a: 2 devices × 100 s; b: 1 device × 150 s (still held)
        assert usage["deviceSeconds"] == 350.0 and usage["acuSeconds"] == 35_000.0
        assert usage["vramGiBSeconds"] == 350.0 * 16
        assert usage["held"] == {"devices": 1, "vram": "16Gi", "acu": 100.0}
        assert usage["quotaShare"] == 0.1
        assert [m["model"] for m in usage["byModel"]] == ["A100-80G"]
        assert apiserver.quotas[("ml", "team")]["status"]["used"] == {"acu": 5}

        await publish(bus, alloc("released", T0 + 300, pod="b", devices=1))
        clock.now = T0 + 1000
        await until(lambda: not meter.lifetimes.open)
        await meter.tick()
        usage = apiserver.quotas[("ml", "team")]["status"]["usage"]
        assert usage["deviceSeconds"] == 450.0 and usage["held"]["devices"] == 0
    finally:
        await meter.stop()


async def test_the_usage_counters_are_exported_for_prometheus(bus: Bus) -> None:
    await publish(bus, alloc("bound", T0, pod="p", namespace="metrics-ns"))
    meter = Meter(bus, None, clock=Clock(T0 + 30), interval_s=3600)
    await meter.start()
    try:
        await asyncio.wait_for(meter.caught_up.wait(), 5)
        text = metrics_text().decode()
    finally:
        await meter.stop()
    lines = [line for line in text.splitlines() if 'namespace="metrics-ns"' in line]
    device = [line for line in lines if line.startswith("hcs_usage_device_seconds_total")]
    assert device and float(device[0].split()[-1]) == 60.0, lines
    assert any(line.startswith("hcs_usage_acu_seconds_total") for line in lines), lines
    assert any(line.startswith("hcs_usage_vram_byte_seconds_total") for line in lines), lines


async def test_a_namespace_passing_its_quota_share_is_alerted_once(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    apiserver.add_quota("tight", "small", {"hard": {"acu": 400}})
    heard: list[UsageAlert] = []
    got = asyncio.Event()

    async def on_msg(msg: Any) -> None:
        heard.append(messages.decode(msg.data, UsageAlert))
        got.set()

    sub = await bus.nc.subscribe(subjects.USAGE_ALL, cb=on_msg)
    await publish(bus, alloc("bound", T0, pod="big", namespace="tight", devices=4))
    meter = Meter(bus, kube, clock=Clock(T0 + 10), interval_s=3600)
    await meter.start()
    try:
        await asyncio.wait_for(meter.caught_up.wait(), 5)
        await meter.tick()
        await asyncio.wait_for(got.wait(), 5)
        await meter.tick()  # still over: no second alert
        await bus.nc.flush()
    finally:
        await meter.stop()
        await sub.unsubscribe()
    assert len(heard) == 1 and meter.alerts == 1
    alert = heard[0]
    assert (alert.namespace, alert.resource, alert.share) == ("tight", "acu", 1.0)
    assert alert.acu_hard == 400.0 and alert.held_devices == 4


async def until(check: Any, *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)
