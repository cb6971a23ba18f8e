"""``hcs check``: the ledger (KV ``hcs_alloc``) against the pods' ``hcs.io/*``
annotations, every inconsistency on one line (``scheduler.ledger``): a bound
pod without a reservation, a reservation without its pod, a reservation on a
node its pod is not bound to, an over-committed device. Exit status 1 when
there is any, 0 when the two agree.

The ledger, the pods and the devices are read twice, ``settle_s`` apart, and
only what both readings show is reported, so a bind or a release under way
while the check reads is not taken for a fault.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError, NoKeysError, NotFoundError

from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BadMessage, BusUnavailable
from hcs_bus.messages import DeviceFingerprint, NodeFingerprint, NodeReservations
from scheduler import ledger
from scheduler.booking import Kube

_DOC = messages.decoder_for(NodeReservations)
_FP = messages.decoder_for(NodeFingerprint)


async def read_ledger(bus: Bus) -> dict[str, NodeReservations]:
    """Every node's reservations document (node → document)."""
    kv = await bus.js.key_value(streams.KV_ALLOC)
    try:
        keys = await kv.keys()
    except NoKeysError:
        return {}
    except NatsError as exc:
        raise BusUnavailable(f"hcs: cannot list {streams.KV_ALLOC}: {exc!r}") from exc
    out: dict[str, NodeReservations] = {}
    for key in keys:
        if "=" in key:  # not a node: pledges (``scheduler.pledges``)
            continue
        try:
            entry = await kv.get(key)
        except KeyNotFoundError:
            continue
        if not entry.value:
            continue
        try:
            doc = _DOC.decode(entry.value)
        except msgspec.MsgspecError as exc:
            raise BadMessage(f"hcs: {streams.KV_ALLOC} key {key} is corrupt: {exc}") from exc
        out[doc.node] = doc
    return out


async def read_devices(bus: Bus, nodes: set[str]) -> dict[str, dict[int, DeviceFingerprint]]:
    """The devices of each node from its latest fingerprint (absent: unknown)."""
    out: dict[str, dict[int, DeviceFingerprint]] = {}
    for node in sorted(nodes):
        try:
            msg = await bus.js.get_last_msg(streams.FP, subjects.fp(node))
        except NotFoundError:
            continue
        try:
            fp = _FP.decode(msg.data or b"")
        except msgspec.MsgspecError:
            continue
        out[node] = {d.index: d for d in fp.devices}
    return out


async def inconsistencies(bus: Bus, kube: Kube) -> list[ledger.Problem]:
    """One reading: the ledger first, then the pods, then the devices."""
    docs = await read_ledger(bus)
    pods_now = await kube.list_pods()
    nodes = set(docs) | {n for n in (ledger.node_of(p) for p in pods_now) if n}
    devices = await read_devices(bus, nodes)
    return ledger.inconsistencies(docs=docs, pods_now=pods_now, devices=devices)


async def check(bus: Bus, kube: Kube, *, settle_s: float = 1.0) -> list[ledger.Problem]:
    """The inconsistencies that two readings ``settle_s`` apart both show."""
    first = await inconsistencies(bus, kube)
    if not first or settle_s <= 0:
        return first
    await asyncio.sleep(settle_s)
    again = {_key(p) for p in await inconsistencies(bus, kube)}
    return [p for p in first if _key(p) in again]


def _key(problem: ledger.Problem) -> tuple[str, str, str]:
    return problem.kind, problem.node, problem.pod


def render(problems: list[ledger.Problem]) -> str:
    if not problems:
        return "ledger and pods agree: no inconsistency"
    lines = [p.line() for p in sorted(problems, key=lambda p: (p.kind, p.node, p.pod))]
    return "\n".join([*lines, f"{len(problems)} inconsistencies"])


async def run(
    bus: Bus, kube: Kube, *, settle_s: float = 1.0, out: Callable[[str], Any] = print
) -> int:
    """``hcs check``: print every inconsistency; 1 when any, else 0."""
    problems = await check(bus, kube, settle_s=settle_s)
    out(render(problems))
    return 1 if problems else 0
