"""Per-device isolation through the healer service (real nats-server, API
double): a failed device is out and its pods evicted, the node stays in
service until a node-wide fault or too large a share of its devices is out."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from tests.apiserver import ApiServer
from tests.healer import test_healing
from tests.healer.conftest import bound, fingerprint, health
from tests.healer.test_healing import Make, collect, our_taint, publish, ready, wait_until

make = test_healing.make  # the healer fixture of test_healing, small windows

EIGHT = 8


def evicted(api: ApiServer) -> set[str]:
    return {r.path.split("/")[-2] for r in api.requests if r.resource == "pods/eviction"}


def healer_verdicts(events: list[dict[str, Any]], node: str) -> list[dict[str, Any]]:
    return [
        e
        for e in events
        if e["node"] == node and e["source"] == "healer" and e["kind"] == "verdict"
    ]


async def pods_on_every_device(bus: Bus, api: ApiServer, node: str) -> None:
    api.add_node(node)
    for index in range(EIGHT):
        api.add_pod("ml", f"p{index}", node=node, uid=f"uid-p{index}")
        await publish(bus, bound(node, f"p{index}", (index,)), subjects.alloc(node))
    await publish(bus, fingerprint(node, devices=EIGHT), subjects.fp(node))


async def test_one_failed_device_of_eight_is_isolated_and_the_node_stays_in_service(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    await pods_on_every_device(bus, apiserver, "n1")
    healer = await make(kube)
    await ready(healer)
    events, sub = await collect(bus, "hcs.health.*")
    await publish(bus, health("n1", code=79, device=2), subjects.health("n1"))
    await wait_until(lambda: ("ml", "p2") not in apiserver.pods)
    await wait_until(lambda: any(v.get("device") is None for v in healer_verdicts(events, "n1")))
    await healer.actor.wait_evictions()
    assert evicted(apiserver) == {"p2"}
    assert our_taint(apiserver, "n1") is None
    assert not [r for r in apiserver.requests if r.resource == "nodes" and r.verb == "patch"]
    verdicts = healer_verdicts(events, "n1")
    device = next(v for v in verdicts if v.get("device") == 2)
    node = next(v for v in verdicts if v.get("device") is None)
    assert device["verdict"] == "failed"
    assert node["verdict"] == "degraded"  # in service with seven devices, not failed
    assert node["evidence"]["node_verdict"] == "degraded"
    assert node["evidence"]["devices_out"] == device["evidence"]["devices_out"] == "2"
    assert healer.nodes["n1"].failed == {2} and healer.nodes["n1"].effect == ""
    await sub.unsubscribe()


async def test_the_node_is_tainted_when_half_of_its_devices_are_out(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    await pods_on_every_device(bus, apiserver, "n1")
    healer = await make(kube)  # the default share: 0.5
    await ready(healer)
    for index in range(3):
        await publish(bus, health("n1", code=79, device=index), subjects.health("n1"))
    await wait_until(lambda: evicted(apiserver) == {"p0", "p1", "p2"})
    assert our_taint(apiserver, "n1") is None  # three of eight
    await publish(bus, health("n1", code=79, device=3), subjects.health("n1"))
    await wait_until(lambda: our_taint(apiserver, "n1") is not None)
    assert our_taint(apiserver, "n1")["effect"] == "NoSchedule"  # type: ignore[index]
    await wait_until(lambda: ("ml", "p3") not in apiserver.pods)
    await healer.actor.wait_evictions()
    assert evicted(apiserver) == {"p0", "p1", "p2", "p3"}  # the healthy devices' pods stay
    assert {("ml", f"p{i}") for i in range(4, EIGHT)} <= set(apiserver.pods)


async def test_a_node_wide_fault_with_a_device_index_taints_and_empties_the_node(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    await pods_on_every_device(bus, apiserver, "n1")
    healer = await make(kube)
    await ready(healer)
    event = health("n1", kind="nvswitch_down", device=3, severity="fatal")
    await publish(bus, event, subjects.health("n1"))
    await wait_until(lambda: our_taint(apiserver, "n1") is not None)
    assert our_taint(apiserver, "n1")["effect"] == "NoSchedule"  # type: ignore[index]
    await wait_until(lambda: len(evicted(apiserver)) == EIGHT)
    assert healer.nodes["n1"].verdict == "failed"


async def test_a_node_wide_fault_is_untainted_after_the_recovery_window_of_healthy_reports(
    bus: Bus, kube: Kube, apiserver: ApiServer, make: Make
) -> None:
    apiserver.add_node("n1")
    await publish(bus, fingerprint("n1", devices=EIGHT), subjects.fp("n1"))
    healer = await make(kube)
    await ready(healer)
    event = health("n1", kind="driver_failure", device=None, severity="fatal")
    await publish(bus, event, subjects.health("n1"))
    await wait_until(lambda: our_taint(apiserver, "n1") is not None)
    for seq in range(2, 80):  # the node reports healthy for longer than the window (0.6 s)
        await publish(bus, fingerprint("n1", devices=EIGHT, seq=seq), subjects.fp("n1"))
        if our_taint(apiserver, "n1") is None:
            break
        await asyncio.sleep(0.05)
    await wait_until(lambda: our_taint(apiserver, "n1") is None)
    assert healer.nodes["n1"].verdict == "healthy"
