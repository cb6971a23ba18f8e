"""``hcs check`` on a real bus and the API-server double: every inconsistency
between the ledger and the pods is printed and the status says whether any."""

from __future__ import annotations

import json
from typing import Any

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import DeviceSlice, NodeReservations, PodRef, Reservation
from scheduler.ledger import audit_store as checking
from tests.scheduler.helpers import A100_TWO, node_fp, publish_fleet

ONE = {**A100_TWO, "devices": 1}


def _notes(device: int) -> dict[str, str]:
    return {
        "hcs.io/devices": f"GPU-A100-80G-{device}",
        "hcs.io/vram-quota": "0:81920Mi",
        "hcs.io/plan": json.dumps(ONE),
    }


def _held(name: str, uid: str, device: int) -> Reservation:
    return Reservation(
        pod=PodRef(namespace="ml", name=name, uid=uid),
        devices=(DeviceSlice(index=device, uuid="", vram_mib=81920, whole=True),),
        state="bound",
        time_s=1.0,
    )


async def _ledger(bus: Bus, *held: Reservation, node: str = "gpu-1") -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    doc = NodeReservations(node=node, reservations=held)
    await kv.put(subjects.alloc_key(node), messages.encode(doc))


def _bound(apiserver: Any, name: str, *, node: str, device: int) -> str:
    apiserver.add_pod("ml", name, node=node, annotations=_notes(device))
    return str(apiserver.pods[("ml", name)]["metadata"]["uid"])


async def test_check_prints_every_inconsistency_and_fails(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    await publish_fleet(bus, node_fp("gpu-1"), node_fp("gpu-2"))
    ok = _bound(apiserver, "ok", node="gpu-1", device=0)
    _bound(apiserver, "unbooked", node="gpu-1", device=1)
    moved = _bound(apiserver, "moved", node="gpu-2", device=2)
    shared_a = _bound(apiserver, "shared-a", node="gpu-1", device=3)
    shared_b = _bound(apiserver, "shared-b", node="gpu-1", device=3)
    await _ledger(
        bus,
        _held("ok", ok, 0),
        _held("gone", "uid-gone", 4),
        _held("moved", moved, 2),
        _held("shared-a", shared_a, 3),
        _held("shared-b", shared_b, 3),
    )
    lines: list[str] = []
    assert await checking.run(bus, kube, settle_s=0.05, out=lines.append) == 1
    text = "\n".join(lines)
    assert "bound pod without reservation: node gpu-1 ml/unbooked" in text
    assert "bound pod without reservation: node gpu-2 ml/moved" in text
    assert "reservation without pod: node gpu-1 ml/gone" in text
    assert "reservation on another node: node gpu-1 ml/moved" in text
    assert "pod is bound to gpu-2" in text
    assert "device over-committed: node gpu-1: in the ledger: device 3" in text
    assert "device over-committed: node gpu-1: by the pods' annotations: device 3" in text
    assert "ml/ok" not in text
    assert text.endswith("6 inconsistencies")


async def test_check_passes_when_ledger_and_pods_agree(bus: Bus, apiserver: Any, kube: Any) -> None:
    await publish_fleet(bus, node_fp("gpu-1"))
    uid = _bound(apiserver, "ok", node="gpu-1", device=0)
    apiserver.add_pod("ml", "plain", node="gpu-1")  # no HCS devices: none of the ledger's business
    await _ledger(bus, _held("ok", uid, 0))
    lines: list[str] = []
    assert await checking.run(bus, kube, settle_s=0.05, out=lines.append) == 0
    assert lines == ["ledger and pods agree: no inconsistency"]


async def test_check_on_an_empty_ledger_and_cluster_passes(bus: Bus, kube: Any) -> None:
    assert await checking.check(bus, kube, settle_s=0) == []


class _Settling:
    """A pod list that shows a bind under way once, then the settled cluster."""

    def __init__(self, first: list[dict[str, Any]], then: list[dict[str, Any]]) -> None:
        self.answers = [first, then]

    async def list_pods(self, **_kw: Any) -> list[dict[str, Any]]:
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


async def test_a_bind_under_way_during_the_first_reading_is_not_reported(bus: Bus) -> None:
    await publish_fleet(bus, node_fp("gpu-1"))
    await _ledger(bus, _held("new", "uid-new", 0))
    pod = {
        "metadata": {"namespace": "ml", "name": "new", "uid": "uid-new", "annotations": _notes(0)},
        "spec": {"nodeName": "gpu-1"},
        "status": {"phase": "Running"},
    }
    kube = _Settling(first=[], then=[pod])  # listed before it existed, then bound
    assert await checking.check(bus, kube, settle_s=0.01) == []  # type: ignore[arg-type]
