"""Binds compare-and-set against the node document the replica already knows
(its own last write, or the view's KV watch) instead of reading it first; a
stale one costs a failed write and a read, never a double booking, and no
refusal is taken on it without a read."""

from __future__ import annotations

from typing import Any

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import DeviceSlice, NodeReservations, PodRef, Reservation
from scheduler.booking import Booker
from scheduler.pods import PlanAnnotation
from tests.scheduler.helpers import A100_WHOLE, node_fp
from tests.scheduler.helpers import pod_info as _pod
from tests.scheduler.helpers import state_of as fleet_state

WHOLE = PlanAnnotation(**A100_WHOLE)


class CountingKV:
    """The real KV, counting reads."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.gets = kv, 0

    async def get(self, key: str) -> Any:
        self.gets += 1
        return await self.kv.get(key)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kv, name)


def _whole(name: str, index: int) -> Reservation:
    return Reservation(
        pod=PodRef(namespace="ml", name=name, uid=f"uid-{name}"),
        devices=(
            DeviceSlice(index=index, uuid=f"GPU-A100-80G-{index}", vram_mib=81920, whole=True),
        ),
        state="bound",
        time_s=1.0,
        vendor="nvidia",
        model="A100-80G",
    )


async def _setup(bus: Bus, held: int) -> tuple[Booker, CountingKV, int]:
    """gpu-1 (8 A100s) with ``held`` devices taken in KV; the view holds that
    document at its revision. Returns the booker, its KV and that revision."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    doc = NodeReservations(
        node="gpu-1", reservations=tuple(_whole(f"h{i}", i) for i in range(held))
    )
    revision = await kv.put(subjects.alloc_key("gpu-1"), messages.encode(doc))
    state = fleet_state(node_fp("gpu-1"))
    state.apply_reservations("gpu-1", doc, revision=revision)
    counting = CountingKV(kv)
    booker = Booker(bus, kv=counting, ckpt=None, state=state, kube=None, replica="r1")  # type: ignore[arg-type]
    return booker, counting, revision


async def _names(booker: Booker) -> dict[str, str]:
    doc = (await booker.read("gpu-1")).doc
    return {r.pod.name: r.state for r in (doc.reservations if doc else ())}


async def test_a_bind_on_a_known_document_reads_nothing(bus: Bus) -> None:
    booker, kv, _ = await _setup(bus, held=2)
    for i in range(3):
        assert await booker.bind(_pod(f"p{i}"), WHOLE, node="gpu-1") == ""
    assert kv.gets == 0  # reserve and mark, three pods: six writes, no read
    assert await _names(booker) == {
        "h0": "bound",
        "h1": "bound",
        "p0": "bound",
        "p1": "bound",
        "p2": "bound",
    }


async def test_a_stale_known_document_never_double_books(bus: Bus) -> None:
    booker, kv, _ = await _setup(bus, held=0)
    # another replica fills all eight devices; this view has not seen it
    full = NodeReservations(node="gpu-1", reservations=tuple(_whole(f"o{i}", i) for i in range(8)))
    await kv.kv.put(subjects.alloc_key("gpu-1"), messages.encode(full))
    error = await booker.bind(_pod("late"), WHOLE, node="gpu-1")
    assert "no longer fits" in error
    assert kv.gets >= 1  # the failed compare-and-set sent it to read
    assert "late" not in await _names(booker)


async def test_no_refusal_on_a_known_document_without_a_read(bus: Bus) -> None:
    booker, kv, _ = await _setup(bus, held=8)
    # a device freed by another replica; this view still sees the node full
    freed = NodeReservations(node="gpu-1", reservations=tuple(_whole(f"h{i}", i) for i in range(7)))
    await kv.kv.put(subjects.alloc_key("gpu-1"), messages.encode(freed))
    assert await booker.bind(_pod("fits"), WHOLE, node="gpu-1") == ""
    assert kv.gets >= 1
    assert (await _names(booker))["fits"] == "bound"
