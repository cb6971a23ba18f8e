"""The ledger (KV ``hcs_alloc``) against the pods. Pure: API JSON and KV
documents in, decisions out; no I/O, no clock.

The pods are the truth about what was handed out: a pod bound by HCS carries
``hcs.io/devices`` (device ids: UUIDs for NVIDIA, indices for the others) and
``hcs.io/vram-quota`` (``<position>:<MiB>Mi`` per device) from its Binding, and
the kubelet gives its containers exactly those devices. So

* a ``reserved`` reservation whose pod is bound to its node is turned
  ``bound``, never expired (``expiry_verdict``);
* a bound pod with no reservation has one rebuilt from its annotations
  (``claim_of`` → ``rebuilt``), even where that over-commits a device: the
  devices are in use, and the ledger must stop handing them out again;
* a reservation on a node its pod is not bound to is released;
* an over-committed device (``overcommitted``) cannot be undone by the
  ledger — only by a pod going away — so it is reported.

``inconsistencies`` lists every disagreement for ``hcs check``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from hcs_bus import jobs, vocabulary
from hcs_bus.messages import DeviceFingerprint, DeviceSlice, NodeReservations, PodRef, Reservation
from scheduler.plan import pods

FINISHED = vocabulary.POD_FINISHED
_QUOTA = re.compile(r"^(\d+):(\d+)Mi$")

ProblemKind = Literal[
    "bound pod without reservation",
    "reservation without pod",
    "reservation on another node",
    "device over-committed",
    "unreadable pod annotations",
    # pledges (``scheduler.ledger.pledge_audit_rules``)
    "pledge of another pod",
    "bound pod with unspent pledge",
    "spent pledge without pod",
    "expired pledge",
    "orphaned pledge",
    "pod spent two pledges",
]


@dataclass(frozen=True, slots=True)
class Claim:
    """What a pod bound by HCS holds, from its annotations."""

    pod: PodRef
    node: str
    ids: tuple[str, ...]
    vram_mib: tuple[int, ...]  # per position in ``ids``
    plan: pods.PlanAnnotation | None
    priority: int = 0
    job: str | None = None
    pledge: str = ""  # ``hcs.io/pledge``: a rebuilt reservation carries it too


@dataclass(frozen=True, slots=True)
class Problem:
    kind: ProblemKind
    node: str  # "" for a pledge of no bound pod
    detail: str
    pod: str = ""  # namespace/name
    pledge: str = ""  # the pledge id(s) it is about

    def line(self) -> str:
        where = " ".join(w for w in (f"node {self.node}" if self.node else "", self.pod) if w)
        return f"{self.kind}: {where}: {self.detail}"


class BadClaim(ValueError):
    """A pod's ``hcs.io/*`` annotations that cannot be read as devices."""


# ------------------------------------------------------------------ pods --


def ref_of(pod: Mapping[str, Any]) -> PodRef:
    meta = pod.get("metadata") or {}
    return PodRef(
        namespace=meta.get("namespace", "default"),
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
    )


def key_of(ref: PodRef) -> str:
    return f"{ref.namespace}/{ref.name}"


def finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in FINISHED


def node_of(pod: Mapping[str, Any]) -> str | None:
    return (pod.get("spec") or {}).get("nodeName") or None


def claim_of(pod: Mapping[str, Any]) -> Claim | None:
    """The devices a bound, unfinished pod holds by its annotations; None for a
    pod HCS did not bind (or not yet), or one that finished. ``BadClaim`` when
    the annotations are there but unreadable."""
    meta = pod.get("metadata") or {}
    notes: Mapping[str, str] = meta.get("annotations") or {}
    node = node_of(pod)
    ids_text = notes.get(pods.DEVICES_ANNOTATION)
    if not node or not ids_text or finished(pod):
        return None
    ids = tuple(i.strip() for i in ids_text.split(",") if i.strip())
    vram = _quota(notes.get(pods.VRAM_QUOTA_ANNOTATION, ""), count=len(ids))
    try:
        plan = pods.plan_annotation(dict(notes))
    except pods.BadPod:
        plan = None
    identity = jobs.read(pod, lenient=True)  # the pod holds devices whatever its job says
    return Claim(
        pod=ref_of(pod),
        node=node,
        ids=ids,
        vram_mib=vram,
        plan=plan,
        priority=int((pod.get("spec") or {}).get("priority") or 0),
        job=identity.name if identity is not None else None,
        pledge=str(notes.get(vocabulary.PLEDGE) or ""),
    )


def _quota(text: str, *, count: int) -> tuple[int, ...]:
    found: dict[int, int] = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        match = _QUOTA.match(part)
        if match is None:
            raise BadClaim(f"{pods.VRAM_QUOTA_ANNOTATION}: {part!r} is not <position>:<MiB>Mi")
        found[int(match.group(1))] = int(match.group(2))
    if sorted(found) != list(range(count)):
        raise BadClaim(
            f"{pods.VRAM_QUOTA_ANNOTATION} names positions {sorted(found)} for {count} devices"
        )
    return tuple(found[i] for i in range(count))


def indices(claim: Claim, devices: Mapping[int, DeviceFingerprint]) -> tuple[int, ...]:
    """The device indices a claim's ids name on its node (UUIDs or indices)."""
    by_uuid = {d.uuid: i for i, d in devices.items() if d.uuid}
    out: list[int] = []
    for item in claim.ids:
        if item in by_uuid:
            out.append(by_uuid[item])
        elif item.isdigit() and (not devices or int(item) in devices):
            out.append(int(item))
        else:
            raise BadClaim(f"{pods.DEVICES_ANNOTATION}: no device {item!r} on {claim.node}")
    return tuple(out)


def rebuilt(claim: Claim, devices: Mapping[int, DeviceFingerprint], *, now: float) -> Reservation:
    """The ``bound`` reservation a claim stands for (``BadClaim`` if its ids
    name no device of the node)."""
    chosen = indices(claim, devices)
    plan = claim.plan
    slices = []
    for index, vram in zip(chosen, claim.vram_mib, strict=True):
        fp = devices.get(index)
        whole = (
            plan.whole_device
            if plan is not None
            else (fp is not None and vram >= fp.vram_usable_mib)
        )
        uuid = fp.uuid if fp is not None else ""
        slices.append(DeviceSlice(index=index, uuid=uuid, vram_mib=vram, whole=whole))
    first = devices.get(chosen[0]) if chosen else None
    vendor = plan.vendor if plan is not None else (first.vendor if first else "")
    model = plan.model if plan is not None else (first.model if first else "")
    acu = plan.acu_per_device * len(slices) if plan is not None else 0.0
    return Reservation(
        pod=claim.pod,
        devices=tuple(slices),
        state="bound",
        time_s=now,
        vendor=vendor,
        model=model,
        acu=acu,
        job=claim.job,
        priority=claim.priority,
        pledge=claim.pledge,
    )


# --------------------------------------------------------------- ledger --


def same_pod(a: PodRef, b: PodRef) -> bool:
    return (
        a.namespace == b.namespace
        and a.name == b.name
        and (not a.uid or not b.uid or a.uid == b.uid)
    )


def holding(doc: NodeReservations | None, ref: PodRef) -> Reservation | None:
    if doc is None:
        return None
    return next((r for r in doc.reservations if same_pod(r.pod, ref)), None)


def with_bound(
    doc: NodeReservations | None, reservation: Reservation, *, node: str
) -> NodeReservations | None:
    """``doc`` with the pod of ``reservation`` held ``bound``: a ``reserved``
    one turned bound, a missing one added; None when nothing changes."""
    held = doc.reservations if doc is not None else ()
    mine = holding(doc, reservation.pod)
    if mine is not None and mine.state == "bound":
        return None
    if mine is not None:
        kept = tuple(_as_bound(r) if r is mine else r for r in held)
    else:
        kept = (*held, _as_bound(reservation))
    return NodeReservations(node=node, reservations=kept)


def _as_bound(r: Reservation) -> Reservation:
    return r if r.state == "bound" else msgspec.structs.replace(r, state="bound")


def expiry_verdict(
    reservation: Reservation, pod: Mapping[str, Any] | None, *, node: str
) -> Literal["bound", "expire"]:
    """What to do with a ``reserved`` reservation past its TTL, given its pod as
    the API server has it now (None: gone). A pod bound to this node keeps
    its devices: the Binding was posted and the mark was lost."""
    if pod is None or finished(pod):
        return "expire"
    ref = ref_of(pod)
    if reservation.pod.uid and ref.uid and ref.uid != reservation.pod.uid:
        return "expire"
    return "bound" if node_of(pod) == node else "expire"


BindingOutcome = Literal["bound", "elsewhere", "unknown"]


def binding_outcome(ref: PodRef, pod: Mapping[str, Any] | None, *, node: str) -> BindingOutcome:
    """Where a pod whose Binding to ``node`` failed (a timeout, a 409) is now,
    given the pod as the API server has it (None: gone): ``bound`` to
    ``node`` after all (the Binding landed), ``elsewhere`` (gone, finished,
    replaced or on another node: its devices here are free), or ``unknown``
    (still unbound: a Binding that timed out may yet land, so its devices
    stay held until expiry reads the pod again)."""
    if pod is None or finished(pod):
        return "elsewhere"
    uid = ref_of(pod).uid
    if ref.uid and uid and uid != ref.uid:
        return "elsewhere"
    bound_to = node_of(pod)
    if bound_to is None:
        return "unknown"
    return "bound" if bound_to == node else "elsewhere"


@dataclass(frozen=True, slots=True)
class Overcommit:
    node: str
    index: int
    vram_mib: int
    total_mib: int
    holders: tuple[str, ...]

    def detail(self) -> str:
        who = ", ".join(self.holders)
        return f"device {self.index}: {self.vram_mib} MiB of {self.total_mib} MiB handed to {who}"


def overcommitted(
    node: str, held: Iterable[tuple[str, DeviceSlice]], totals: Mapping[int, int]
) -> list[Overcommit]:
    """Devices holding more than their VRAM, or a whole device shared; ``held``
    is (pod key, slice) pairs, ``totals`` what each device can be promised
    (its usable VRAM). Devices of unknown size count only sharing; a device
    held whole by one pod is never over, whatever size its slice recorded
    (booked before its driver's hold was known, it names the whole total)."""
    per: dict[int, list[tuple[str, DeviceSlice]]] = {}
    for who, s in held:
        per.setdefault(s.index, []).append((who, s))
    out = []
    for index in sorted(per):
        slices = per[index]
        used = sum(s.vram_mib for _, s in slices)
        total = totals.get(index, 0)
        whole = any(s.whole for _, s in slices)
        if (whole and len(slices) > 1) or (not whole and total and used > total):
            holders = tuple(sorted(who for who, _ in slices))
            out.append(Overcommit(node, index, used, total, holders))
    return out


def ledger_slices(doc: NodeReservations | None) -> list[tuple[str, DeviceSlice]]:
    if doc is None:
        return []
    return [
        (key_of(r.pod), s)
        for r in doc.reservations
        if r.state in ("reserved", "bound")
        for s in r.devices
    ]


# ---------------------------------------------------------------- check --


def inconsistencies(
    *,
    docs: Mapping[str, NodeReservations],
    pods_now: Iterable[Mapping[str, Any]],
    devices: Mapping[str, Mapping[int, DeviceFingerprint]],
) -> list[Problem]:
    """Every disagreement between the ledger ``docs`` (node → document), the
    pods and the devices (node → index → fingerprint, for sizes and UUIDs)."""
    live = {key_of(ref_of(p)): p for p in pods_now}
    claims: list[Claim] = []
    problems: list[Problem] = []
    for key, pod in live.items():
        try:
            claim = claim_of(pod)
        except BadClaim as exc:
            problems.append(
                Problem("unreadable pod annotations", node_of(pod) or "-", str(exc), key)
            )
            continue
        if claim is not None:
            claims.append(claim)
    for claim in claims:
        if holding(docs.get(claim.node), claim.pod) is None:
            held = ",".join(claim.ids)
            problems.append(
                Problem(
                    "bound pod without reservation",
                    claim.node,
                    f"holds devices {held} by its annotations; the ledger has no reservation",
                    key_of(claim.pod),
                )
            )
    problems += _stray(docs, live)
    for node in sorted(set(docs) | {c.node for c in claims}):
        found = devices.get(node, {})
        totals = {i: d.vram_usable_mib for i, d in found.items()}
        for o in overcommitted(node, ledger_slices(docs.get(node)), totals):
            problems.append(Problem("device over-committed", node, "in the ledger: " + o.detail()))
        mine = [c for c in claims if c.node == node]
        for o in overcommitted(node, _claimed(mine, found, problems), totals):
            problems.append(
                Problem("device over-committed", node, "by the pods' annotations: " + o.detail())
            )
    return problems


def _stray(
    docs: Mapping[str, NodeReservations], live: Mapping[str, Mapping[str, Any]]
) -> list[Problem]:
    """Reservations whose pod is gone, finished, replaced, or bound elsewhere."""
    out: list[Problem] = []
    for node in sorted(docs):
        for r in docs[node].reservations:
            if r.state not in ("reserved", "bound"):
                continue
            key = key_of(r.pod)
            pod = live.get(key)
            uid = ref_of(pod).uid if pod is not None else ""
            if pod is None or finished(pod) or (r.pod.uid and uid and uid != r.pod.uid):
                why = "gone" if pod is None else ("finished" if finished(pod) else "replaced")
                out.append(
                    Problem(
                        "reservation without pod", node, f"{r.state} reservation; pod {why}", key
                    )
                )
            elif node_of(pod) is not None and node_of(pod) != node:
                out.append(
                    Problem(
                        "reservation on another node",
                        node,
                        f"{r.state} reservation; the pod is bound to {node_of(pod)}",
                        key,
                    )
                )
    return out


def _claimed(
    claims: Iterable[Claim],
    devices: Mapping[int, DeviceFingerprint],
    problems: list[Problem],
) -> list[tuple[str, DeviceSlice]]:
    out: list[tuple[str, DeviceSlice]] = []
    for claim in claims:
        try:
            chosen = indices(claim, devices)
        except BadClaim as exc:
            problems.append(
                Problem("unreadable pod annotations", claim.node, str(exc), key_of(claim.pod))
            )
            continue
        for index, vram in zip(chosen, claim.vram_mib, strict=True):
            total = devices[index].vram_usable_mib if index in devices else 0
            whole = claim.plan.whole_device if claim.plan is not None else vram >= total > 0
            out.append(
                (key_of(claim.pod), DeviceSlice(index=index, uuid="", vram_mib=vram, whole=whole))
            )
    return out
