"""Binds compare-and-set against the node document the replica already knows
(its own last write, or the view's KV watch) instead of reading it first; a
stale one costs a failed write and a read, never a double booking, and no
refusal is taken on it without a read. Binds on one node at once share their
writes (``scheduler.ledger.group_commit``); a lost compare-and-set applies the whole
batch again to the winner's document."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import DeviceSlice, NodeReservations, PodRef, Reservation
from scheduler.ledger import reservation_store as booking
from scheduler.ledger.reservation_store import Booker
from scheduler.plan.pods import PlanAnnotation
from tests.scheduler.helpers import A100_WHOLE, node_fp, until
from tests.scheduler.helpers import pod_info as _pod
from tests.scheduler.helpers import state_of as fleet_state

WHOLE = PlanAnnotation(**A100_WHOLE)


class CountingKV:
    """The real KV, counting reads and compare-and-set writes; ``before_update``
    runs before the write it is given (another replica's write, say)."""

    def __init__(self, kv: Any) -> None:
        self.kv, self.gets, self.updates = kv, 0, 0
        self.before_update: dict[int, Any] = {}  # write number -> coroutine function

    async def get(self, key: str) -> Any:
        self.gets += 1
        return await self.kv.get(key)

    async def update(self, key: str, value: bytes, last: int | None = None) -> int:
        self.updates += 1
        if (meddle := self.before_update.pop(self.updates, None)) is not None:
            await meddle()
        return int(await self.kv.update(key, value, last=last))

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
    await booker.settle()
    assert kv.gets == 0  # reserve and mark, three pods: no read
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
    await booker.settle()
    assert (await _names(booker))["fits"] == "bound"


async def test_binds_on_one_node_at_once_share_their_writes(bus: Bus) -> None:
    booker, kv, _ = await _setup(bus, held=0)
    names = [f"p{i}" for i in range(6)]
    errors = await asyncio.gather(*(booker.bind(_pod(n), WHOLE, node="gpu-1") for n in names))
    assert errors == [""] * 6
    await booker.settle()
    doc = (await booker.read("gpu-1")).doc
    assert doc is not None
    assert {r.pod.name: r.state for r in doc.reservations} == dict.fromkeys(names, "bound")
    devices = [d.index for r in doc.reservations for d in r.devices]
    assert sorted(devices) == sorted(set(devices))  # no device given twice
    # one write per change would be 12 (a reserve and a mark each), more with
    # the conflicts of writes racing one another
    assert kv.updates < 12
    assert booker.batches.changes == 12
    assert booker.batches.batches < 12


async def test_a_lost_compare_and_set_applies_the_whole_batch_again(bus: Bus) -> None:
    booker, kv, _ = await _setup(bus, held=0)
    key = subjects.alloc_key("gpu-1")

    async def other_replica_takes_five() -> None:
        entry = await kv.kv.get(key)
        doc = messages.decode(entry.value, NodeReservations)
        others = tuple(_whole(f"o{i}", i) for i in range(1, 6))  # p0 holds device 0
        taken = NodeReservations(node="gpu-1", reservations=(*doc.reservations, *others))
        await kv.kv.update(key, messages.encode(taken), last=entry.revision)

    # write 1: p0's reserve alone; write 2: the batch of the three others,
    # which loses to the other replica and is applied again to its document
    kv.before_update[2] = other_replica_takes_five
    first = asyncio.create_task(booker._reserve(_pod("p0"), WHOLE, node="gpu-1"))
    rest = [booker._reserve(_pod(n), WHOLE, node="gpu-1") for n in ("p1", "p2", "p3")]
    got = await asyncio.gather(first, *rest)
    assert kv.gets >= 1  # the lost write sent the batch to read
    kept = [g for g in got if not isinstance(g, str)]
    refused = [g for g in got if isinstance(g, str)]
    assert len(kept) == 3 and len(refused) == 1  # 8 devices: 5 others', 3 left
    assert "no longer fits" in refused[0]
    doc = (await booker.read("gpu-1")).doc
    assert doc is not None and len(doc.reservations) == 8
    devices = [d.index for r in doc.reservations for d in r.devices]
    assert sorted(devices) == list(range(8))


async def test_a_bound_pods_mark_rides_the_next_reserve_of_its_node(bus: Bus) -> None:
    """The bind answers once the Binding is posted; the mark is not a write of
    its own under a burst: it goes with the node's next one."""
    booker, kv, _ = await _setup(bus, held=0)
    assert await booker.bind(_pod("p0"), WHOLE, node="gpu-1") == ""
    assert await _names(booker) == {"p0": "reserved"}  # safe: expiry reads the pod
    assert await booker.bind(_pod("p1"), WHOLE, node="gpu-1") == ""
    assert kv.updates == 2  # two reserves, p0's mark with the second
    assert await _names(booker) == {"p0": "bound", "p1": "reserved"}


async def test_a_mark_no_write_takes_is_written_within_a_second(bus: Bus) -> None:
    booker, _kv, _ = await _setup(bus, held=0)
    assert await booker.bind(_pod("p0"), WHOLE, node="gpu-1") == ""
    await until(lambda: _state_of(booker, "p0") == "bound", timeout_s=booking.MARK_AFTER_S + 5)


def _state_of(booker: Booker, name: str) -> str | None:
    doc = booker.known("gpu-1")
    held = doc.doc.reservations if doc is not None and doc.doc is not None else ()
    return next((r.state for r in held if r.pod.name == name), None)
