"""Pledges: the promises admission makes, kept in the ledger (KV ``hcs_alloc``)
beside the reservations. Pure: documents in, documents and verdicts out; no
I/O, no clock (``now`` is passed in).

A non-dry-run admission that is planned writes a *pledge*: the class
(vendor/model), the size (devices × VRAM, ACU) and the pod it was made for
(name, or generateName when the pod had no name yet). Plans count pledges
with reservations (a burst spreads over the classes with room) and quota
verdicts do too (a burst never passes a quota). Keys are one token with
``=`` (node names have none):

* a namespace **with a ComputeQuota** keeps its pledges in one document,
  ``pledges=<namespace>``, written with compare-and-set: the serialization
  point that keeps two replicas from both promising the last share of the
  quota (the document is as large as the quota lets it be);
* a namespace **without one** has nothing to serialize: each pledge is its
  own key, ``pledges=<namespace>=<id>``, created once and deleted when done;
  it is never spent (no quota to hold a copied plan note to: capacity is
  bind's compare-and-set), the reservation carrying its id retires it. A burst of a
  thousand pods then writes a thousand small values, not a thousand
  rewrites of a growing document (bench.burst: that rewrite and its
  decoding in every replica's watch was a quarter of the scheduler's CPU).

Life of a pledge::

    made (admission) ──bind──▶ spent (uid of the pod) ──grace──▶ gone
        │      │                  the pod's reservation carries the pledge id
        │      └─ no quota: reserved (the reservation carries its id) ──grace──▶ gone
        └─ ttl, pod never bound / pod deleted ──▶ gone

Under a quota a pledge is *single use*: it is spent by one pod (its uid
recorded), and a second pod presenting it (a copied plan note) is told so
(``spend_verdict``). A pledge stays counted until the view shows a
reservation that carries its id (then the reservation counts, never both),
and is dropped a ``grace_s`` after it was spent, or made when it was never
spent, once that is so (``sweep``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from hcs_bus import vocabulary
from hcs_bus.messages import PodRef

KEY_PREFIX = "pledges="

SpendOutcome = Literal["spend", "again", "used", "foreign", "missing"]


class Pledge(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One promise: a class and size for one pod of a namespace."""

    id: str
    vendor: str
    model: str
    devices: int
    vram_mib_per_device: int
    whole_device: bool = False
    acu_per_device: float = 0.0
    time_s: float = 0.0
    name: str = ""  # the pod's name at admission ("" with generateName)
    generate_name: str = ""
    spent_s: float | None = None
    uid: str = ""  # the pod that spent it
    pod: str = ""  # its name
    admission: str = ""  # the AdmissionReview uid it was made for

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.model}"

    @property
    def made_for(self) -> str:
        """The pod it was made for: its name, or ``generateName*``."""
        return self.name or (f"{self.generate_name}*" if self.generate_name else "?")

    @property
    def vram_mib(self) -> int:
        return self.devices * self.vram_mib_per_device

    @property
    def acu(self) -> float:
        return self.devices * self.acu_per_device


class NamespacePledges(msgspec.Struct, frozen=True, tag="namespace_pledges", tag_field="type"):
    """The value under ``pledges=<namespace>`` in KV ``hcs_alloc``."""

    namespace: str
    pledges: tuple[Pledge, ...] = ()
    v: int = 1


@dataclass(frozen=True, slots=True)
class Held:
    """What outstanding pledges hold: per pod, per class or per namespace."""

    whole_devices: int = 0  # devices of whole-device pledges
    vram_mib: int = 0  # all VRAM
    acu: float = 0.0
    devices: int = 0
    # slice pledges by their size on each device: (MiB, devices), sorted by size
    slices: tuple[tuple[int, int], ...] = ()

    @property
    def slice_mib(self) -> int:
        """VRAM of slice pledges."""
        return sum(size * devices for size, devices in self.slices)

    def add(self, other: Held) -> Held:
        return Held(
            whole_devices=self.whole_devices + other.whole_devices,
            vram_mib=self.vram_mib + other.vram_mib,
            acu=self.acu + other.acu,
            devices=self.devices + other.devices,
            slices=_merged(self.slices, other.slices),
        )

    def plus(self, p: Pledge) -> Held:
        more = () if p.whole_device else ((p.vram_mib_per_device, p.devices),)
        return Held(
            whole_devices=self.whole_devices + (p.devices if p.whole_device else 0),
            vram_mib=self.vram_mib + p.vram_mib,
            acu=self.acu + p.acu,
            devices=self.devices + p.devices,
            slices=_merged(self.slices, more),
        )


def _merged(
    a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]
) -> tuple[tuple[int, int], ...]:
    if not b:
        return a
    if not a:
        return b
    counts = dict(a)
    for size, devices in b:
        counts[size] = counts.get(size, 0) + devices
    return tuple(sorted(counts.items()))


@dataclass(frozen=True, slots=True)
class Spend:
    outcome: SpendOutcome
    pledge: Pledge | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in ("spend", "again")


# ------------------------------------------------------------------ keys --


def key_for(namespace: str, pledge_id: str = "") -> str:
    """The namespace's document, or with ``pledge_id`` one pledge's own key."""
    return KEY_PREFIX + namespace + (f"={pledge_id}" if pledge_id else "")


def is_pledge_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def parse_key(key: str) -> tuple[str, str]:
    """(namespace, pledge id) of a pledge key; the id is "" for a document."""
    namespace, _, pledge_id = key.removeprefix(KEY_PREFIX).partition("=")
    return namespace, pledge_id


def namespace_of(key: str) -> str:
    return parse_key(key)[0]


# -------------------------------------------------------------- counting --


def outstanding(doc: NamespacePledges | None, *, reserved: Iterable[str] = ()) -> list[Pledge]:
    """The pledges that still hold capacity: those no reservation in
    ``reserved`` carries yet (spent or not: a pledge of a namespace without
    a quota is never spent, its reservation retires it)."""
    if doc is None:
        return []
    # the summary's ids are thousands after a burst: looked up, not copied
    seen = reserved if isinstance(reserved, set | frozenset) else set(reserved)
    return [p for p in doc.pledges if p.id not in seen]


def held(pledges: Iterable[Pledge]) -> Held:
    return tallied(pledges)[1]


def per_class(pledges: Iterable[Pledge]) -> dict[str, Held]:
    return tallied(pledges)[0]


class _Sum:
    """A ``Held`` being summed: plain numbers, one ``Held`` at the end."""

    __slots__ = ("acu", "devices", "slices", "vram_mib", "whole_devices")

    def __init__(self) -> None:
        self.whole_devices, self.vram_mib, self.acu, self.devices = 0, 0, 0.0, 0
        self.slices: dict[int, int] = {}

    def plus(self, p: Pledge) -> None:
        if p.whole_device:
            self.whole_devices += p.devices
        else:
            size = p.vram_mib_per_device
            self.slices[size] = self.slices.get(size, 0) + p.devices
        self.vram_mib += p.vram_mib
        self.acu += p.acu
        self.devices += p.devices

    def held(self) -> Held:
        return Held(
            whole_devices=self.whole_devices,
            vram_mib=self.vram_mib,
            acu=self.acu,
            devices=self.devices,
            slices=tuple(sorted(self.slices.items())),
        )


def tallied(pledges: Iterable[Pledge]) -> tuple[dict[str, Held], Held, int]:
    """``per_class``, ``held`` and how many pledges, in one pass that builds
    each ``Held`` once: the same figures as adding the pledges one by one
    (``Held.plus``, in the same order), at a plan's pace over the thousands
    a burst leaves outstanding."""
    total, by_class, count = _Sum(), dict[str, _Sum](), 0
    for p in pledges:
        total.plus(p)
        found = by_class.get(p.key)
        if found is None:
            found = by_class[p.key] = _Sum()
        found.plus(p)
        count += 1
    return {key: s.held() for key, s in by_class.items()}, total.held(), count


def packed_share(size_mib: int, device_mib: int) -> float:
    """The share of a device of ``device_mib`` that a slice of ``size_mib``
    takes once slices of its size are packed on it: 1 / how many fit (a 16 GiB
    slice on a 24 GiB device takes it all; on an 80 GiB one, a fifth)."""
    if device_mib <= 0 or size_mib <= 0:
        return 1.0
    return 1.0 / max(1, device_mib // size_mib)


def slices_fit(
    free_counts: dict[int, int], *, device_mib: int, size_mib: int, devices: int, pledged: Held
) -> bool:
    """Whether ``devices`` more slices of ``size_mib`` fit a class's free VRAM
    (``free_counts``: devices by their free MiB) once its slice pledges are
    placed, counting what packing wastes: room and pledges in shares of a
    device (:func:`packed_share`), so four pledged 16 GiB slices take four
    24 GiB devices, not 64 GiB of their 96; a whole-device pledge takes a
    whole device. Exact for one size; for mixed sizes each is counted as if
    packed with its own kind."""
    share = packed_share(size_mib, device_mib)
    room = sum(count * (free // size_mib) for free, count in free_counts.items()) * share
    held = pledged.whole_devices + sum(
        n * packed_share(size, device_mib) for size, n in pledged.slices
    )
    return held + devices * share <= room + 1e-9


def room_left(*, idle_devices: int, free_mib: int, vram_mib: int, pledged: Held) -> tuple[int, int]:
    """(idle devices, free MiB) of a class once its pledges are placed: a
    whole-device pledge takes idle devices, a slice pledge VRAM (and, counted
    in whole devices of ``vram_mib``, the idle devices it may land on)."""
    slice_devices = math.ceil(pledged.slice_mib / vram_mib) if vram_mib > 0 else 0
    idle = idle_devices - pledged.whole_devices - slice_devices
    return idle, free_mib - pledged.vram_mib


# ------------------------------------------------------------- changing --


def with_pledge(
    doc: NamespacePledges | None, pledge: Pledge, *, namespace: str
) -> NamespacePledges:
    held_ = doc.pledges if doc is not None else ()
    return NamespacePledges(namespace=namespace, pledges=(*held_, pledge))


def find(doc: NamespacePledges | None, pledge_id: str) -> Pledge | None:
    if doc is None or not pledge_id:
        return None
    return next((p for p in doc.pledges if p.id == pledge_id), None)


def made_for(pledge: Pledge, ref: PodRef) -> bool:
    """Whether ``ref`` is the pod the pledge was made for (by name, or by its
    generateName when it had none at admission)."""
    if pledge.name:
        return ref.name == pledge.name
    if pledge.generate_name:
        return ref.name.startswith(pledge.generate_name)
    return True


def spend_verdict(doc: NamespacePledges | None, pledge_id: str, *, ref: PodRef) -> Spend:
    """May the pod ``ref`` spend pledge ``pledge_id`` of ``doc``? (``verdict``)"""
    return verdict(find(doc, pledge_id), ref=ref)


def verdict(found: Pledge | None, *, ref: PodRef) -> Spend:
    """May the pod ``ref`` spend the pledge ``found``? ``spend``: yes, first
    time; ``again``: it already did (a retried bind); ``used``: another pod
    spent it; ``foreign``: it was made for another pod; ``missing``: no such
    pledge (expired, released, or never made)."""
    if found is None:
        return Spend("missing")
    if found.spent_s is not None:
        same = found.pod == ref.name and (not found.uid or not ref.uid or found.uid == ref.uid)
        return Spend("again" if same else "used", found)
    if not made_for(found, ref):
        return Spend("foreign", found)
    return Spend("spend", found)


def spent(doc: NamespacePledges, pledge_id: str, *, ref: PodRef, now: float) -> NamespacePledges:
    """``doc`` with the pledge marked spent by ``ref``."""
    out = tuple(spent_by(p, ref=ref, now=now) if p.id == pledge_id else p for p in doc.pledges)
    return msgspec.structs.replace(doc, pledges=out)


def spent_by(pledge: Pledge, *, ref: PodRef, now: float) -> Pledge:
    """``pledge`` marked spent by ``ref`` at ``now``."""
    return msgspec.structs.replace(pledge, spent_s=now, uid=ref.uid, pod=ref.name)


def pledge_of(pod: Mapping[str, Any]) -> str:
    """The pledge id a pod carries (``hcs.io/pledge``), "" for none."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(vocabulary.PLEDGE) or "")


def without(doc: NamespacePledges, ids: Iterable[str]) -> NamespacePledges:
    gone = set(ids)
    return msgspec.structs.replace(doc, pledges=tuple(p for p in doc.pledges if p.id not in gone))


def sweep(
    doc: NamespacePledges,
    *,
    now: float,
    ttl_s: float,
    grace_s: float,
    reserved: Iterable[str] = (),
) -> tuple[list[Pledge], list[Pledge]]:
    """(expired, done): unspent pledges older than ``ttl_s`` with no
    reservation (their pod was never bound), unspent ones older than
    ``grace_s`` whose reservation is in ``reserved`` (no quota: never spent),
    and spent ones whose reservation is in ``reserved`` for ``grace_s`` (or
    spent ``ttl_s`` ago with none: the Binding failed and the pod went away)."""
    seen = set(reserved)
    expired: list[Pledge] = []
    done: list[Pledge] = []
    for p in doc.pledges:
        if p.spent_s is None:
            if p.id in seen and now - p.time_s > grace_s:
                done.append(p)
            elif now - p.time_s > ttl_s:
                expired.append(p)
        elif (p.id in seen and now - p.spent_s > grace_s) or now - p.spent_s > ttl_s:
            done.append(p)
    return expired, done


def usage_by_namespace(
    docs: Mapping[str, NamespacePledges], *, reserved: Iterable[str] = ()
) -> dict[str, Held]:
    seen = set(reserved)
    return {ns: held(outstanding(doc, reserved=seen)) for ns, doc in docs.items()}


def orphans(
    doc: NamespacePledges, *, referenced: Iterable[str], now: float, after_s: float
) -> list[Pledge]:
    """Unspent pledges older than ``after_s`` that no pod of the namespace
    carries (``referenced``: the ``hcs.io/pledge`` values of its pods): the
    admission was answered but the pod never came to be (another webhook
    refused it, the client gave up), so nothing will ever spend them."""
    seen = set(referenced)
    return [
        p
        for p in doc.pledges
        if p.spent_s is None and now - p.time_s > after_s and p.id not in seen
    ]
