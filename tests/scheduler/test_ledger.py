"""Crash-safe booking: a reservation whose pod is bound to its node is never
expired, the reconcile rebuilds the ledger from the pods' annotations and
reports what it cannot undo. Pure rules first, then a replica on the bus and
the API-server double."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator, MutableMapping
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import KubeNotFound
from hcs_bus.messages import AllocationEvent, DeviceSlice, NodeReservations, PodRef, Reservation
from hcs_bus.telemetry import metrics_text
from scheduler.ledger import audit_rules as ledger
from scheduler.ledger import release_loop as watching
from scheduler.ledger import reservation_store as booking
from scheduler.ledger.reservation_store import Booker
from scheduler.plan.pods import PlanAnnotation, pod_info_from_dict
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import A100_SLICE, A100_TWO, dev, node_fp, pod, publish_fleet
from tests.scheduler.helpers import state_of as fleet_state

Logs = list[MutableMapping[str, Any]]
DEVICES = {d.index: d for d in node_fp("gpu-1").devices}
TWO = "GPU-A100-80G-0,GPU-A100-80G-1"
WHOLE_TWO = {
    "hcs.io/devices": TWO,
    "hcs.io/vram-quota": "0:81920Mi,1:81920Mi",
    "hcs.io/plan": json.dumps(A100_TWO),
}


def _api_pod(
    name: str, *, node: str | None, notes: dict[str, str] | None = None, phase: str = "Running"
) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeName": node} if node else {}
    return {
        "metadata": {
            "namespace": "ml",
            "name": name,
            "uid": f"uid-{name}",
            "annotations": dict(notes or {}),
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def _held(name: str, slices: list[tuple[int, int, bool]], state: str = "bound") -> Reservation:
    return Reservation(
        pod=PodRef(namespace="ml", name=name, uid=f"uid-{name}"),
        devices=tuple(
            DeviceSlice(index=i, uuid=f"GPU-A100-80G-{i}", vram_mib=m, whole=w)
            for i, m, w in slices
        ),
        state=state,  # type: ignore[arg-type]
        time_s=1.0,
        vendor="nvidia",
        model="A100-80G",
    )


# ------------------------------------------------------------ pure rules --


def test_a_claim_is_read_from_a_bound_pods_annotations_and_rebuilt_as_a_bound_reservation() -> None:
    claim = ledger.claim_of(_api_pod("p", node="gpu-1", notes=WHOLE_TWO))
    assert claim is not None and claim.node == "gpu-1" and claim.vram_mib == (81920, 81920)
    rebuilt = ledger.rebuilt(claim, DEVICES, now=7.0)
    assert rebuilt.state == "bound" and rebuilt.time_s == 7.0
    assert [(s.index, s.vram_mib, s.whole) for s in rebuilt.devices] == [
        (0, 81920, True),
        (1, 81920, True),
    ]
    assert (rebuilt.vendor, rebuilt.model, rebuilt.acu) == ("nvidia", "A100-80G", 200.0)
    assert rebuilt.pledge == ""
    # the pod's pledge goes on the rebuilt reservation: it retires the pledge
    pledged = _api_pod("p", node="gpu-1", notes={**WHOLE_TWO, "hcs.io/pledge": "p7"})
    assert ledger.rebuilt(ledger.claim_of(pledged), DEVICES, now=7.0).pledge == "p7"  # type: ignore[arg-type]
    by_index = {"hcs.io/devices": "3", "hcs.io/vram-quota": "0:16384Mi"}  # other vendors
    slice_ = ledger.rebuilt(
        ledger.claim_of(_api_pod("q", node="gpu-1", notes=by_index)), DEVICES, now=0
    )  # type: ignore[arg-type]
    assert [(s.index, s.vram_mib, s.whole) for s in slice_.devices] == [(3, 16384, False)]


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (_api_pod("p", node=None, notes=WHOLE_TWO), "not bound yet"),
        (_api_pod("p", node="gpu-1"), "not bound by HCS"),
        (_api_pod("p", node="gpu-1", notes=WHOLE_TWO, phase="Succeeded"), "finished"),
    ],
)
def test_a_pod_not_bound_by_hcs_or_finished_claims_nothing(pod: dict[str, Any], why: str) -> None:
    assert ledger.claim_of(pod) is None, why


@pytest.mark.parametrize(
    "notes",
    [
        {"hcs.io/devices": "0,1", "hcs.io/vram-quota": "0:1024Mi"},
        {"hcs.io/devices": "0", "hcs.io/vram-quota": "0:lots"},
    ],
)
def test_unreadable_device_annotations_are_named(notes: dict[str, str]) -> None:
    with pytest.raises(ledger.BadClaim, match="vram-quota"):
        ledger.claim_of(_api_pod("p", node="gpu-1", notes=notes))


def test_a_claim_naming_no_device_of_its_node_is_refused() -> None:
    claim = ledger.claim_of(
        _api_pod("p", node="gpu-1", notes={**WHOLE_TWO, "hcs.io/devices": "GPU-x,GPU-y"})
    )
    assert claim is not None
    with pytest.raises(ledger.BadClaim, match="GPU-x"):
        ledger.rebuilt(claim, DEVICES, now=0.0)


@pytest.mark.parametrize(
    ("pod", "verdict"),
    [
        (_api_pod("p", node="gpu-1"), "bound"),
        (None, "expire"),
        (_api_pod("p", node=None), "expire"),
        (_api_pod("p", node="gpu-2"), "expire"),
        (_api_pod("p", node="gpu-1", phase="Failed"), "expire"),
        (
            {
                **_api_pod("p", node="gpu-1"),
                "metadata": {"namespace": "ml", "name": "p", "uid": "new"},
            },
            "expire",
        ),
    ],
    ids=["bound-here", "gone", "pending", "bound-elsewhere", "finished", "replaced"],
)
def test_a_stuck_reservation_expires_unless_its_pod_is_bound_to_its_node(
    pod: dict[str, Any] | None, verdict: str
) -> None:
    stuck = _held("p", [(0, 81920, True)], state="reserved")
    assert ledger.expiry_verdict(stuck, pod, node="gpu-1") == verdict


def test_an_overcommit_is_more_vram_than_the_device_has_or_a_whole_device_shared() -> None:
    totals = {0: 81920, 1: 81920}
    fits = [
        ("a", DeviceSlice(index=0, uuid="", vram_mib=40960)),
        ("b", DeviceSlice(index=0, uuid="", vram_mib=40960)),
    ]
    assert ledger.overcommitted("n", fits, totals) == []
    over = [*fits, ("c", DeviceSlice(index=0, uuid="", vram_mib=1))]
    [found] = ledger.overcommitted("n", over, totals)
    assert (found.index, found.vram_mib, found.holders) == (0, 81921, ("a", "b", "c"))
    shared = [
        ("a", DeviceSlice(index=1, uuid="", vram_mib=81920, whole=True)),
        ("b", DeviceSlice(index=1, uuid="", vram_mib=0)),
    ]
    assert [o.index for o in ledger.overcommitted("n", shared, totals)] == [1]


def test_slices_over_what_the_driver_leaves_are_over_committed_a_whole_device_is_not() -> None:
    # a 910B whose driver holds 3,161 MiB: four 16 GiB slices fit its 64 GiB
    # total, not the 62,375 MiB it can be promised
    fp = node_fp("npu", devices=(dev(0, "huawei/Ascend910B2", driver_mib=3161),)).devices[0]
    totals = {0: fp.vram_usable_mib}
    four = [(f"p{i}", DeviceSlice(index=0, uuid="", vram_mib=16384)) for i in range(4)]
    [found] = ledger.overcommitted("n", four, totals)
    assert (found.vram_mib, found.total_mib) == (65536, 62375)
    assert ledger.overcommitted("n", four[:3], totals) == []
    # booked whole before the driver's hold was known: the slice names the total
    whole = [("w", DeviceSlice(index=0, uuid="", vram_mib=65536, whole=True))]
    assert ledger.overcommitted("n", whole, totals) == []


def test_inconsistencies_name_every_kind_of_disagreement() -> None:
    docs = {
        "gpu-1": NodeReservations(
            node="gpu-1",
            reservations=(
                _held("ok", [(0, 81920, True)]),
                _held("gone", [(1, 81920, True)]),
                _held("moved", [(2, 81920, True)]),
                _held("a", [(3, 81920, True)]),
                _held("b", [(3, 81920, True)]),
            ),
        )
    }
    notes = lambda i: {  # noqa: E731
        "hcs.io/devices": f"GPU-A100-80G-{i}",
        "hcs.io/vram-quota": "0:81920Mi",
        "hcs.io/plan": json.dumps({**A100_TWO, "devices": 1}),
    }
    pods_now = [
        _api_pod("ok", node="gpu-1", notes=notes(0)),
        _api_pod("moved", node="gpu-2", notes={**notes(2), "hcs.io/devices": "2"}),
        _api_pod("a", node="gpu-1", notes=notes(3)),
        _api_pod("b", node="gpu-1", notes=notes(3)),
        _api_pod("unbooked", node="gpu-1", notes=notes(0)),
    ]
    problems = ledger.inconsistencies(
        docs=docs, pods_now=pods_now, devices={"gpu-1": DEVICES, "gpu-2": DEVICES}
    )
    found = {(p.kind, p.node, p.pod) for p in problems}
    assert ("reservation without pod", "gpu-1", "ml/gone") in found
    assert ("reservation on another node", "gpu-1", "ml/moved") in found
    assert ("bound pod without reservation", "gpu-2", "ml/moved") in found
    assert ("bound pod without reservation", "gpu-1", "ml/unbooked") in found
    over = [p for p in problems if p.kind == "device over-committed"]
    assert {p.detail.split(":")[0] for p in over} == {"in the ledger", "by the pods' annotations"}
    assert all("device 3" in p.detail or "device 0" in p.detail for p in over)
    assert "ml/ok" not in {p.pod for p in problems}
    consistent = ledger.inconsistencies(
        docs={
            "gpu-1": NodeReservations(node="gpu-1", reservations=(_held("ok", [(0, 81920, True)]),))
        },
        pods_now=[pods_now[0]],
        devices={"gpu-1": DEVICES},
    )
    assert consistent == []


# -------------------------------------------------- a booker on the bus --


async def _booker(bus: Bus, kube: Any, *docs: NodeReservations, clock: float = 1000.0) -> Booker:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet_state(node_fp("gpu-1"), node_fp("gpu-2"))
    for doc in docs:
        await kv.put(subjects.alloc_key(doc.node), messages.encode(doc))
        state.apply_reservations(doc.node, doc)
    return Booker(bus, kv=kv, ckpt=None, state=state, kube=kube, replica="r1", clock=lambda: clock)


def _states(doc: NodeReservations | None) -> dict[str, str]:
    return {r.pod.name: r.state for r in (doc.reservations if doc else ())}


async def test_a_reserved_reservation_whose_pod_is_bound_to_its_node_is_marked_bound_not_expired(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    for name, node in [("bound", "gpu-1"), ("pending", None), ("elsewhere", "gpu-2")]:
        apiserver.add_pod(
            "ml", name, node=node, uid=f"uid-{name}", phase="Running" if node else "Pending"
        )
    stuck = [
        _held(n, [(i, 81920, True)], state="reserved")
        for i, n in enumerate(["bound", "pending", "elsewhere", "gone"])
    ]
    booker = await _booker(bus, kube, NodeReservations(node="gpu-1", reservations=tuple(stuck)))
    sub = await bus.nc.subscribe(subjects.alloc("gpu-1"))
    assert await booker.expire(ttl_s=60) == 3
    assert _states((await booker.read("gpu-1")).doc) == {"bound": "bound"}
    events = [
        messages.decode((await sub.next_msg(timeout=5)).data, AllocationEvent) for _ in range(4)
    ]
    assert sorted((e.pod.name, e.state) for e in events) == [
        ("bound", "bound"),
        ("elsewhere", "expired"),
        ("gone", "expired"),
        ("pending", "expired"),
    ]
    await sub.unsubscribe()


async def test_a_reservation_is_kept_while_its_pod_cannot_be_read(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    stuck = _held("p", [(0, 81920, True)], state="reserved")
    booker = await _booker(bus, kube, NodeReservations(node="gpu-1", reservations=(stuck,)))
    apiserver.fail("get", "pods", code=503, times=20)
    assert await booker.expire(ttl_s=60) == 0
    assert _states((await booker.read("gpu-1")).doc) == {"p": "reserved"}


async def test_a_crash_between_binding_and_mark_leaves_no_double_booking(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    """Reserve and POST the Binding, then 'crash' (no mark): past the TTL the
    reservation is marked bound, and the devices are not handed out again."""
    apiserver.add_pod(
        "ml", "trainer", phase="Pending", annotations={"hcs.io/plan": json.dumps(A100_TWO)}
    )
    uid = apiserver.pods[("ml", "trainer")]["metadata"]["uid"]
    booker = await _booker(bus, kube)
    info = pod_info_from_dict(pod("trainer", namespace="ml", uid=uid, plan=A100_TWO))
    demand = PlanAnnotation(**A100_TWO)
    reserved = await booker._reserve(info, demand, node="gpu-1")
    assert isinstance(reserved, Reservation)
    note, _annotations = await booker._post_binding(info, reserved, node="gpu-1", vendor="nvidia")
    assert note == "" and apiserver.pods[("ml", "trainer")]["spec"]["nodeName"] == "gpu-1"
    booker.clock = lambda: reserved.time_s + 61  # type: ignore[method-assign]
    booker.state.apply_reservations("gpu-1", (await booker.read("gpu-1")).doc)
    assert await booker.expire(ttl_s=60) == 0
    doc = (await booker.read("gpu-1")).doc
    assert _states(doc) == {"trainer": "bound"}
    booker.state.apply_reservations("gpu-1", doc)
    other = pod_info_from_dict(
        pod("other", namespace="ml", uid="uid-other", plan={**A100_TWO, "devices": 7})
    )
    refused = await booker._reserve(
        other, PlanAnnotation(**{**A100_TWO, "devices": 7}), node="gpu-1"
    )
    assert isinstance(refused, str) and "no longer fits" in refused


class _ExpiringKube:
    """Posts the Binding while another replica expires the reservation; the pod
    is then bound to gpu-1, or gone (``deleted``: deleted right after)."""

    def __init__(self, kv: Any, *, deleted: bool = False) -> None:
        self.kv, self.deleted = kv, deleted
        self.bound: dict[str, Any] | None = None

    async def bind_pod(self, namespace: str, name: str, *, uid: str, **_kw: Any) -> Any:
        await self.kv.put(
            subjects.alloc_key("gpu-1"), messages.encode(NodeReservations(node="gpu-1"))
        )
        self.bound = pod(name, namespace=namespace, uid=uid, plan=A100_TWO)
        self.bound["spec"]["nodeName"] = "gpu-1"
        return {"kind": "Status", "status": "Success"}

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        if self.bound is None or self.deleted:
            raise KubeNotFound(f"pod {namespace}/{name} not found")
        return self.bound


async def test_a_reservation_expired_while_the_binding_was_on_its_way_comes_back_bound(
    bus: Bus,
) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet_state(node_fp("gpu-1"))
    booker = Booker(bus, kv=kv, ckpt=None, state=state, kube=_ExpiringKube(kv), replica="r1")  # type: ignore[arg-type]
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    assert await booker.bind(info, PlanAnnotation(**A100_TWO), node="gpu-1") == ""
    await booker.settle()
    doc = (await booker.read("gpu-1")).doc
    assert _states(doc) == {"trainer": "bound"}
    assert doc is not None and [s.index for s in doc.reservations[0].devices] == [0, 1]


async def test_a_mark_never_brings_back_the_reservation_of_a_pod_deleted_meanwhile(
    bus: Bus,
) -> None:
    """The mark is written after the bind answers: by then another replica may
    have released the pod's reservation because the pod was deleted."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    state = fleet_state(node_fp("gpu-1"))
    kube = _ExpiringKube(kv, deleted=True)
    booker = Booker(bus, kv=kv, ckpt=None, state=state, kube=kube, replica="r1")  # type: ignore[arg-type]
    info = pod_info_from_dict(pod("trainer", plan=A100_TWO))
    assert await booker.bind(info, PlanAnnotation(**A100_TWO), node="gpu-1") == ""
    await booker.settle()
    assert _states((await booker.read("gpu-1")).doc) == {}
    kube.deleted = False  # the same pod, still bound: its devices come back
    assert await booker.bind(info, PlanAnnotation(**A100_TWO), node="gpu-1") == ""
    await booker.settle()
    assert _states((await booker.read("gpu-1")).doc) == {"trainer": "bound"}


# ------------------------------------------------------------ reconcile --


@pytest.fixture
def logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Logs]:
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as entries:
            monkeypatch.setattr(booking, "_log", structlog.get_logger("hcs.scheduler.booking"))
            monkeypatch.setattr(watching, "_log", structlog.get_logger("hcs.scheduler.watching"))
            yield entries
    finally:
        structlog.configure(**saved)


def _overcommits(node: str) -> float:
    page = metrics_text().decode()
    pattern = rf'^hcs_scheduler_overcommitted_devices_total\{{[^}}]*node="{node}"[^}}]*\}} (\S+)$'
    found = re.search(pattern, page, re.M)
    return float(found.group(1)) if found else 0.0


async def test_a_replica_is_ready_only_once_the_reservation_of_a_bound_pod_is_rebuilt(
    bus: Bus, start_scheduler: Start, apiserver: Any, kube: Any
) -> None:
    await publish_fleet(bus, node_fp("gpu-1"))
    apiserver.add_pod("ml", "trainer", node="gpu-1", annotations=WHOLE_TWO)
    sub = await bus.nc.subscribe(subjects.alloc("gpu-1"))
    apiserver.fail("list", "pods", code=503, times=2)  # the first reconcile is tried again
    sched = await start_scheduler(bus, kube)  # returns once ready: the reconcile came first
    doc = (await sched.booker.read("gpu-1")).doc  # before a bind could hand the devices out
    assert doc is not None
    [held] = doc.reservations
    uid = apiserver.pods[("ml", "trainer")]["metadata"]["uid"]
    assert held.state == "bound" and held.pod.uid == uid
    assert [(s.index, s.whole) for s in held.devices] == [(0, True), (1, True)]
    event = messages.decode((await sub.next_msg(timeout=5)).data, AllocationEvent)
    assert event.state == "bound" and "rebuilt" in event.reason
    assert await watching.reconcile(kube, sched.booker) == 0  # nothing left to repair
    await sub.unsubscribe()


async def test_reconcile_records_an_overcommit_it_cannot_undo_as_an_error_and_a_metric(
    bus: Bus, apiserver: Any, kube: Any, logs: Logs
) -> None:
    slice_notes = {
        "hcs.io/devices": "GPU-A100-80G-0",
        "hcs.io/vram-quota": "0:61440Mi",
        "hcs.io/plan": json.dumps({**A100_SLICE, "vram_mib_per_device": 61440}),
    }
    apiserver.add_pod("ml", "first", node="gpu-1", annotations=slice_notes, uid="uid-first")
    apiserver.add_pod("ml", "second", node="gpu-1", annotations=slice_notes, uid="uid-second")
    first = _held("first", [(0, 61440, False)])
    booker = await _booker(bus, kube, NodeReservations(node="gpu-1", reservations=(first,)))
    before = _overcommits("gpu-1")
    assert await watching.reconcile(kube, booker) == 1
    doc = (await booker.read("gpu-1")).doc
    assert _states(doc) == {"first": "bound", "second": "bound"}  # the ledger says what is in use
    errors = [e for e in logs if e["event"] == "device_overcommitted"]
    assert errors and errors[0]["log_level"] == "error" and errors[0]["device"] == 0
    assert "122880 MiB of 81920 MiB" in errors[0]["detail"]
    assert _overcommits("gpu-1") == before + 1


async def test_reconcile_releases_a_reservation_on_a_node_its_pod_is_not_bound_to(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    notes = {"hcs.io/devices": "GPU-A100-80G-0", "hcs.io/vram-quota": "0:81920Mi"}
    apiserver.add_pod("ml", "p", node="gpu-1", annotations=notes, uid="uid-p")
    here = NodeReservations(node="gpu-1", reservations=(_held("p", [(0, 81920, True)]),))
    there = NodeReservations(
        node="gpu-2", reservations=(_held("p", [(5, 81920, True)], state="reserved"),)
    )
    booker = await _booker(bus, kube, here, there)
    assert await watching.reconcile(kube, booker) == 1
    assert _states((await booker.read("gpu-2")).doc) == {}
    assert _states((await booker.read("gpu-1")).doc) == {"p": "bound"}


async def test_reconcile_restores_nothing_for_a_pod_gone_since_the_list(
    bus: Bus, apiserver: Any, kube: Any
) -> None:
    apiserver.add_pod("ml", "p", node="gpu-1", annotations=WHOLE_TWO, uid="uid-p")
    booker = await _booker(bus, kube)
    listed = await kube.list_pods()
    apiserver.delete_pod("ml", "p")
    [claim] = watching.unbooked(booker.state, listed)
    assert await watching._restore(kube, booker, claim) == 0
    assert (await booker.read("gpu-1")).doc is None


def test_an_unmarked_reservation_is_still_unbooked() -> None:
    state = fleet_state(node_fp("gpu-1"))
    state.apply_reservations(
        "gpu-1",
        NodeReservations(node="gpu-1", reservations=(_held("p", [(0, 81920, True)], "reserved"),)),
    )
    bound = _api_pod(
        "p", node="gpu-1", notes={"hcs.io/devices": "0", "hcs.io/vram-quota": "0:81920Mi"}
    )
    assert [c.pod.name for c in watching.unbooked(state, [bound])] == ["p"]
    state.apply_reservations(
        "gpu-1",
        NodeReservations(node="gpu-1", reservations=(_held("p", [(0, 81920, True)]),)),
    )
    assert watching.unbooked(state, [bound]) == []


@pytest.mark.parametrize(
    ("pod", "outcome"),
    [
        (None, "elsewhere"),  # gone
        ({"metadata": {"uid": "u1"}, "spec": {"nodeName": "gpu-1"}}, "bound"),
        ({"metadata": {"uid": "u1"}, "spec": {"nodeName": "gpu-2"}}, "elsewhere"),
        ({"metadata": {"uid": "u2"}, "spec": {"nodeName": "gpu-1"}}, "elsewhere"),  # replaced
        ({"metadata": {"uid": "u1"}, "spec": {}}, "unknown"),  # the Binding may yet land
        (
            {
                "metadata": {"uid": "u1"},
                "spec": {"nodeName": "gpu-1"},
                "status": {"phase": "Failed"},
            },
            "elsewhere",
        ),
    ],
)
def test_a_failed_binding_frees_devices_only_when_the_pod_is_surely_not_on_the_node(
    pod: dict[str, Any] | None, outcome: str
) -> None:
    ref = PodRef(namespace="ml", name="p", uid="u1")
    assert ledger.binding_outcome(ref, pod, node="gpu-1") == outcome
