"""ComputeNode ``status.devicesOut``: which devices the healer holds out."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.messages import HealthEvent
from scheduler.report.computenode_loop import Mirror, node_status
from scheduler.view import outages
from tests.apiserver import ApiServer
from tests.deploy.test_mirroring import device, fingerprint

EIGHT = tuple(device(i) for i in range(8))


def said(
    value: str,
    *,
    device: int | None = None,
    out: str | None = None,
    at: float = 1_700_000_100.0,
    message: str = "xid 79",
) -> HealthEvent:
    return HealthEvent(
        node="gpu-node-a",
        kind="verdict",
        severity="critical",
        source="healer",
        time_s=at,
        device=device,
        verdict=value,  # type: ignore[arg-type]
        message=message,
        evidence={} if out is None else {"devices_out": out},
    )


def fold(*events: HealthEvent) -> dict[int, outages.Outage]:
    held: dict[int, outages.Outage] = {}
    for event in events:
        held = outages.track(held, event)
    return held


def test_a_failed_device_is_out_with_its_reason_and_first_time_until_it_recovers() -> None:
    first = said("failed", device=2, at=100.0)
    again = said("failed", device=2, at=200.0, message="xid 79 again")
    held = fold(first, again)
    assert held == {2: outages.Outage(2, "xid 79", 100.0)}
    assert fold(first, said("degraded", device=2)) == {}
    assert fold(first, said("healthy", device=2)) == {}


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("2", {2}),
        ("2,5", {2, 5}),
        ("", set()),  # the healer holds none out: authoritative
        (None, {2}),  # a healer that does not say: the device verdicts decide
        ("2,x", {2}),  # not a list of indices: ignored
    ],
)
def test_the_healers_list_is_authoritative_when_it_gives_one(
    out: str | None, expected: set[int]
) -> None:
    held = fold(said("failed", device=2), said("degraded", out=out))
    assert set(held) == expected


def test_a_restarted_mirror_knows_every_device_out_from_the_last_verdict_alone() -> None:
    held = fold(said("degraded", out="3,6", at=300.0))  # a node verdict, the last event
    assert [(o.index, o.reason, o.since_s) for o in held.values()] == [
        (3, "failed", 300.0),
        (6, "failed", 300.0),
    ]


def test_a_device_verdict_after_the_list_that_named_it_gives_its_reason() -> None:
    """The healer may publish the node verdict (with the list) before the device's."""
    held = fold(said("degraded", out="2", at=100.0), said("failed", device=2, at=100.5))
    assert held == {2: outages.Outage(2, "xid 79", 100.0)}


def test_other_events_change_nothing() -> None:
    agent = HealthEvent(
        node="gpu-node-a", kind="xid", severity="fatal", source="agent", time_s=1.0, device=1
    )
    action = HealthEvent(
        node="gpu-node-a", kind="action", severity="info", source="healer", time_s=1.0, device=1
    )
    assert fold(agent, action) == {}


def test_the_status_lists_the_devices_out_and_marks_them_failed() -> None:
    held = fold(said("failed", device=2, out="2"))
    status = node_status(fingerprint(devices=EIGHT), verdict=said("degraded", out="2"), out=held)
    assert status["devicesOut"] == [
        {"index": 2, "id": "GPU-2", "reason": "xid 79", "since": "2023-11-14T22:15:00Z"}
    ]
    health = [d["health"] for d in status["deviceList"]]
    assert health == ["healthy"] * 2 + ["failed"] + ["healthy"] * 5
    assert status["health"] == "degraded"  # the node is in service with seven devices
    assert node_status(fingerprint(devices=EIGHT))["devicesOut"] == []  # [] clears it


async def until(check: Any, *, timeout_s: float = 5.0) -> None:
    async with asyncio.timeout(timeout_s):
        while not check():
            await asyncio.sleep(0.02)


async def test_the_mirror_shows_a_device_out_and_clears_it_when_it_is_back(
    bus: Bus, kube: Kube, apiserver: ApiServer
) -> None:
    node = "gpu-node-a"
    await bus.publish(subjects.fp(node), fingerprint(devices=EIGHT), msg_id="o:fp")
    mirror = Mirror(bus, kube, min_interval_s=0.0)
    await mirror.start()

    def out() -> list[int] | None:
        status = apiserver.computenodes.get(node, {}).get("status", {})
        found = status.get("devicesOut")
        return None if found is None else [e["index"] for e in found]

    def health() -> object:
        return apiserver.computenodes.get(node, {}).get("status", {}).get("health")

    try:
        await until(lambda: out() == [])
        where = subjects.healer_health(node)
        await bus.publish(where, said("failed", device=2, out="2"), msg_id="o:v1")
        await bus.publish(where, said("degraded", out="2"), msg_id="o:v2")
        # the failed verdict alone already shows device 2 out: wait for the degraded one
        await until(lambda: out() == [2] and health() == "degraded")
        status = apiserver.computenodes[node]["status"]
        assert status["health"] == "degraded" and status["devicesOut"][0]["id"] == "GPU-2"
        await bus.publish(where, said("healthy", device=2, out=""), msg_id="o:v3")
        await until(lambda: out() == [])
    finally:
        await mirror.stop()
