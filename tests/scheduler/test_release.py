"""Releases: explicit requests, pod watch events, and expiry of stuck reservations."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import nats.errors

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import KubeConflict, KubeUnavailable
from hcs_bus.messages import AllocationEvent, NodeReservations, PodRef, ReleaseRequest
from scheduler.ledger import release_loop as watching
from scheduler.ledger.reservation_store import Booker
from scheduler.plan.pods import PlanAnnotation, pod_info_from_dict
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import (
    A100_TWO,
    FakeKube,
    node_fp,
    pod,
    publish_fleet,
    state_of,
    until,
)
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
    await until(lambda: sched.view.state.find_pod("ml-team/trainer") is None)
    again = await bus.request(
        subjects.RELEASE, ReleaseRequest(pod=ref), AllocationEvent, timeout_s=5
    )
    assert again.reason == "no reservation held for this pod"


async def test_a_deleted_pod_releases_its_devices(
    bus: Bus, start_scheduler: Start, apiserver: Any, kube: Any
) -> None:
    notes = {"hcs.io/plan": json.dumps(A100_TWO)}
    apiserver.add_pod("ml-team", "trainer", annotations=notes, scheduler_name="hcs-scheduler")
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


class _RefusingKube(FakeKube):
    async def bind_pod(self, namespace: str, name: str, **_kw: Any) -> Any:
        raise KubeConflict(f"pod {namespace}/{name} is already bound")


async def test_a_failed_binding_gives_the_devices_back_before_the_view_has_seen_them(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    view = state_of(node_fp("gpu-1"))  # never fed from KV: the view lags behind
    booker = Booker(bus, kv=kv, ckpt=None, state=view, kube=_RefusingKube(), replica="r1")
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    error = await booker.bind(info, DEMAND, node="gpu-1")
    assert "Binding failed" in error and "already bound" in error
    doc = (await booker.read("gpu-1")).doc
    assert doc is not None and doc.reservations == ()


class _TimingOutKube(FakeKube):
    """The Binding's POST times out; whether it landed shows only on the pod."""

    def __init__(self, *, lands: bool) -> None:
        super().__init__()
        self.lands = lands

    async def bind_pod(self, namespace: str, name: str, **kw: Any) -> Any:
        if self.lands:
            self.pods[(namespace, name)] = {
                "metadata": {"namespace": namespace, "name": name, "uid": kw["uid"]},
                "spec": {"nodeName": kw["node"]},
                "status": {"phase": "Pending"},
            }
        else:
            self.pods[(namespace, name)] = {
                "metadata": {"namespace": namespace, "name": name, "uid": kw["uid"]},
                "spec": {},
                "status": {"phase": "Pending"},
            }
        raise KubeUnavailable(
            f"bind pod {namespace}/{name}: API server unreachable: TimeoutError()"
        )


async def test_a_binding_that_timed_out_but_landed_keeps_its_devices_bound(bus: Bus) -> None:
    """Measured in bench.burst: releasing on a timed-out Binding that had in fact
    landed handed the same devices out again (35 devices over-committed)."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    booker = Booker(
        bus,
        kv=kv,
        ckpt=None,
        state=state_of(node_fp("gpu-1")),
        kube=_TimingOutKube(lands=True),
        replica="r1",
    )
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    assert await booker.bind(info, DEMAND, node="gpu-1") == ""
    await booker.settle()
    doc = (await booker.read("gpu-1")).doc
    assert doc is not None and [r.state for r in doc.reservations] == ["bound"]


async def test_a_binding_that_timed_out_with_the_pod_unbound_holds_until_expiry_reads_it(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    kube = _TimingOutKube(lands=False)
    booker = Booker(
        bus, kv=kv, ckpt=None, state=state_of(node_fp("gpu-1")), kube=kube, replica="r1"
    )
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    error = await booker.bind(info, DEMAND, node="gpu-1")
    assert "Binding failed" in error and "TimeoutError" in error
    doc = (await booker.read("gpu-1")).doc
    assert doc is not None and [r.state for r in doc.reservations] == ["reserved"]
    # the Binding lands late: expiry finds the pod on the node and keeps it bound
    kube.pods[("ml-team", "trainer")]["spec"]["nodeName"] = "gpu-1"
    held = doc.reservations[0]
    assert await booker._expire_one(held, node="gpu-1", ttl_s=0.0) is False
    doc = (await booker.read("gpu-1")).doc
    assert doc is not None and [r.state for r in doc.reservations] == ["bound"]


class _UnreachableKV:
    async def get(self, key: str) -> Any:
        raise nats.errors.TimeoutError

    async def create(self, key: str, value: bytes) -> Any:
        raise nats.errors.TimeoutError


async def test_bind_answers_a_clear_error_when_the_reservation_bucket_is_unreachable(
    bus: Bus,
) -> None:
    view = state_of(node_fp("gpu-1"))
    booker = Booker(bus, kv=_UnreachableKV(), ckpt=None, state=view, kube=None, replica="r1")  # type: ignore[arg-type]
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    error = await booker.bind(info, DEMAND, node="gpu-1")
    assert error.startswith(("hcs: cannot read", "hcs: cannot write")) and "gpu-1" in error


async def test_a_corrupt_reservation_document_is_named_not_taken_for_bad_arguments(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    await kv.put(subjects.alloc_key("gpu-1"), b"{not json")
    booker = Booker(bus, kv=kv, ckpt=None, state=state_of(node_fp("gpu-1")), kube=None, replica="r")
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    error = await booker.bind(info, DEMAND, node="gpu-1")
    assert "corrupt" in error and subjects.alloc_key("gpu-1") in error


async def test_a_pod_deleted_while_no_replica_watched_is_released_at_start(
    bus: Bus, start_scheduler: Start, apiserver: Any, kube: Any
) -> None:
    await publish_fleet(bus, node_fp("gpu-1"))
    apiserver.add_pod("ml", "kept")
    uid = apiserver.pods[("ml", "kept")]["metadata"]["uid"]
    kept = msgspec.structs.replace(
        reservation("ml", "kept", [(0, 81920, True)]),
        pod=PodRef(namespace="ml", name="kept", uid=uid),
    )
    gone = reservation("ml", "gone", [(1, 81920, True)])
    kv = await bus.js.key_value(streams.KV_ALLOC)
    doc = NodeReservations(node="gpu-1", reservations=(kept, gone))
    await kv.put(subjects.alloc_key("gpu-1"), messages.encode(doc))
    sched = await start_scheduler(bus, kube)
    await until(lambda: sched.view.state.find_pod("ml/gone") is None)
    held = (await sched.booker.read("gpu-1")).doc
    assert held is not None and [r.pod.name for r in held.reservations] == ["kept"]


def test_orphans_are_reservations_of_pods_gone_replaced_or_finished() -> None:
    def api_pod(name: str, uid: str, phase: str = "Running") -> dict[str, Any]:
        return {
            "metadata": {"namespace": "ml", "name": name, "uid": uid},
            "status": {"phase": phase},
        }

    def held(name: str, uid: str) -> tuple[str, Any]:
        r = reservation("ml", name, [(0, 1024, False)])
        return "n1", msgspec.structs.replace(r, pod=PodRef(namespace="ml", name=name, uid=uid))

    pods = [api_pod("alive", "u1"), api_pod("replaced", "u3"), api_pod("done", "u4", "Succeeded")]
    found = watching.orphans(
        [held("alive", "u1"), held("gone", "u2"), held("replaced", "u2"), held("done", "u4")], pods
    )
    assert [(r.pod.name, why) for _n, r, why in found] == [
        ("gone", "pod gone"),
        ("replaced", "pod gone"),
        ("done", "pod succeeded"),
    ]
