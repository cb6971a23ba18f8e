"""``hcs check``: the ledger (KV ``hcs_alloc``) against the pods' ``hcs.io/*``
annotations, every inconsistency on one line (``scheduler.ledger.audit_rules``): a bound
pod without a reservation, a reservation without its pod, a reservation on a
node its pod is not bound to, an over-committed device; and the pledges
against the pods (``scheduler.ledger.pledge_audit_rules``): a pledge carried by a pod it
is not for, a bound pod whose pledge is unspent, a spent pledge whose pod is
gone, an unspent pledge the sweep should have dropped, a pod that spent two.
Exit status 1 when there is any, 0 when the two agree.

Pledges are read in both forms: ``pledges=<namespace>`` (a namespace's
``NamespacePledges``) and ``pledges=<namespace>=<id>`` (one ``Pledge``).

The ledger, the pods and the devices are read twice, ``settle_s`` apart, and
only what both readings show is reported, so a bind or a release under way
while the check reads is not taken for a fault.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from nats.js.errors import NotFoundError

from hcs_bus import kvkeys, messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BadMessage
from hcs_bus.messages import DeviceFingerprint, NodeFingerprint, NodeReservations
from hcs_bus.settings import SchedulerSettings
from scheduler.ledger import audit_rules as ledger
from scheduler.ledger import pledge_audit_rules as pledgecheck
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge
from scheduler.ledger.reservation_store import Kube

_DOC = messages.decoder_for(NodeReservations)
_FP = messages.decoder_for(NodeFingerprint)
_PLEDGES = messages.decoder_for(NamespacePledges)
_PLEDGE = messages.decoder_for(Pledge)
T = TypeVar("T")
LIMITS = pledgecheck.Limits(ttl_s=SchedulerSettings().pledge_ttl_s)


async def read_ledger(bus: Bus) -> dict[str, NodeReservations]:
    """Every node's reservations document (node → document)."""
    out: dict[str, NodeReservations] = {}
    for key, value in await kvkeys.stored_values(
        bus, streams.KV_ALLOC, wanted=lambda k: "=" not in k
    ):  # "=": pledges
        doc = _decoded(_DOC, value, key=key)
        out[doc.node] = doc
    return out


async def read_pledges(bus: Bus) -> dict[str, NamespacePledges]:
    """Every namespace's pledges (namespace → document), from its
    ``pledges=<namespace>`` document and its ``pledges=<namespace>=<id>`` keys."""
    found: dict[str, list[Pledge]] = {}
    for key, value in await kvkeys.stored_values(
        bus, streams.KV_ALLOC, wanted=pledges.is_pledge_key
    ):
        namespace, pledge_id = pledges.parse_key(key)
        if pledge_id:
            found.setdefault(namespace, []).append(_decoded(_PLEDGE, value, key=key))
        else:
            found.setdefault(namespace, []).extend(_decoded(_PLEDGES, value, key=key).pledges)
    return {ns: NamespacePledges(namespace=ns, pledges=tuple(held)) for ns, held in found.items()}


def _decoded(decoder: messages.Decoder[T], value: bytes, *, key: str) -> T:
    try:
        return decoder.decode(value)
    except msgspec.MsgspecError as exc:
        raise BadMessage(f"hcs: {streams.KV_ALLOC} key {key} is corrupt: {exc}") from exc


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


async def inconsistencies(
    bus: Bus,
    kube: Kube,
    *,
    limits: pledgecheck.Limits = LIMITS,
    clock: Callable[[], float] = time.time,
) -> list[ledger.Problem]:
    """One reading: the ledger first (reservations, then pledges, aged by
    ``clock``: Unix seconds, as the pledges are stamped), then the pods,
    then the devices."""
    docs = await read_ledger(bus)
    pledged = await read_pledges(bus)
    now = clock()
    pods_now = await kube.list_pods()
    nodes = set(docs) | {n for n in (ledger.node_of(p) for p in pods_now) if n}
    devices = await read_devices(bus, nodes)
    found = ledger.inconsistencies(docs=docs, pods_now=pods_now, devices=devices)
    reserved = {r.pledge for doc in docs.values() for r in doc.reservations if r.pledge}
    return found + pledgecheck.problems(
        docs=pledged, pods_now=pods_now, now=now, limits=limits, reserved=reserved
    )


async def check(
    bus: Bus,
    kube: Kube,
    *,
    settle_s: float = 1.0,
    limits: pledgecheck.Limits = LIMITS,
    clock: Callable[[], float] = time.time,
) -> list[ledger.Problem]:
    """The inconsistencies that two readings ``settle_s`` apart both show."""
    first = await inconsistencies(bus, kube, limits=limits, clock=clock)
    if not first or settle_s <= 0:
        return first
    await asyncio.sleep(settle_s)
    again = {_key(p) for p in await inconsistencies(bus, kube, limits=limits, clock=clock)}
    return [p for p in first if _key(p) in again]


def _key(problem: ledger.Problem) -> tuple[str, str, str, str]:
    return problem.kind, problem.node, problem.pod, problem.pledge


def render(problems: list[ledger.Problem]) -> str:
    if not problems:
        return "ledger and pods agree: no inconsistency"
    lines = [p.line() for p in sorted(problems, key=lambda p: (p.kind, p.node, p.pod))]
    return "\n".join([*lines, f"{len(problems)} inconsistencies"])


async def run(
    bus: Bus,
    kube: Kube,
    *,
    settle_s: float = 1.0,
    limits: pledgecheck.Limits = LIMITS,
    out: Callable[[str], Any] = print,
    clock: Callable[[], float] = time.time,
) -> int:
    """``hcs check``: print every inconsistency; 1 when any, else 0."""
    problems = await check(bus, kube, settle_s=settle_s, limits=limits, clock=clock)
    out(render(problems))
    return 1 if problems else 0
