"""Gang records: one per run of a gang (a job's ranks, placed all or
nothing), in KV ``hcs_alloc`` under ``gangs=<namespace>=<job>=<run>``.
Pure: records in, records and decisions out; no I/O, no clock.

Life of a record::

    pinned (first member's admission: its class)
       └─ every member there, the gang fits whole ──▶ pledged (one pledge per rank)
    pinned or pledged ── members all gone or finished ──▶ deleted
    pinned ── its class cannot hold it, another can (substitution allow) ──▶ pinned there
    pledged ── a member came after the pledge (the gang restarted) ──▶ pinned again

The first member admitted decides the class (``pin``): the class the whole
gang fits on now, else (it waits) the class where it could ever fit with
the most room free; later members are mutated for the same class (the
record is read). A record ``pledged`` holds one ``Pledge`` per rank, named
for its member pod and its node: the planner counts them as it counts other
pledges, the extender lets each member pass only on its rank's node.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from hcs_bus import vocabulary
from hcs_bus.messages import DeviceSlice, Policy, Requests
from hcs_bus.plannotes import PlanNote
from hcs_bus.profiles import ProfileDB
from scheduler.ledger.pledge_rules import Held, Pledge, per_class
from scheduler.plan import gang_rules as ganging
from scheduler.plan import rules as planning
from scheduler.plan.rules import ClassStats, named, summarise
from scheduler.view.state import ClusterState

KEY_PREFIX = "gangs="
GATE = vocabulary.GANG_GATE  # the scheduling gate HCS puts on every member at admission
GANG = vocabulary.GANG  # annotation: the gang's run key (namespace/job/run)
GANG_SIZE = vocabulary.GANG_SIZE  # annotation: how many members it has
State = Literal["pinned", "pledged"]


class RankPledge(msgspec.Struct, frozen=True, kw_only=True):
    """One rank of a pledged gang: its member pod, its node, its pledge."""

    pod: str
    node: str
    pledge: Pledge
    devices: tuple[DeviceSlice, ...] = ()  # what it takes of each device there


class GangRecord(msgspec.Struct, frozen=True, kw_only=True, tag="gang", tag_field="type"):
    """The value under ``gangs=<namespace>=<job>=<run>``."""

    namespace: str
    job: str
    run: str = ""
    size: int  # its members (an elastic gang: the most it grows to)
    least: int = 0  # an elastic gang: the fewest ranks it runs with (0: fixed, ``size``)
    vendor: str  # the pinned class
    model: str
    library: str = ""
    state: State = "pinned"
    time_s: float = 0.0  # when it was pinned (its age in the admit order)
    priority: int = 0
    requests: Requests | None = None  # what every member asks (the first member's)
    policy: Policy | None = None
    group: str = ""  # the network group of the plan ("" none, or not pledged yet)
    ranks: tuple[RankPledge, ...] = ()
    # the resume point every rank of this pledge binds with (``hcs.io/resume-from``):
    # None until the first rank's bind resolves it, "" when there is none
    resume_from: str | None = None
    # the hcs.io/collective-* flags every rank binds with: one set for the
    # whole job from its placement (``gang_rules.collective_flags``)
    flags: dict[str, str] = msgspec.field(default_factory=dict)
    v: int = 1

    @property
    def key(self) -> str:
        return key_for(self.namespace, self.job, self.run)

    @property
    def class_key(self) -> str:
        return f"{self.vendor}/{self.model}"

    def rank_of(self, pod: str) -> RankPledge | None:
        return next((r for r in self.ranks if r.pod == pod), None)

    @property
    def nodes(self) -> frozenset[str]:
        return frozenset(r.node for r in self.ranks)

    @property
    def elastic(self) -> bool:
        return 0 < self.least < self.size

    @property
    def fewest(self) -> int:
        """The ranks it starts with: its least size when elastic, else its size."""
        return self.least if self.elastic else self.size


ENCODER = msgspec.json.Encoder()
DECODER = msgspec.json.Decoder(GangRecord)


# ------------------------------------------------------------------ keys --


def key_for(namespace: str, job: str, run: str) -> str:
    return f"{KEY_PREFIX}{namespace}={job}={run}"


def key_of_run(run_key: str) -> str:
    """The KV key of the gang a pod names by its ``hcs.io/gang`` (namespace/job/run)."""
    namespace, _, rest = run_key.partition("/")
    job, _, run = rest.partition("/")
    return key_for(namespace, job, run)


def is_gang_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def namespace_of(key: str) -> str:
    return key.removeprefix(KEY_PREFIX).partition("=")[0]


class Records:
    """The gang records one replica knows, kept from its KV watch (and its own writes)."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[GangRecord, int]] = {}
        self._gone: dict[str, int] = {}  # deleted keys: the revision of the deletion

    def apply(self, key: str, value: bytes | None, revision: int) -> bool:
        """A watch entry (None/empty: deleted); True when what is known changed.
        A value that is not a record is ``msgspec.DecodeError``."""
        held = self._held.get(key)
        if (held is not None and held[1] >= revision) or self._gone.get(key, -1) >= revision:
            return False
        if not value:
            self._gone[key] = revision
            return self._held.pop(key, None) is not None
        self._held[key] = (DECODER.decode(value), revision)
        self._gone.pop(key, None)
        return True

    def get(self, key: str) -> tuple[GangRecord, int] | None:
        return self._held.get(key)

    def all(self) -> list[tuple[GangRecord, int]]:
        return list(self._held.values())

    def pledges(self, namespace: str) -> list[Pledge]:
        return pledges_of(r for r, _ in self._held.values() if r.namespace == namespace)

    def namespaces(self) -> set[str]:
        return {r.namespace for r, _ in self._held.values() if r.state == "pledged"}


# ---------------------------------------------------------------- pinning --


@dataclass(frozen=True, slots=True)
class Pin:
    """The class a new gang is pinned to, or why it can never run (``refusal``)."""

    vendor: str = ""
    model: str = ""
    library: str = ""
    refusal: str = ""


def gang_of(
    name: str, *, size: int, requests: Requests, policy: Policy, collective: str = ""
) -> ganging.Gang:
    """A gang of ``size`` members that all ask as one pod asks."""
    member_policy = msgspec.structs.replace(policy, job=None)
    members = tuple(
        ganging.Member(name=f"rank-{i}", requests=requests, policy=member_policy)
        for i in range(size)
    )
    return ganging.Gang(name=name, members=members, collective=collective)


def pinned_to(gang: ganging.Gang, *, vendor: str, model: str) -> ganging.Gang:
    """``gang`` with every member held to the one class ``vendor/model``."""
    members = tuple(
        ganging.Member(
            name=m.name,
            requests=m.requests,
            policy=msgspec.structs.replace(
                m.policy, vendors=(vendor,), models=(model,), substitution="deny"
            ),
        )
        for m in gang.members
    )
    return ganging.Gang(
        name=gang.name,
        members=members,
        collective="",
        priority=gang.priority,
        since_s=gang.since_s,
    )


def pin(
    state: ClusterState,
    gang: ganging.Gang,
    *,
    held: Mapping[str, Held],
    profiles: ProfileDB,
    prefer: Callable[[Sequence[str]], str] | None = None,
) -> Pin:
    """The class the gang is pinned to: where the whole of it fits now (of
    several such classes, the one ``prefer`` picks, given; else
    ``plan_gang``'s), else where it could fit once devices free up with the
    most room free now; a refusal (``plan_gang``'s reason) when it can never
    fit anywhere."""
    plan = ganging.plan_gang(state, gang, held=held, profiles=profiles)
    if plan.ok:
        first = plan.ranks[0]
        chosen = prefer(_fits_now(state, gang, held=held, profiles=profiles)) if prefer else ""
        if chosen:
            vendor, _, model = chosen.partition("/")
            return Pin(vendor, model, ganging.library_of(vendor))
        return Pin(first.vendor, first.model, ganging.library_of(first.vendor))
    if not plan.waits:
        return Pin(refusal=plan.reason)
    classes = summarise(state.schedulable()).classes
    best: tuple[int, int, str] | None = None
    for key in sorted(classes):
        stats = classes[key]
        if not _may_take(gang, stats, profiles):
            continue  # the members' policy keeps the gang off this class
        one = pinned_to(gang, vendor=stats.vendor, model=stats.model)
        found = ganging.plan_gang(state, one, held=held, profiles=profiles)
        if found.ok or found.waits:
            room = (stats.idle_devices, stats.free_mib, key)
            if best is None or room[:2] > best[:2]:
                best = room
    if best is None:
        return Pin(refusal=plan.reason)
    vendor, _, model = best[2].partition("/")
    return Pin(vendor, model, ganging.library_of(vendor))


def _fits_now(
    state: ClusterState, gang: ganging.Gang, *, held: Mapping[str, Held], profiles: ProfileDB
) -> list[str]:
    """The classes (vendor/model) the whole gang fits on now, alone."""
    classes = summarise(state.schedulable()).classes
    out = []
    for key in sorted(classes):
        stats = classes[key]
        if not _may_take(gang, stats, profiles):
            continue
        one = pinned_to(gang, vendor=stats.vendor, model=stats.model)
        if ganging.plan_gang(state, one, held=held, profiles=profiles).ok:
            out.append(key)
    return out


def _may_take(gang: ganging.Gang, stats: ClassStats, profiles: ProfileDB) -> bool:
    """Whether the gang's policy lets it wait on ``stats``'s class: a named
    vendor, and a named model unless substitution is ``allow``."""
    policy = gang.members[0].policy if gang.members else None
    if policy is None:
        return True
    vendors = {v.lower() for v in policy.vendors}
    if vendors and stats.vendor.lower() not in vendors:
        return False
    if policy.models and policy.substitution != "allow":
        return named(stats, policy.models, profiles)
    return True


def waiting_held(
    found: Iterable[GangRecord], classes: Mapping[str, Any], profiles: ProfileDB
) -> dict[str, Held]:
    """What gangs pinned to a class but not pledged yet will take there (every
    rank sized on its class), per class: a new gang's pin counts it, so a burst
    of gangs spreads over the classes instead of all pinning the one that
    looked empty. Nothing is held by it (the gangs hold nothing until pledged)."""
    out: dict[str, Held] = {}
    for record in found:
        key = f"{record.vendor}/{record.model}"
        stats = classes.get(key)
        if record.state != "pinned" or record.requests is None or stats is None:
            continue
        sizing = planning.size(record.requests, stats, profiles.find(key))
        if isinstance(sizing, str):
            continue
        rank = Pledge(
            id="",
            vendor=record.vendor,
            model=record.model,
            devices=sizing.devices,
            vram_mib_per_device=sizing.vram_mib_per_device,
            whole_device=sizing.whole,
            acu_per_device=sizing.acu_per_device,
        )
        held = out.get(key, Held())
        for _ in range(record.fewest):
            held = held.plus(rank)
        out[key] = held
    return out


# --------------------------------------------------------------- pledging --


def pledged(
    record: GangRecord,
    plan: ganging.GangPlan,
    *,
    pods: Mapping[str, str],
    ids: Iterable[str],
    now: float,
) -> GangRecord:
    """``record`` pledged as ``plan`` places it: one pledge per rank, each
    for the member pod ``pods`` maps the plan's member name to, with a fresh
    id from ``ids``."""
    fresh = iter(ids)
    ranks = []
    for rank in plan.ranks:
        pod = pods[rank.member]
        vram = max((s.vram_mib for s in rank.devices), default=0)
        pledge = Pledge(
            id=next(fresh),
            vendor=rank.vendor,
            model=rank.model,
            devices=len(rank.devices),
            vram_mib_per_device=vram,
            whole_device=rank.whole_device,
            acu_per_device=rank.acu_per_device,
            time_s=now,
            name=pod,
        )
        ranks.append(RankPledge(pod=pod, node=rank.node, pledge=pledge, devices=rank.devices))
    return msgspec.structs.replace(
        record,
        state="pledged",
        group=plan.group or "",
        ranks=tuple(ranks),
        flags=ganging.collective_flags(plan),
    )


def pledges_of(records: Iterable[GangRecord]) -> list[Pledge]:
    """The pledges pledged records hold (each counted until its reservation retires it)."""
    return [r.pledge for record in records if record.state == "pledged" for r in record.ranks]


def outstanding_ranks(
    records: Iterable[GangRecord], *, reserved: frozenset[str]
) -> list[RankPledge]:
    """The ranks of pledged records whose pod holds no reservation yet."""
    return [
        r
        for record in records
        if record.state == "pledged"
        for r in record.ranks
        if r.pledge.id not in reserved
    ]


def ranks_by_node(ranks: Iterable[RankPledge]) -> dict[str, list[RankPledge]]:
    out: dict[str, list[RankPledge]] = {}
    for r in ranks:
        out.setdefault(r.node, []).append(r)
    return out


def demand_of(rank: RankPledge) -> PlanNote:
    """What the rank takes on its node, as the extender counts a pod's demand."""
    p = rank.pledge
    return PlanNote(
        vendor=p.vendor,
        model=p.model,
        devices=p.devices,
        vram_mib_per_device=p.vram_mib_per_device,
        whole_device=p.whole_device,
        acu_per_device=p.acu_per_device,
    )


def without(held: Mapping[str, Held], ranks: Iterable[RankPledge]) -> dict[str, Held]:
    """``held`` (pledges per class) less the pledges of ``ranks`` (planned on
    their nodes instead, so not counted twice)."""
    gone = per_class(r.pledge for r in ranks)
    out = dict(held)
    for key, less in gone.items():
        have = out.get(key)
        if have is None:
            continue
        slices = dict(have.slices)
        for size, n in less.slices:
            slices[size] = slices.get(size, 0) - n
        out[key] = Held(
            whole_devices=max(0, have.whole_devices - less.whole_devices),
            vram_mib=max(0, have.vram_mib - less.vram_mib),
            acu=max(0.0, have.acu - less.acu),
            devices=max(0, have.devices - less.devices),
            slices=tuple(sorted((s, n) for s, n in slices.items() if n > 0)),
        )
    return out


def placed_of(ranks: Iterable[RankPledge]) -> list[ganging.RankPlace]:
    """``ranks`` as ``plan_gang`` counts ranks placed and not booked yet."""
    return [
        ganging.RankPlace(
            member=r.pod,
            node=r.node,
            vendor=r.pledge.vendor,
            model=r.pledge.model,
            devices=r.devices,
            whole_device=r.pledge.whole_device,
            acu_per_device=r.pledge.acu_per_device,
        )
        for r in ranks
    ]


def with_placed(state: ClusterState, ranks: Iterable[RankPledge]) -> ClusterState:
    """A copy of ``state``'s schedulable nodes holding what ``ranks`` take."""
    copy = ClusterState()
    copy.nodes = ganging.copies(state, placed_of(ranks))
    return copy


# --------------------------------------------------------------- moving --


def moved(record: GangRecord, *, vendor: str, model: str) -> GangRecord:
    """A waiting record pinned to another class (its age kept: its place in
    the admit order stays)."""
    return msgspec.structs.replace(
        record,
        vendor=vendor,
        model=model,
        library=ganging.library_of(vendor),
        state="pinned",
        group="",
        ranks=(),
        resume_from=None,
    )


def reset(record: GangRecord) -> GangRecord:
    """A pledged record waiting again on its class (its members restart):
    no ranks, no pledges, its resume point resolved again at the next bind."""
    return msgspec.structs.replace(record, state="pinned", group="", ranks=(), resume_from=None)


def resumed(record: GangRecord, uri: str) -> GangRecord:
    """``record`` with the resume point its ranks bind with."""
    return msgspec.structs.replace(record, resume_from=uri)


def restarted(record: GangRecord, live: Iterable[Mapping[str, Any]]) -> bool:
    """Whether a pledged gang's members are new: one of ``live`` is behind
    HCS's gate and is no rank of the pledge, or was created in a later second
    than the pledge was made (a same-named replacement). Its ranks were taken
    from the members there at the pledge, so such a member is a replacement:
    the gang restarts and is pledged again whole. An elastic gang's gated
    members that are no rank wait to grow it (``extras``); only a replaced
    rank, or every rank's member gone (``lost``), restarts it."""
    if record.state != "pledged" or not record.ranks:
        return False
    pledged_s = int(max(r.pledge.time_s for r in record.ranks))
    live = list(live)
    for pod in live:
        if GATE not in gates_of(pod):
            continue
        meta = pod.get("metadata") or {}
        rank = record.rank_of(str(meta.get("name") or ""))
        if rank is None:
            if record.elastic:
                continue
            return True
        since = int(rank.pledge.time_s) if record.elastic else pledged_s  # grown ranks are later
        created = created_s(pod)
        if created is not None and created > since:
            return True
    return record.elastic and len(lost(record, live)) == len(record.ranks)


def lost(record: GangRecord, live: Iterable[Mapping[str, Any]]) -> tuple[RankPledge, ...]:
    """The ranks of a pledged record whose member is no longer among ``live``
    (gone, finished or being deleted)."""
    there = {str((p.get("metadata") or {}).get("name") or "") for p in live}
    return tuple(r for r in record.ranks if r.pod not in there)


def extras(record: GangRecord, live: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """An elastic gang's members behind HCS's gate that hold no rank (they
    wait to grow it), lowest rank first."""
    if not record.elastic:
        return []
    out = [
        p
        for p in live
        if GATE in gates_of(p)
        and record.rank_of(str((p.get("metadata") or {}).get("name") or "")) is None
    ]
    return sorted(out, key=rank_order)


def rank_order(pod: Mapping[str, Any]) -> tuple[int, str]:
    """A member's place among its gang: its Job completion index, then its name."""
    meta = pod.get("metadata") or {}
    notes = meta.get("annotations") or {}
    index = notes.get("batch.kubernetes.io/job-completion-index")
    rank = int(index) if isinstance(index, str) and index.isdigit() else 1 << 30
    return rank, str(meta.get("name") or "")


def grown(
    record: GangRecord,
    plan: ganging.GangPlan,
    *,
    pods: Mapping[str, str],
    ids: Iterable[str],
    now: float,
) -> GangRecord:
    """A pledged elastic record with the ranks ``plan`` places added (its
    collective flags are kept: the new ranks are in its network group)."""
    more = pledged(record, plan, pods=pods, ids=ids, now=now)
    return msgspec.structs.replace(record, ranks=record.ranks + more.ranks)


def shrunk(
    record: GangRecord, *, ranks: int, live: Iterable[Mapping[str, Any]]
) -> tuple[GangRecord, tuple[RankPledge, ...]]:
    """A pledged elastic record less its ``ranks`` highest ranks (by their
    members' ``rank_order`` among ``live``; a rank whose member is gone
    first), never below its least size, and the ranks dropped."""
    order = {str((p.get("metadata") or {}).get("name") or ""): rank_order(p) for p in live}
    keep = max(record.fewest, len(record.ranks) - ranks)
    ordered = sorted(record.ranks, key=lambda r: order.get(r.pod, (1 << 31, r.pod)))
    kept = {r.pod for r in ordered[:keep]}
    return (
        msgspec.structs.replace(record, ranks=tuple(r for r in record.ranks if r.pod in kept)),
        tuple(r for r in ordered[keep:]),
    )


def without_lost(record: GangRecord, gone: Iterable[RankPledge]) -> GangRecord:
    """A pledged elastic record less the ranks whose members are gone."""
    drop = {r.pod for r in gone}
    return msgspec.structs.replace(
        record, ranks=tuple(r for r in record.ranks if r.pod not in drop)
    )


def group_state(state: ClusterState, record: GangRecord) -> ClusterState:
    """``state`` narrowed to the network group of a pledged record (its one
    node when it has no group): where it may grow."""
    out = ClusterState()
    for node in state.schedulable():
        label, value = ganging.group_of(node)
        if (record.group and label and value == record.group) or (
            not record.group and node.name in record.nodes
        ):
            out.nodes[node.name] = node
    return out


def created_s(pod: Mapping[str, Any]) -> int | None:
    """The pod's ``metadata.creationTimestamp`` in Unix seconds (None when absent or unreadable)."""
    stamp = (pod.get("metadata") or {}).get("creationTimestamp")
    if not isinstance(stamp, str) or not stamp:
        return None
    try:
        when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return int(when.timestamp())


# ------------------------------------------------------------------ pods --


def gates_of(pod: Mapping[str, Any]) -> list[str]:
    """The names of the pod's scheduling gates."""
    gates = (pod.get("spec") or {}).get("schedulingGates") or []
    return [str(g.get("name") or "") for g in gates if isinstance(g, Mapping)]


def gang_key_of(pod: Mapping[str, Any]) -> str:
    """The KV key of the pod's gang (``hcs.io/gang``), "" for a pod of none."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    found = notes.get(GANG)
    return key_of_run(found) if isinstance(found, str) and found else ""


def ungate_ops(pod: Mapping[str, Any], *, pledge: str) -> list[dict[str, Any]]:
    """The JSON patch that lifts HCS's gate from ``pod`` and names its rank's
    pledge (``hcs.io/pledge``); [] when the gate is gone already."""
    gates = gates_of(pod)
    if GATE not in gates:
        return []
    index = gates.index(GATE)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    notes = (pod.get("metadata") or {}).get("annotations")
    if not notes:
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {}})
    path = "/metadata/annotations/" + vocabulary.PLEDGE.replace("~", "~0").replace("/", "~1")
    ops.append({"op": "add", "path": path, "value": pledge})
    return ops
