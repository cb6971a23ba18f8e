"""Releases: explicit requests, pod watch events, and expiry of stuck reservations."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import AllocationEvent, NodeReservations, PodRef, ReleaseRequest
from scheduler.pods import PlanAnnotation, pod_info_from_dict
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_TWO, node_fp, pod, publish_fleet, until
from tests.view.factories import reservation

DEMAND = PlanAnnotation(**A100_TWO)


async def _bound(
    bus: Bus, start: Start, kube: Any = None, *, name: str = "trainer", uid: str | None = None
) -> Any:
    await publish_fleet(bus, node_fp("gpu-1"))
    sched = await start(bus, kube)
    await until(lambda: "gpu-1" in sched.view.state.nodes)
    info = pod_info_from_dict(pod(name, plan=A100_TWO, uid=uid))
    assert await sched.booker.bind(info, DEMAND, node="gpu-1") == ""
    await until(lambda: sched.view.state.find_pod(f"ml-team/{name}") is not None)
    return sched


async def test_a_release_request_frees_the_pods_devices(bus: Bus, start_scheduler: Start) -> None:
    sched = await _bound(bus, start_scheduler)
    ref = PodRef(namespace="ml-team", name="trainer", uid="uid-trainer")
    event = await bus.request(
        subjects.RELEASE, ReleaseRequest(pod=ref, reason="done"), AllocationEvent, timeout_s=5
    )
    assert event.state == "released" and event.node == "gpu-1" and len(event.devices) == 2
    doc = (await sched.booker.read("gpu-1")).doc
    assert doc is not None and doc.reservations == ()
    again = await bus.request(
        subjects.RELEASE, ReleaseRequest(pod=ref), AllocationEvent, timeout_s=5
    )
    await until(lambda: sched.view.state.find_pod("ml-team/trainer") is None)
    again = await bus.request(
        subjects.RELEASE, ReleaseRequest(pod=ref), AllocationEvent, timeout_s=5
    )
    assert again.reason == "no reservation held for this pod"


async def test_a_deleted_pod_releases_its_devices(
    bus: Bus, start_scheduler: Start, apiserver: Any, kube: Any
) -> None:
    apiserver.add_pod("ml-team", "trainer", annotations={"hcs.io/plan": json.dumps(A100_TWO)})
    uid = apiserver.pods[("ml-team", "trainer")]["metadata"]["uid"]
    sched = await _bound(bus, start_scheduler, kube, uid=uid)
    apiserver.delete_pod("ml-team", "trainer")
    await until(lambda: sched.view.state.find_pod("ml-team/trainer") is None)
    assert all(d.idle for d in sched.view.state.nodes["gpu-1"].devices.values())


async def test_a_reservation_stuck_in_reserved_expires(bus: Bus, start_scheduler: Start) -> None:
    await publish_fleet(bus, node_fp("gpu-1"))
    sub = await bus.nc.subscribe(subjects.alloc("gpu-1"))
    stuck = msgspec.structs.replace(
        reservation("ml", "lost", [(0, 81920, True)]), state="reserved", time_s=1.0
    )
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(
        subjects.alloc_key("gpu-1"),
        messages.encode(NodeReservations(node="gpu-1", reservations=(stuck,))),
    )
    sched = await start_scheduler(bus, reserve_ttl_s=0.2)
    event = messages.decode((await sub.next_msg(timeout=5)).data, AllocationEvent)
    assert event.state == "expired" and event.pod.name == "lost"
    await until(lambda: sched.view.state.find_pod("ml/lost") is None)
    await sub.unsubscribe()
