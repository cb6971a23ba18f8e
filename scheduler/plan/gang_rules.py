"""Gangs: a job whose ranks start together or not at all (a training job of
``n`` ranks, one pod each). Pure: the cluster view in, a plan out; no I/O,
no clock (``now`` is passed in).

The single-pod planner (``scheduler.plan.rules``) plans pod by pod, so a
16-rank job could land half on NVIDIA and half on Ascend (NCCL and HCCL
cannot talk: the job never starts), or half of it could hold devices while
the other half waits for ever. ``plan_gang`` places every rank at once:

* **Members** all ask the same (requests and policy); a member that differs
  is refused by name. One rank is sized on each class as the single-pod
  planner sizes a pod (``rules.size``), and counted on each node as the
  extender counts it (``extender.rules.check_node``: whole devices idle,
  slices in a device's free VRAM), after what ``placed`` holds.
* **One collective library.** Each vendor speaks its own (``LIBRARY``:
  nccl, hccl, cncl, rccl, mccl, ixccl). Ranks go to one vendor/model class;
  to several models only when they share a library and the policy's
  ``substitution`` is ``allow``; across libraries only when the gang opts in
  to a cross-vendor library (``Gang.collective``: ``flagcx``), which never
  bridges hccl. With ``policy.models`` the named classes come first; with
  ``allow`` a substitute must share a named model's library.
* **One network group** (``state.NETWORK_LABELS``: the RDMA fabric, else the
  network group; a label's value names a group within its label). A node
  with neither label holds a gang only alone.
* **Pledges** (``held``, per class, as ``rules.charged`` counts them) keep
  their room: the class's room once they are placed
  (``pledge_rules.room_left``, ``slices_fit``) must still hold the ranks,
  and no pledge count that held before the gang fails after it
  (``keeps_pledges``).
* **All or nothing.** A gang that cannot be placed whole gets
  ``GangPlan(ok=False)`` with a reason naming what is missing and no ranks;
  ``waits`` says whether it could fit once devices free up (else it never
  can: refused).

Choice, in tiers (the first tier with room wins): one named (or, without
names, any) class; one substitute class; several classes of one library;
several classes of one cross-vendor library. Within a tier, the pool (its
classes in one group) with the least fragmentation: ranks fill the pool's
nodes largest room first, the last ones on the node with the least room that
still holds them (a node that holds all ranks alone: the tightest such
node); pools are ranked by the nodes they leave partly used, then the room
they keep (best fit: the tightest pool, so large pools stay whole for large
gangs), then the nodes they touch; ties by class names, then group name.

``admit_order`` says which waiting gangs start now; ``collective_flags`` the
``hcs.io/collective-*`` values every rank carries.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import msgspec

from hcs_bus.messages import DeviceFingerprint, DeviceSlice, Policy, Rejection, Requests
from hcs_bus.profiles import ProfileDB
from hcs_bus.vocabulary import COLLECTIVE_LIBRARY as LIBRARY
from scheduler.extender import collectives
from scheduler.extender.rules import Demand, check_node, choose_devices, slices_for
from scheduler.ledger.pledge_rules import Held, room_left, slices_fit
from scheduler.plan.rules import ClassStats, Sizing, named, size, summarise
from scheduler.view.state import (
    NETWORK_LABELS,
    RDMA_FABRIC_LABEL,
    ClusterState,
    DeviceView,
    NodeView,
    hold_slices,
)

# Cross-vendor libraries a gang may opt in to, and the libraries each bridges.
BRIDGES: dict[str, frozenset[str]] = {
    "flagcx": frozenset({"nccl", "cncl", "rccl", "mccl", "ixccl"}),
}
_NO_CAP = 1 << 30


def library_of(vendor: str) -> str:
    return LIBRARY.get(vendor.lower(), vendor.lower())


@dataclass(frozen=True, slots=True)
class Member:
    """One rank of a gang: a pod's name and what it asks for."""

    name: str
    requests: Requests
    policy: Policy = field(default_factory=Policy)


@dataclass(frozen=True, slots=True)
class Gang:
    name: str
    members: tuple[Member, ...]
    collective: str = ""  # a cross-vendor library opted in to (``BRIDGES``), "" for none
    priority: int = 0
    since_s: float = 0.0  # when it began to wait


@dataclass(frozen=True, slots=True)
class RankPlace:
    """Where one rank goes: a node and what it takes of each chosen device."""

    member: str
    node: str
    vendor: str
    model: str
    devices: tuple[DeviceSlice, ...]
    whole_device: bool
    acu_per_device: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.model}"


@dataclass(frozen=True, slots=True)
class NodeDevices:
    """The gang's devices of one vendor on one node, for the collective flags."""

    node: str
    vendor: str
    devices: tuple[DeviceFingerprint, ...]
    rdma_fabric: str = ""


@dataclass(frozen=True, slots=True)
class GangPlan:
    gang: str
    ok: bool
    reason: str = ""
    waits: bool = False  # not placed now, but it would be once devices free up
    library: str = ""
    group: str | None = None  # the network group; None: one node without one
    classes: tuple[str, ...] = ()
    ranks: tuple[RankPlace, ...] = ()
    nodes: tuple[NodeDevices, ...] = ()
    rejected: tuple[Rejection, ...] = ()


# ---------------------------------------------------------------- members --


def members_problem(gang: Gang) -> str:
    """Why the gang's members cannot be planned as one ("" when they can)."""
    if not gang.members:
        return f"gang {gang.name} has no members"
    first, seen = gang.members[0], set[str]()
    for member in gang.members:
        if member.name in seen:
            return f"gang {gang.name}: member {member.name} is listed twice"
        seen.add(member.name)
        diff = _differences(first, member)
        if diff:
            return (
                f"gang {gang.name}: member {member.name} asks differently from "
                f"{first.name} ({diff}); every member of a gang must ask the same"
            )
    if gang.collective and gang.collective not in BRIDGES:
        known = ", ".join(sorted(BRIDGES))
        return f"gang {gang.name}: collective {gang.collective!r} is not one HCS knows ({known})"
    return ""


def _differences(a: Member, b: Member) -> str:
    out = []
    for part in ("requests", "policy"):
        mine, theirs = (msgspec.structs.asdict(getattr(m, part)) for m in (a, b))
        out += [
            f"{part}.{k} {theirs[k]!r} vs {mine[k]!r}" for k in mine if mine[k] != theirs.get(k)
        ]
    return ", ".join(out)


# ---------------------------------------------------------------- classes --


@dataclass(frozen=True, slots=True)
class _Class:
    key: str
    library: str
    demand: Demand  # one rank on this class
    cap: int  # ranks the class takes before its pledges lack room
    substitute: bool  # not named by policy.models


def _classes(
    nodes: Sequence[NodeView], member: Member, held: Mapping[str, Held], profiles: ProfileDB
) -> tuple[list[_Class], list[Rejection]]:
    policy = member.policy
    vendors = {v.lower() for v in policy.vendors}
    summary = summarise(nodes)
    out: list[_Class] = []
    rejected: list[Rejection] = []
    for key in sorted(summary.classes):
        stats = summary.classes[key]
        sizing = _refuse(member, stats, vendors, profiles)
        if isinstance(sizing, str):
            rejected.append(Rejection(vendor=stats.vendor, model=stats.model, reason=sizing))
            continue
        demand = Demand(
            vendor=stats.vendor,
            model=stats.model,
            devices=sizing.devices,
            vram_mib_per_device=sizing.vram_mib_per_device,
            whole_device=sizing.whole,
            acu_per_device=round(sizing.acu_per_device, 3),
        )
        substitute = bool(policy.models) and not named(stats, policy.models, profiles)
        cap = _cap(stats, demand, held.get(key, Held()))
        out.append(_Class(key, library_of(stats.vendor), demand, cap, substitute))
    return _substitutes(out, rejected, policy, profiles)


def _refuse(
    member: Member, stats: ClassStats, vendors: set[str], profiles: ProfileDB
) -> Sizing | str:
    if vendors and stats.vendor.lower() not in vendors:
        return (
            f"vendor {stats.vendor} not allowed by policy (vendors: {', '.join(sorted(vendors))})"
        )
    sizing = size(member.requests, stats, profiles.find(stats.key))
    if isinstance(sizing, str):
        return sizing
    if sizing.devices > stats.max_usable_per_node:
        return (
            f"a rank needs {sizing.devices} devices on one node, the largest {stats.key} node "
            f"has {stats.max_usable_per_node} usable"
        )
    if member.policy.topology == "high-bandwidth" and sizing.devices > 1 and not stats.linked:
        return "topology high-bandwidth asked, these devices have no peer links (PCIe only)"
    return sizing


def _substitutes(
    classes: list[_Class], rejected: list[Rejection], policy: Policy, profiles: ProfileDB
) -> tuple[list[_Class], list[Rejection]]:
    """Substitutes stay only with ``allow``, and only in a named model's library."""
    if not policy.models:
        return classes, rejected
    libraries = {c.library for c in classes if not c.substitute}
    for name in policy.models:
        found = profiles.match(None, name)
        if found is not None:
            libraries.add(library_of(found.vendor))
    kept = []
    for c in classes:
        why = ""
        if c.substitute and policy.substitution != "allow":
            why = f"not named by policy.models ({', '.join(policy.models)}); substitution is off"
        elif c.substitute and c.library not in libraries:
            why = (
                f"not named by policy.models; a substitute must share a named model's "
                f"collective library ({', '.join(sorted(libraries)) or 'none known'})"
            )
        if why:
            vendor, _, model = c.key.partition("/")
            rejected.append(Rejection(vendor=vendor, model=model, reason=why))
        else:
            kept.append(c)
    return kept, rejected


def _cap(stats: ClassStats, demand: Demand, pledged: Held) -> int:
    """Ranks of ``demand`` the class can take with its pledges still placed."""
    if pledged == Held():
        return _NO_CAP
    if demand.whole_device:
        idle, _ = room_left(
            idle_devices=stats.idle_devices,
            free_mib=stats.free_mib,
            vram_mib=stats.vram_mib,
            pledged=pledged,
        )
        return max(idle, 0) // demand.devices
    low, high = (
        0,
        sum(n * (free // demand.vram_mib_per_device) for free, n in stats.free_counts.items()),
    )
    while low < high:  # the most slices that fit: slices_fit is monotone in their number
        mid = (low + high + 1) // 2
        fits = slices_fit(
            stats.free_counts,
            device_mib=stats.vram_mib,
            size_mib=demand.vram_mib_per_device,
            devices=mid,
            pledged=pledged,
        )
        low, high = (mid, high) if fits else (low, mid - 1)
    return low


# ------------------------------------------------------------------ pools --


@dataclass(frozen=True, slots=True)
class _Bin:
    """One class on one node: ranks it holds now, and when empty."""

    node: str
    key: str
    now: int
    ever: int


@dataclass(frozen=True, slots=True)
class _Pool:
    tier: int
    classes: tuple[str, ...]
    group: tuple[str, str]  # (label, value); ("", node) for a node without a group
    bins: tuple[_Bin, ...]

    @property
    def where(self) -> str:
        label, value = self.group
        return f"in group {value}" if label else f"on node {value} (no network group)"


def group_of(node: NodeView) -> tuple[str, str]:
    """The node's network group as (label, value), ("", node name) for none."""
    labels = node.labels
    for label in NETWORK_LABELS:
        value = labels.get(label)
        if value:
            return label, value
    return "", node.name


def _ranks(node: NodeView, demand: Demand, *, now: bool) -> int:
    """Ranks of ``demand`` the node holds (now, or empty), as ``check_node`` counts."""
    v, d = demand.vram_mib_per_device, demand.devices
    usable = [
        dev
        for dev in node.devices.values()
        if _class_of(dev) == demand.key and dev.usable and dev.fp.vram_usable_mib >= v
    ]
    if demand.whole_device:
        return sum(1 for dev in usable if dev.idle or not now) // d
    return sum((dev.free_mib if now else dev.fp.vram_usable_mib) // v for dev in usable)


def _class_of(device: DeviceView) -> str:
    return f"{device.fp.vendor}/{device.fp.model}"


def _pools(nodes: Sequence[NodeView], classes: Sequence[_Class], gang: Gang) -> list[_Pool]:
    by_group: dict[tuple[str, str], list[_Bin]] = {}
    for node in sorted(nodes, key=lambda n: n.name):
        present = node.models()
        for c in classes:
            if c.key in present:
                ever = _ranks(node, c.demand, now=False)
                if ever > 0:
                    now = _ranks(node, c.demand, now=True)
                    by_group.setdefault(group_of(node), []).append(
                        _Bin(node.name, c.key, now, ever)
                    )
    libraries = {c.key: c.library for c in classes}
    subs = {c.key for c in classes if c.substitute}
    bridged = BRIDGES.get(gang.collective, frozenset())
    mixing = bool(gang.members) and gang.members[0].policy.substitution == "allow"
    out: list[_Pool] = []
    for group in sorted(by_group):
        bins = by_group[group]
        keys = sorted({b.key for b in bins})
        for key in keys:
            out.append(_pool(1 if key in subs else 0, (key,), group, bins))
        for library in sorted({libraries[k] for k in keys}) if mixing else ():
            same = tuple(k for k in keys if libraries[k] == library)
            if len(same) > 1:
                out.append(_pool(2, same, group, bins))
        across = tuple(k for k in keys if libraries[k] in bridged)
        if len({libraries[k] for k in across}) > 1:
            out.append(_pool(3, across, group, bins))
    return out


def _pool(tier: int, keys: tuple[str, ...], group: tuple[str, str], bins: list[_Bin]) -> _Pool:
    return _Pool(tier, keys, group, tuple(b for b in bins if b.key in keys))


def _capacity(pool: _Pool, caps: Mapping[str, int], *, now: bool = True) -> int:
    total = 0
    for key in pool.classes:
        room = sum(b.now if now else b.ever for b in pool.bins if b.key == key)
        total += min(room, caps[key]) if now else room
    return total


def _fill(pool: _Pool, n: int, caps: Mapping[str, int]) -> list[tuple[_Bin, int]] | None:
    """Ranks per bin: largest room first, the rest on the tightest bin that
    holds it all (module doc); None when the pool cannot hold ``n``."""
    if _capacity(pool, caps) < n:
        return None
    left_cap = dict(caps)
    rest = sorted(pool.bins, key=lambda b: (b.node, b.key))
    out: list[tuple[_Bin, int]] = []
    left = n
    while left > 0:
        live = [(min(b.now, left_cap[b.key]), b) for b in rest]
        live = [(room, b) for room, b in live if room > 0]
        if not live:
            return None
        fits = [(room, b) for room, b in live if room >= left]
        if fits:
            room, chosen = min(fits, key=lambda rb: (rb[0], rb[1].node, rb[1].key))
        else:
            room, chosen = min(live, key=lambda rb: (-rb[0], rb[1].node, rb[1].key))
        take = min(room, left)
        out.append((chosen, take))
        left_cap[chosen.key] -= take
        left -= take
        rest.remove(chosen)
    return out


def _score(pool: _Pool, fill: list[tuple[_Bin, int]], n: int) -> tuple[object, ...]:
    partial = sum(1 for b, k in fill if b.now > k)
    kept = sum(b.now for b in pool.bins) - n
    touched = len({b.node for b, _ in fill})
    return (partial, kept, touched, pool.classes, pool.group)


# ------------------------------------------------------------------ plans --


def plan_gang(
    state: ClusterState,
    gang: Gang,
    *,
    held: Mapping[str, Held] | None = None,
    placed: Iterable[RankPlace] = (),
    profiles: ProfileDB | None = None,
) -> GangPlan:
    """Every rank of ``gang`` placed on the view ``state``, counting the
    class pledges ``held`` and the ranks ``placed`` (gangs planned and not
    booked yet), or a refusal naming what is missing (module doc)."""
    return _plan(_Look.of(state, gang, held=held, placed=placed, profiles=profiles))


@dataclass(slots=True)
class _Look:
    """One gang against one view: its classes, pools and room."""

    gang: Gang
    nodes: dict[str, NodeView]
    held: Mapping[str, Held] = field(default_factory=dict)
    classes: list[_Class] = field(default_factory=list)
    rejected: list[Rejection] = field(default_factory=list)
    pools: list[_Pool] = field(default_factory=list)
    problem: str = ""

    @classmethod
    def of(
        cls,
        state: ClusterState,
        gang: Gang,
        *,
        held: Mapping[str, Held] | None,
        placed: Iterable[RankPlace],
        profiles: ProfileDB | None,
    ) -> _Look:
        look = cls(gang=gang, nodes=copies(state, placed), held=held or {})
        look.problem = members_problem(gang)
        if not look.problem:
            db = profiles if profiles is not None else ProfileDB(())
            nodes = list(look.nodes.values())
            look.classes, look.rejected = _classes(nodes, gang.members[0], look.held, db)
            look.pools = _pools(nodes, look.classes, gang)
        return look

    @property
    def caps(self) -> dict[str, int]:
        return {c.key: c.cap for c in self.classes}


def _plan(look: _Look) -> GangPlan:
    gang = look.gang
    if look.problem:
        return GangPlan(gang=gang.name, ok=False, reason=look.problem)
    n, caps = len(gang.members), look.caps
    for tier in range(4):
        options = []
        for pool in (p for p in look.pools if p.tier == tier):
            fill = _fill(pool, n, caps)
            if fill is not None:
                options.append((_score(pool, fill, n), pool, fill))
        for _, pool, fill in sorted(options, key=lambda o: o[0]):
            done = _place(look, pool, fill)
            if done is not None:
                return done
    return _refusal(look)


def _place(look: _Look, pool: _Pool, fill: list[tuple[_Bin, int]]) -> GangPlan | None:
    """The ranks on fresh copies of the pool's nodes, as the extender chooses
    devices; None if a node holds fewer than counted (it never should) or the
    ranks take room the class's pledges hold (``keeps_pledges``)."""
    demands = {c.key: c.demand for c in look.classes}
    copies: dict[str, NodeView] = {}
    ranks: list[RankPlace] = []
    members = iter(look.gang.members)
    for bin_, k in fill:
        if bin_.node not in copies:
            copies[bin_.node] = _clone(look.nodes[bin_.node])
        node = copies[bin_.node]
        demand = demands[bin_.key]
        for _ in range(k):
            member = next(members)
            fit = check_node(node, demand)
            if not fit.ok:
                return None
            slices = slices_for(choose_devices(fit, demand), demand)
            hold_slices(node, f"gang:{look.gang.name}/{member.name}", slices)
            ranks.append(_rank(member.name, node.name, demand, slices))
    if not keeps_pledges(look.nodes, copies, keys={r.key for r in ranks}, held=look.held):
        return None
    libraries = {library_of(r.vendor) for r in ranks}
    return GangPlan(
        gang=look.gang.name,
        ok=True,
        reason=f"{len(ranks)} ranks on {', '.join(pool.classes)} {pool.where}",
        library=libraries.pop() if len(libraries) == 1 else look.gang.collective,
        group=pool.group[1] if pool.group[0] else None,
        classes=tuple(sorted({r.key for r in ranks})),
        ranks=tuple(ranks),
        nodes=_node_devices(ranks, look.nodes),
        rejected=tuple(look.rejected),
    )


def _rank(member: str, node: str, demand: Demand, slices: tuple[DeviceSlice, ...]) -> RankPlace:
    return RankPlace(
        member=member,
        node=node,
        vendor=demand.vendor,
        model=demand.model,
        devices=slices,
        whole_device=demand.whole_device,
        acu_per_device=demand.acu_per_device,
    )


def _node_devices(
    ranks: Sequence[RankPlace], nodes: Mapping[str, NodeView]
) -> tuple[NodeDevices, ...]:
    chosen: dict[tuple[str, str], dict[int, DeviceFingerprint]] = {}
    for r in ranks:
        fps = nodes[r.node].devices
        into = chosen.setdefault((r.node, r.vendor), {})
        for s in r.devices:
            if s.index in fps:
                into[s.index] = fps[s.index].fp
    return tuple(
        NodeDevices(
            node=node,
            vendor=vendor,
            devices=tuple(fps[i] for i in sorted(fps)),
            rdma_fabric=nodes[node].labels.get(RDMA_FABRIC_LABEL, ""),
        )
        for (node, vendor), fps in sorted(chosen.items())
    )


def pledge_checks(stats: ClassStats, pledged: Held) -> tuple[bool, ...]:
    """Whether a class's pledges still have room, in each of the ways the
    single-pod planner counts it: idle devices and VRAM once they are placed
    (``room_left``), and each pledged slice size packed (``slices_fit``)."""
    idle, free = room_left(
        idle_devices=stats.idle_devices,
        free_mib=stats.free_mib,
        vram_mib=stats.vram_mib,
        pledged=pledged,
    )
    packed = (
        slices_fit(
            stats.free_counts, device_mib=stats.vram_mib, size_mib=s, devices=0, pledged=pledged
        )
        for s, _ in pledged.slices
    )
    return (idle >= 0, free >= 0, *packed)


def keeps_pledges(
    before: Mapping[str, NodeView],
    changed: Mapping[str, NodeView],
    *,
    keys: Iterable[str],
    held: Mapping[str, Held],
) -> bool:
    """No pledge check of the classes ``keys`` that held on the nodes
    ``before`` fails once the nodes ``changed`` replace theirs. (The counts
    are estimates that disagree for mixed sizes: a slice gang may pass
    ``slices_fit`` yet take the idle device a whole-device pledge needs.)"""
    pledged = {k: held[k] for k in keys if k in held and held[k] != Held()}
    if not pledged:
        return True
    old = summarise(before.values()).classes
    new = summarise({**before, **changed}.values()).classes
    for key, p in pledged.items():
        was, now = pledge_checks(old[key], p), pledge_checks(new[key], p)
        if any(a and not b for a, b in zip(was, now, strict=True)):
            return False
    return True


# --------------------------------------------------------------- refusals --


def _refusal(look: _Look) -> GangPlan:
    gang, n, caps = look.gang, len(look.gang.members), look.caps
    rejected = tuple(look.rejected)
    if not look.classes:
        why = "; ".join(f"{r.vendor}/{r.model}: {r.reason}" for r in rejected)
        reason = f"gang {gang.name}: no device class can hold a rank" + (f": {why}" if why else "")
        return GangPlan(gang=gang.name, ok=False, reason=reason, rejected=rejected)
    single = [p for p in look.pools if p.tier < 2]
    ever = max((_capacity(p, caps, now=False) for p in look.pools), default=0)
    by_key = {c.key: c for c in look.classes}
    best = min(single, key=lambda p: (-_capacity(p, caps), p.classes, p.group), default=None)
    unit = by_key[best.classes[0]].demand if best else look.classes[0].demand
    what = "collective library" if any(p.tier >= 2 for p in look.pools) else "class"
    reason = f"gang {gang.name} needs {_amount(n, unit)} of one {what} in one network group"
    if best is not None:
        reason += f"; most free: {_amount(_capacity(best, caps), unit, free=True)} {best.where}"
    reason += _pledge_note(look, n) + _library_note(look, n)
    waits = ever >= n
    if not waits:
        reason += f"; it can never fit: the largest pool holds {ever} ranks even when empty"
    return GangPlan(gang=gang.name, ok=False, reason=reason, waits=waits, rejected=rejected)


def _amount(ranks: int, demand: Demand, *, free: bool = False) -> str:
    if demand.whole_device:
        return (
            f"{ranks * demand.devices} x {demand.key}"
            if free
            else (
                f"{ranks * demand.devices} devices"
                + (f" ({ranks} ranks x {demand.devices})" if demand.devices > 1 else "")
            )
        )
    room = f"{ranks} slices of {demand.vram_mib_per_device} MiB"
    return f"room for {room} on {demand.key}" if free else room


def _pledge_note(look: _Look, n: int) -> str:
    unpledged = {c.key: _NO_CAP for c in look.classes}
    if any(_fill(p, n, unpledged) is not None for p in look.pools):
        return "; outstanding pledges hold the room it would take"
    return ""


def _library_note(look: _Look, n: int) -> str:
    """Room enough in all, but only across collective libraries."""
    room: dict[str, int] = {}
    for pool in look.pools:
        if pool.tier < 2:
            room[pool.classes[0]] = room.get(pool.classes[0], 0) + _capacity(pool, look.caps)
    libraries = {c.key: c.library for c in look.classes}
    spanned = sorted({libraries[k] for k, r in room.items() if r > 0})
    if sum(room.values()) < n or len(spanned) < 2:
        return ""
    parts = ", ".join(f"{k} ({libraries[k]}): {r}" for k, r in sorted(room.items()) if r > 0)
    note = f"; room for {sum(room.values())} ranks only across {parts}, and {' and '.join(spanned)}"
    note += " cannot join one job"
    if "hccl" in spanned:
        note += " (no cross-vendor library bridges hccl)"
    elif not look.gang.collective:
        note += f" unless the gang opts in to a cross-vendor library ({', '.join(sorted(BRIDGES))})"
    return note


# ------------------------------------------------------------------ views --


def copies(state: ClusterState, placed: Iterable[RankPlace]) -> dict[str, NodeView]:
    """Copies of the schedulable nodes holding what ``placed`` takes."""
    nodes = {n.name: _clone(n) for n in state.schedulable()}
    for rank in placed:
        node = nodes.get(rank.node)
        if node is not None:
            hold_slices(node, f"placed:{rank.member}", rank.devices)
    return nodes


def _clone(node: NodeView) -> NodeView:
    devices = {
        i: DeviceView(
            fp=d.fp,
            reserved_mib=d.reserved_mib,
            whole_owner=d.whole_owner,
            slice_owners=set(d.slice_owners),
            verdict=d.verdict,
            health_score=d.health_score,
        )
        for i, d in node.devices.items()
    }
    return NodeView(
        name=node.name,
        fingerprint=node.fingerprint,
        seen_at=node.seen_at,
        devices=devices,
        reservations=node.reservations,
        stale=node.stale,
        verdict=node.verdict,
        node_labels=node.node_labels,
        blocked=node.blocked,
    )


# ------------------------------------------------------ collective flags --

# The value of each flag that is safe for every rank when nodes differ.
_CAUTIOUS = {
    collectives.P2P_DISABLE: "1",
    collectives.IB_DISABLE: "1",
    collectives.INTRA_PCIE: "0",
    collectives.INTRA_ROCE: "1",
}


def collective_flags(plan: GangPlan) -> dict[str, str]:
    """The ``hcs.io/collective-*`` values for every rank of ``plan``: one set
    for the whole job (ranks configured differently fail to connect). Each
    node's value is ``collectives.collective_annotations`` over all the job's
    devices there; where nodes differ the cautious value wins (peer-to-peer
    or InfiniBand off when one node lacks it, HCCL over RoCE when one
    node's NPUs lack HCCS)."""
    out: dict[str, str] = {}
    for part in plan.nodes:
        flags = collectives.collective_annotations(
            vendor=part.vendor,
            chosen=[d.index for d in part.devices],
            devices={d.index: d for d in part.devices},
            labels={RDMA_FABRIC_LABEL: part.rdma_fabric} if part.rdma_fabric else {},
        )
        for key, value in flags.items():
            if out.get(key) != _CAUTIOUS.get(key):
                out[key] = value
    return out


# --------------------------------------------------------------- admitting --


@dataclass(frozen=True, slots=True)
class Claim:
    """Room kept for a starving gang: the free devices of its classes in one group."""

    gang: str
    classes: tuple[str, ...]
    where: str
    devices: int


@dataclass(frozen=True, slots=True)
class Admission:
    start: tuple[GangPlan, ...] = ()  # placed whole, start now
    waiting: tuple[GangPlan, ...] = ()  # not now; each with its reason
    refused: tuple[GangPlan, ...] = ()  # never: bad members or no pool ever holds them
    claim: Claim | None = None  # room kept for the starving head


def admit_order(
    waiting: Iterable[Gang],
    *,
    state: ClusterState,
    now: float,
    starvation_s: float,
    held: Mapping[str, Held] | None = None,
    profiles: ProfileDB | None = None,
    rank: Mapping[str, int] | None = None,
) -> Admission:
    """Which waiting gangs start now.

    Gangs are taken by priority (highest first), then age (``since_s``,
    oldest first), then name; or, given ``rank`` (gang name → place in a
    queue order, such as the shared pool's), in that order. Each is planned whole (``plan_gang``) against
    the room the gangs started before it in this call left, so the gangs
    started never exceed the room together, and no gang holds part of what
    it needs: two gangs that each fit alone but not together never
    deadlock, the first starts and the second waits holding nothing.

    A gang that cannot start is passed over, and smaller ones behind it may
    start, until it has waited longer than ``starvation_s``. The first such
    gang in the order (the *head*) then claims one pool (``Claim``): of the
    pools of its classes in one network group that could ever hold it, the
    one with the most room free now (ties by tier, classes, group); every
    free device of its classes there is kept for it. The gangs behind it are
    planned as if those devices were taken, so they backfill only into room
    the head cannot use, the free room of its pool only grows as running
    work ends, and the head starts once it fits there (or anywhere sooner).
    Gangs ahead of it (higher priority, or older) are not held back; one
    head at a time claims, so backfill always has the rest of the fleet.
    """
    placed: list[RankPlace] = []
    claimed: list[RankPlace] = []
    start: list[GangPlan] = []
    wait: list[GangPlan] = []
    refused: list[GangPlan] = []
    head: Claim | None = None
    for gang in sorted(waiting, key=lambda g: _order_key(g, rank)):
        look = _Look.of(state, gang, held=held, placed=[*placed, *claimed], profiles=profiles)
        plan = _plan(look)
        if plan.ok:
            start.append(plan)
            placed += plan.ranks
        elif not plan.waits:
            refused.append(plan)
        else:
            waited = now - gang.since_s
            if waited > starvation_s and head is None:
                claim, claimed = _claim(look)
                if claim is not None:
                    head = claim
                    note = (
                        f"; waiting {waited:.0f} s (over {starvation_s:g} s): "
                        f"{claim.devices} free devices of {', '.join(claim.classes)} "
                        f"{claim.where} are kept for it"
                    )
                    plan = replace(plan, reason=plan.reason + note)
            wait.append(plan)
    return Admission(start=tuple(start), waiting=tuple(wait), refused=tuple(refused), claim=head)


def _order_key(gang: Gang, rank: Mapping[str, int] | None) -> tuple[object, ...]:
    if rank is not None and gang.name in rank:
        return (0, rank[gang.name], gang.name)
    return (1, -gang.priority, gang.since_s, gang.name)


def _claim(look: _Look) -> tuple[Claim | None, list[RankPlace]]:
    n, caps = len(look.gang.members), look.caps
    able = [p for p in look.pools if _capacity(p, caps, now=False) >= n]
    if not able:
        return None, []
    pool = min(able, key=lambda p: (-_capacity(p, caps), p.tier, p.classes, p.group))
    ranks = []
    for bin_ in pool.bins:
        node = look.nodes[bin_.node]
        free = [
            DeviceSlice(index=d.index, uuid=d.fp.uuid, vram_mib=d.free_mib, whole=True)
            for d in node.devices.values()
            if _class_of(d) == bin_.key and d.usable and d.free_mib > 0
        ]
        if free:
            vendor, _, model = bin_.key.partition("/")
            member = f"claim:{look.gang.name}"
            ranks.append(RankPlace(member, node.name, vendor, model, tuple(free), True))
    devices = sum(len(r.devices) for r in ranks)
    return Claim(look.gang.name, pool.classes, pool.where, devices), ranks
