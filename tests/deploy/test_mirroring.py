"""ComputeNode status from fingerprints and verdicts (scheduler/report/computenode_loop.py)."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import msgspec
from prometheus_client.parser import text_string_to_metric_families

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.messages import Compute, DeviceFingerprint, HealthEvent, NodeFingerprint
from hcs_bus.telemetry import metrics_text
from scheduler.report.computenode_loop import Mirror, node_status, state_of
from tests.apiserver import ApiServer


def device(index: int, *, score: int = 100, error: str | None = None) -> DeviceFingerprint:
    return DeviceFingerprint(
        index=index,
        uuid=f"GPU-{index}",
        vendor="nvidia",
        model="A100-80G",
        vram_total_mib=81920,
        vram_free_mib=40960,
        compute=Compute(acu_profile=100.0, tflops_fp16_profile=312.0),
        health_score=score,
        error=error,
    )


def fingerprint(node: str = "gpu-node-a", *, seq: int = 1, **kw: Any) -> NodeFingerprint:
    devices = kw.pop("devices", (device(0), device(1)))
    return NodeFingerprint(
        node=node,
        agent_version="0.1.0",
        boot_id="b",
        seq=seq,
        time_s=1_700_000_000.0,
        devices=devices,
        **kw,
    )


def verdict(node: str, value: str, *, device_index: int | None = None) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind="verdict",
        severity="critical",
        source="healer",
        time_s=1_700_000_100.0,
        device=device_index,
        verdict=value,  # type: ignore[arg-type]
        message="xid 79",
    )


def test_a_fingerprint_becomes_the_printer_columns_of_its_compute_node() -> None:
    status = node_status(fingerprint())
    assert (status["vendor"], status["model"], status["devices"]) == ("nvidia", "A100-80G", 2)
    assert (status["vram"], status["vramFree"], status["acu"]) == ("160Gi", "80Gi", 200.0)
    assert status["health"] == "healthy" and status["lastReport"] == "2023-11-14T22:13:20Z"
    assert [d["index"] for d in status["deviceList"]] == [0, 1] and "lastVerdict" not in status


def test_the_worst_device_or_a_node_verdict_decides_the_node_health() -> None:
    sick = fingerprint(devices=(device(0), device(1, score=50)))
    assert node_status(sick)["health"] == "degraded"
    lost = fingerprint(devices=(device(0), device(1, error="fallen off the bus")))
    assert node_status(lost)["deviceList"][1]["health"] == "failed"
    on_device = node_status(fingerprint(), verdict=verdict("gpu-node-a", "failed", device_index=1))
    assert on_device["health"] == "failed" and on_device["deviceList"][0]["health"] == "healthy"
    node_wide = node_status(sick, verdict=verdict("gpu-node-a", "healthy"))
    assert node_wide["health"] == "healthy" and node_wide["lastVerdict"]["verdict"] == "healthy"


def test_a_node_without_devices_has_unknown_health() -> None:
    status = node_status(fingerprint(devices=()))
    assert status["health"] == "unknown" and status["devices"] == 0 and status["vram"] == "0Gi"


async def until(check: Any, *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def test_the_mirror_creates_and_updates_compute_nodes_from_the_bus(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    await bus.publish(subjects.fp("gpu-node-a"), fingerprint(), msg_id="m:1")
    mirror = Mirror(bus, kube, min_interval_s=0.0)
    await mirror.start()
    try:
        await until(lambda: "gpu-node-a" in apiserver.computenodes)
        await bus.publish(
            subjects.healer_health("gpu-node-a"), verdict("gpu-node-a", "failed"), msg_id="m:v1"
        )
        await until(
            lambda: apiserver.computenodes["gpu-node-a"].get("status", {}).get("health") == "failed"
        )
    finally:
        await mirror.stop()
    status = apiserver.computenodes["gpu-node-a"]["status"]
    assert status["lastVerdict"]["message"] == "xid 79" and status["devices"] == 2


async def test_the_mirror_writes_a_busy_node_at_most_once_per_interval_but_keeps_the_latest(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    mirror = Mirror(bus, kube, min_interval_s=0.3, refresh_s=0.0)  # every report's readings
    await mirror.start()
    try:
        for seq in range(1, 21):
            await bus.publish(
                subjects.fp("gpu-node-b"), fingerprint("gpu-node-b", seq=seq), msg_id=f"b:{seq}"
            )
        await until(
            lambda: (
                apiserver.computenodes.get("gpu-node-b", {}).get("status", {}).get("observedSeq")
                == 20
            )
        )
    finally:
        await mirror.stop()
    assert 1 <= mirror.writes <= 3


async def test_nodes_arriving_while_a_write_is_under_way_are_written_too(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    """Found on a real cluster: a node first seen during another node's write
    had no write time yet and crashed the write loop (KeyError), so no other
    ComputeNode was ever written."""
    mirror = Mirror(bus, kube, min_interval_s=0.3)
    await mirror.start()
    names = [f"burst-{n}" for n in range(12)]
    try:
        await bus.publish_window([(subjects.fp(n), fingerprint(n, seq=1), f"{n}:1") for n in names])
        # The object is created first and its status written after: wait on both.
        await until(
            lambda: all(
                apiserver.computenodes.get(n, {}).get("status", {}).get("observedSeq") == 1
                for n in names
            ),
            timeout_s=10,
        )
    finally:
        await mirror.stop()
    assert set(names) <= set(apiserver.computenodes)


def written_for(reason: str) -> float:
    """``hcs_mirror_status_writes_total{reason}`` as this process exports it."""
    for family in text_string_to_metric_families(metrics_text().decode()):
        for sample in family.samples:
            if sample.name == "hcs_mirror_status_writes_total":
                if sample.labels.get("reason") == reason:
                    return float(sample.value)
    return 0.0


def status_of(apiserver: ApiServer, node: str) -> dict[str, Any]:
    found: dict[str, Any] = apiserver.computenodes.get(node, {}).get("status", {})
    return found


def busier(seq: int, **kw: Any) -> NodeFingerprint:
    """gpu-node-c's report ``seq`` with its second device's free VRAM changed."""
    second = msgspec.structs.replace(device(1), vram_free_mib=1024 * seq)
    return fingerprint("gpu-node-c", seq=seq, devices=kw.pop("devices", (device(0), second)), **kw)


def test_the_state_of_a_status_leaves_its_readings_out() -> None:
    quiet, busy = node_status(fingerprint(seq=1)), node_status(busier(7))
    assert quiet["observedSeq"] != busy["observedSeq"] and quiet["vramFree"] != busy["vramFree"]
    assert state_of(quiet) == state_of(busy)
    failing = node_status(busier(7, devices=(device(0), device(1, error="fallen off the bus"))))
    assert state_of(failing) != state_of(busy)


async def test_readings_alone_wait_for_the_refresh_but_a_failing_device_is_written_at_once(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    mirror = Mirror(bus, kube, min_interval_s=0.0, refresh_s=600.0)
    await mirror.start()
    try:
        await bus.publish(subjects.fp("gpu-node-c"), busier(1), msg_id="c:1")
        await until(lambda: status_of(apiserver, "gpu-node-c").get("observedSeq") == 1)
        await bus.publish(subjects.fp("gpu-node-c"), busier(2), msg_id="c:2")
        await until(lambda: mirror.held == 1)
        assert status_of(apiserver, "gpu-node-c")["observedSeq"] == 1 and mirror.writes == 1
        lost = (device(0), device(1, error="fallen off the bus"))
        await bus.publish(subjects.fp("gpu-node-c"), busier(3, devices=lost), msg_id="c:3")
        await until(lambda: status_of(apiserver, "gpu-node-c").get("health") == "failed")
    finally:
        await mirror.stop()
    assert status_of(apiserver, "gpu-node-c")["observedSeq"] == 3 and mirror.writes == 2


async def test_held_readings_are_written_once_the_refresh_comes_even_when_reports_stop(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    refreshes, changes = written_for("refresh"), written_for("changed")
    mirror = Mirror(bus, kube, min_interval_s=0.0, refresh_s=0.5)
    await mirror.start()
    try:
        await bus.publish(subjects.fp("gpu-node-c"), busier(1), msg_id="r:1")
        await until(lambda: status_of(apiserver, "gpu-node-c").get("observedSeq") == 1)
        first = mirror.written["gpu-node-c"]
        await bus.publish(subjects.fp("gpu-node-c"), busier(2), msg_id="r:2")
        await until(lambda: mirror.held == 1)
        await until(lambda: status_of(apiserver, "gpu-node-c").get("observedSeq") == 2)
    finally:
        await mirror.stop()
    waited = mirror.written["gpu-node-c"] - first
    assert waited >= mirror.refresh_after_s("gpu-node-c") and mirror.writes == 2
    assert written_for("refresh") == refreshes + 1 and written_for("changed") == changes + 1
    assert status_of(apiserver, "gpu-node-c")["deviceList"][1]["vramFree"] == "2Gi"


def test_each_node_has_its_own_refresh_period_so_a_fleet_written_at_once_spreads_out(
    bus: Bus, kube: Kube
) -> None:
    mirror = Mirror(bus, kube, refresh_s=300.0)
    periods = [mirror.refresh_after_s(f"node-{n}") for n in range(1000)]
    assert all(225.0 <= p <= 300.0 for p in periods)
    assert periods == [mirror.refresh_after_s(f"node-{n}") for n in range(1000)]  # fixed
    # nodes first written together: their fourth refreshes fall in every quarter of the period
    quarters = collections.Counter(int((4 * p) % 300.0 // 75.0) for p in periods)
    assert len(quarters) == 4 and min(quarters.values()) > 150, quarters
