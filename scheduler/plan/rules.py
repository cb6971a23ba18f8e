"""Plans: which vendor/model class serves a request, how many devices, how
much VRAM each, and the quota verdict (docs/architecture.md#flow-of-a-pod). Pure: no I/O, no clock.

A *class* is a vendor/model present in the cluster view. Every class not
chosen is listed in ``Plan.rejected`` with a reason a person can act on.

Sizing per class (VRAM ``V``, ACU ``A`` per device; measured ACU where the
agent measured it): without ``devices`` the pod needs
``x = max(vram/V, acu/A, tflops/T)`` devices; ``x < 1`` is a slice of one
device (VRAM as asked, or the compute share of ``V`` when no VRAM is asked),
otherwise ``ceil(x)`` whole devices. With ``devices`` the VRAM is per device;
one device below its full size is a slice, more are whole devices.

Choice: the named models (``policy.models``) when one has room now;
otherwise, with substitution ``allow``, the equivalent set of another class
(``profiles.equivalent``: by both ACU and VRAM; the substitute needing the
fewest devices, then the least over-provisioning, wins); with ``ask`` the plan
refuses and carries the ``offer``; with ``deny`` it waits for the named
model. Without named models the best-sized class with room wins (right
sizing: least ACU and VRAM committed beyond the request); among equally
sized ones the cheapest (least ACU per device), or with ``spread`` the one
with the largest share of its VRAM free, so a burst is spread over them. A class with no
room now but able to hold the pod when free still yields a plan (the pod
waits); a request no node can ever hold is refused at once.
"""

from __future__ import annotations

import collections
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from hcs_bus.messages import (
    AllocState,
    Offer,
    Plan,
    PlanRequest,
    QuotaVerdict,
    Rejection,
    Requests,
    Reservation,
)
from hcs_bus.profiles import Profile, ProfileDB, equivalent
from hcs_bus.units import DEVICES_RESOURCE, VRAM_RESOURCE, mib_to_bytes
from scheduler.extender.rules import device_class
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.pledge_rules import Held
from scheduler.view.state import DeviceView, NodeView

REFERENCE_TFLOPS_PER_ACU = 3.12  # 312 dense FP16 TFLOPS = 100 ACU
_EPS = 1e-9


@dataclass(slots=True)
class ClassStats:
    """One vendor/model class summarised over the schedulable nodes."""

    vendor: str
    model: str
    vram_mib: int = 0
    acu: float = 0.0
    devices: int = 0
    free_mib: int = 0
    max_usable_per_node: int = 0
    max_idle_per_node: int = 0
    kth_free: list[int] = field(default_factory=list)
    free_counts: dict[int, int] = field(default_factory=dict)  # usable devices by free MiB
    linked: bool = False
    idle_devices: int = 0  # usable devices with nothing on them, all nodes
    # outstanding pledges of this class (``scheduler.ledger.pledge_rules``)
    pledged: Held = field(default_factory=Held)

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.model}"


@dataclass(slots=True)
class Summary:
    classes: dict[str, ClassStats]
    usage: dict[str, tuple[int, float]]  # namespace → (VRAM MiB, ACU) reserved
    pledge_ids: frozenset[str] = frozenset()  # pledges the reservations came from


@dataclass(frozen=True, slots=True)
class QuotaLimits:
    """A namespace's ComputeQuota: ``vram_mib``/``acu`` the ceiling (``spec.hard``,
    what plans are checked against), the guarantee it always gets back, its
    fair-share weight, and guarantees per class (vendor/model or collective
    library → (VRAM MiB, ACU))."""

    vram_mib: int | None = None
    acu: float | None = None
    guaranteed_vram_mib: int | None = None
    guaranteed_acu: float | None = None
    weight: float = 1.0
    guaranteed_classes: tuple[tuple[str, int | None, float | None], ...] = ()


@dataclass(frozen=True, slots=True)
class Sizing:
    devices: int
    vram_mib_per_device: int
    whole: bool
    acu_per_device: float
    waste: float
    arithmetic: str


@dataclass(frozen=True, slots=True)
class ClassPart:
    """One class on one node: what ``merged`` folds into its ``ClassStats``."""

    key: str
    vendor: str
    model: str
    vram_mib: int  # the smallest device's usable VRAM
    acu: float  # the slowest device's
    devices: int
    linked: bool
    free_mib: int  # over the usable devices
    usable: int
    idle: int
    frees: tuple[int, ...]  # the usable devices' free VRAM, largest first
    free_counts: tuple[tuple[int, int], ...]  # (free VRAM, how many usable devices)


@dataclass(frozen=True, slots=True)
class NodePart:
    """One node's share of the summary, kept until the node changes: at
    5,000 nodes reporting every 10 s the view changes 500 times a second, and
    summarising every device again took 130 ms each time (``Parts``)."""

    classes: tuple[ClassPart, ...]
    usage: tuple[tuple[str, int, float, int], ...]  # namespace, VRAM MiB, ACU, devices reserved
    pledge_ids: tuple[str, ...]


# The states in which a reservation holds its devices, and so counts against
# its namespace's quota (released and expired ones hold nothing).
HOLDING: Final[frozenset[AllocState]] = frozenset({"reserved", "bound"})


@dataclass(frozen=True, slots=True)
class Usage:
    """What a namespace's reservations hold."""

    vram_mib: int = 0
    acu: float = 0.0
    devices: int = 0


def namespace_usage(reservations: Iterable[Reservation]) -> dict[str, Usage]:
    """Per namespace: the VRAM, ACU and devices its reservations hold (those
    in a ``HOLDING`` state): what its quota is charged, pledges aside."""
    out: dict[str, Usage] = {}
    for r in reservations:
        if r.state not in HOLDING:
            continue
        u = out.get(r.pod.namespace) or Usage()
        out[r.pod.namespace] = Usage(
            vram_mib=u.vram_mib + sum(s.vram_mib for s in r.devices),
            acu=u.acu + r.acu,
            devices=u.devices + len(r.devices),
        )
    return out


def summarise(nodes: Iterable[NodeView]) -> Summary:
    """Class statistics and per-namespace usage from the view."""
    return merged((node_part(node), node.schedulable) for node in nodes)


def node_part(node: NodeView) -> NodePart:
    usage = namespace_usage(node.reservations.values())
    ids = [res.pledge for res in node.reservations.values() if res.pledge]
    by_class: dict[str, list[DeviceView]] = {}
    for device in node.devices.values():
        by_class.setdefault(device_class(device), []).append(device)
    classes = tuple(_class_part(key, devices) for key, devices in by_class.items())
    return NodePart(
        classes=classes,
        usage=tuple((ns, u.vram_mib, u.acu, u.devices) for ns, u in usage.items()),
        pledge_ids=tuple(ids),
    )


def _class_part(key: str, devices: list[DeviceView]) -> ClassPart:
    usable = [d for d in devices if d.usable]
    frees = sorted((d.free_mib for d in usable), reverse=True)
    first = devices[0].fp
    return ClassPart(
        key=key,
        vendor=first.vendor,
        model=first.model,
        vram_mib=min(d.fp.vram_usable_mib for d in devices),
        acu=min(d.fp.compute.acu for d in devices),
        devices=len(devices),
        # peer links only (NVLink, HCCS, xGMI, MLU-Link): a PCIe path is no high-bandwidth link
        linked=any(
            link.type != "pcie" and link.bandwidth_gbps > 0 for d in devices for link in d.fp.links
        ),
        free_mib=sum(frees),
        usable=len(usable),
        idle=sum(1 for d in usable if d.idle),
        frees=tuple(frees),
        free_counts=tuple(collections.Counter(frees).items()),
    )


def merged(parts: Iterable[tuple[NodePart, bool]]) -> Summary:
    """The summary of nodes' parts, each with whether its node is
    schedulable (a node that is not adds its usage, not its room)."""
    classes: dict[str, ClassStats] = {}
    usage: dict[str, tuple[int, float]] = {}
    ids: set[str] = set()
    for part, schedulable in parts:
        for ns, vram, acu, _devices in part.usage:
            held_vram, held_acu = usage.get(ns, (0, 0.0))
            usage[ns] = (held_vram + vram, held_acu + acu)
        ids.update(part.pledge_ids)
        if schedulable:
            for c in part.classes:
                _fold(classes, c)
    return Summary(classes=classes, usage=usage, pledge_ids=frozenset(ids))


def _fold(classes: dict[str, ClassStats], c: ClassPart) -> None:
    stats = classes.get(c.key)
    if stats is None:
        stats = classes[c.key] = ClassStats(
            vendor=c.vendor, model=c.model, vram_mib=c.vram_mib, acu=c.acu
        )
    else:
        stats.vram_mib = min(stats.vram_mib, c.vram_mib)
        stats.acu = min(stats.acu, c.acu)
    stats.devices += c.devices
    stats.linked = stats.linked or c.linked
    stats.free_mib += c.free_mib
    stats.idle_devices += c.idle
    stats.max_usable_per_node = max(stats.max_usable_per_node, c.usable)
    stats.max_idle_per_node = max(stats.max_idle_per_node, c.idle)
    counts = stats.free_counts
    for value, n in c.free_counts:
        counts[value] = counts.get(value, 0) + n
    kth = stats.kth_free
    for k, value in enumerate(c.frees):
        if k == len(kth):
            kth.append(value)
        elif value > kth[k]:
            kth[k] = value


def charged(
    summary: Summary, *, by_class: Mapping[str, Held], by_namespace: Mapping[str, Held]
) -> Summary:
    """``summary`` with (more) outstanding pledges counted: a class's room
    shrinks by what is pledged on it, a namespace's usage grows by its pledges."""
    classes = {
        key: replace(stats, pledged=stats.pledged.add(by_class[key])) if key in by_class else stats
        for key, stats in summary.classes.items()
    }
    usage = dict(summary.usage)
    for ns, pledged in by_namespace.items():
        vram, acu = usage.get(ns, (0, 0.0))
        usage[ns] = (vram + pledged.vram_mib, acu + pledged.acu)
    return Summary(classes=classes, usage=usage, pledge_ids=summary.pledge_ids)


# ----------------------------------------------------------------- sizing --


def _class_tflops(stats: ClassStats, profile: Profile | None) -> dict[str, float | None]:
    fp16 = stats.acu * REFERENCE_TFLOPS_PER_ACU
    scale = stats.acu / profile.acu if profile is not None and profile.acu else 1.0
    bf16 = profile.tflops_bf16 * scale if profile and profile.tflops_bf16 else None
    fp32 = profile.tflops_fp32 * scale if profile and profile.tflops_fp32 else None
    return {"tflops_fp16": fp16, "tflops_bf16": bf16, "tflops_fp32": fp32}


def size(req: Requests, stats: ClassStats, profile: Profile | None) -> Sizing | str:
    """How ``req`` maps onto devices of ``stats``; a string says why it cannot."""
    if stats.vram_mib <= 0 or stats.acu <= 0:
        return "class reports no VRAM or compute"
    shares = {"ACU": req.acu / stats.acu}
    for name, per_device in _class_tflops(stats, profile).items():
        asked = getattr(req, name)
        if asked <= 0:
            continue
        if per_device is None:
            return f"no {name.replace('_', ' ').upper()} figure for this class"
        shares[name.replace("_", "-")] = asked / per_device
    compute = max(shares.values())
    if req.devices is not None:
        return _size_fixed(req, stats, compute)
    shares["VRAM"] = req.vram_mib / stats.vram_mib
    need = max(shares.values())
    why = ", ".join(f"{k} {v:.2f}" for k, v in shares.items() if v > 0)
    if need <= _EPS:
        return "request asks for no VRAM, compute or devices"
    if need < 1.0 - _EPS:
        vram = req.vram_mib or math.ceil(compute * stats.vram_mib)
        acu = max(compute, vram / stats.vram_mib) * stats.acu
        # a slice commits only its share: the rest of the device stays free
        return Sizing(1, vram, False, acu, 0.0, f"{why} of one device → a slice")
    n = math.ceil(need - _EPS)
    return Sizing(n, stats.vram_mib, True, stats.acu, _waste(n, shares), f"{why} → {n} whole")


def _size_fixed(req: Requests, stats: ClassStats, compute: float) -> Sizing | str:
    n = req.devices or 0
    if n < 1:
        return "devices must be at least 1"
    if req.vram_mib > stats.vram_mib:
        return f"asks {req.vram_mib} MiB per device, a device has {stats.vram_mib} MiB"
    if compute > n + _EPS:
        return f"{n} device(s) give {n * stats.acu:.0f} ACU, the request needs {compute:.2f}"
    shares = {"devices": float(n), "compute": compute}
    if n == 1 and req.vram_mib and req.vram_mib < stats.vram_mib and compute < 1.0 - _EPS:
        acu = max(compute, req.vram_mib / stats.vram_mib) * stats.acu
        return Sizing(1, req.vram_mib, False, acu, 0.0, "1 device asked → a slice")
    return Sizing(n, stats.vram_mib, True, stats.acu, _waste(n, shares), f"{n} whole asked")


def _waste(committed: float, shares: dict[str, float]) -> float:
    """How far the committed devices exceed what the request needs (0 = exact)."""
    need = max(shares.values())
    return committed / need - 1.0 if need > 0 else 0.0


def has_room(stats: ClassStats, sizing: Sizing) -> bool:
    """Some single node has room for the pod now, and the class as a whole
    once its outstanding pledges are placed, slices counted as they pack
    (:func:`scheduler.ledger.pledge_rules.slices_fit`)."""
    idle, free = pledges.room_left(
        idle_devices=stats.idle_devices,
        free_mib=stats.free_mib,
        vram_mib=stats.vram_mib,
        pledged=stats.pledged,
    )
    if sizing.whole:
        return stats.max_idle_per_node >= sizing.devices and idle >= sizing.devices
    n = sizing.devices
    if free < n * sizing.vram_mib_per_device:
        return False
    if not (len(stats.kth_free) >= n and stats.kth_free[n - 1] >= sizing.vram_mib_per_device):
        return False
    return pledges.slices_fit(
        stats.free_counts,
        device_mib=stats.vram_mib,
        size_mib=sizing.vram_mib_per_device,
        devices=n,
        pledged=stats.pledged,
    )


# ------------------------------------------------------------------ plans --


def _norm(name: str) -> str:
    return re.sub(r"[^0-9a-z]", "", name.lower())


def named(stats: ClassStats, names: Iterable[str], profiles: ProfileDB) -> bool:
    """Whether a class is one of the models a policy names (any spelling)."""
    wanted = {_norm(n) for n in names}
    if _norm(stats.model) in wanted or _norm(stats.key) in wanted:
        return True
    for name in names:
        found = profiles.match(None, name)
        if found is not None and found.key == stats.key:
            return True
    return False


def _profile(profiles: ProfileDB, key: str) -> Profile | None:
    try:
        return profiles.get(key)
    except KeyError:
        return None


@dataclass(slots=True)
class _Candidate:
    stats: ClassStats
    sizing: Sizing
    room: bool


def _assess(
    request: PlanRequest, summary: Summary, profiles: ProfileDB
) -> tuple[list[_Candidate], list[Rejection]]:
    """Size every class; refusals become Rejections, the rest candidates."""
    policy = request.policy
    vendors = {v.lower() for v in policy.vendors}
    out: list[_Candidate] = []
    rejected: list[Rejection] = []
    for key in sorted(summary.classes):
        stats = summary.classes[key]
        reason = _refuse(request, stats, vendors, profiles)
        if isinstance(reason, str):
            rejected.append(Rejection(vendor=stats.vendor, model=stats.model, reason=reason))
            continue
        out.append(_Candidate(stats, reason, has_room(stats, reason)))
    return out, rejected


def _refuse(
    request: PlanRequest, stats: ClassStats, vendors: set[str], profiles: ProfileDB
) -> Sizing | str:
    if vendors and stats.vendor.lower() not in vendors:
        allowed = ", ".join(sorted(vendors))
        return f"vendor {stats.vendor} not allowed by policy (vendors: {allowed})"
    sizing = size(request.requests, stats, _profile(profiles, stats.key))
    if isinstance(sizing, str):
        return sizing
    if sizing.devices > stats.max_usable_per_node:
        return (
            f"needs {sizing.devices} devices on one node, the largest {stats.key} node "
            f"has {stats.max_usable_per_node} usable"
        )
    if request.policy.topology == "high-bandwidth" and sizing.devices > 1 and not stats.linked:
        return "topology high-bandwidth asked, these devices have no peer links (PCIe only)"
    return sizing


def _rank(candidates: list[_Candidate], *, spread: bool = False) -> list[_Candidate]:
    """Room first, then the least waste; then the cheapest class (pack) or
    the one with the largest share of its VRAM free (spread)."""

    def key(c: _Candidate) -> tuple[object, ...]:
        stats = c.stats
        if spread:
            prefer: tuple[float, ...] = (-free_share(stats), stats.acu)
        else:
            prefer = (stats.acu, stats.pledged.vram_mib - stats.free_mib)
        return (not c.room, c.sizing.waste, *prefer, stats.key)

    return sorted(candidates, key=key)


def free_share(stats: ClassStats) -> float:
    """The share of a class's VRAM neither reserved nor pledged."""
    total = stats.vram_mib * stats.devices
    return (stats.free_mib - stats.pledged.vram_mib) / total if total > 0 else 0.0


def plan(
    request: PlanRequest,
    *,
    summary: Summary,
    profiles: ProfileDB,
    quota: QuotaLimits | None = None,
    spread: bool = False,
) -> Plan:
    """The plan for ``request`` on the cluster ``summary`` (see module doc)."""
    candidates, rejected = _assess(request, summary, profiles)
    names = request.policy.models
    if names:
        return _plan_named(request, candidates, rejected, summary, profiles, quota, spread=spread)
    if not candidates:
        return _refused(request, rejected, "no device class in the cluster can serve this request")
    best, *others = _rank(candidates, spread=spread)
    rejected += [_outranked(c, best, spread=spread) for c in others]
    return _finish(request, best, rejected, summary, quota)


def _plan_named(
    request: PlanRequest,
    candidates: list[_Candidate],
    rejected: list[Rejection],
    summary: Summary,
    profiles: ProfileDB,
    quota: QuotaLimits | None,
    *,
    spread: bool,
) -> Plan:
    names = request.policy.models
    mine = [c for c in candidates if named(c.stats, names, profiles)]
    others = [c for c in candidates if c not in mine]
    ranked = _rank(mine, spread=spread)
    if (ranked and ranked[0].room) or request.policy.substitution == "deny":
        rejected += [_not_named(c, names) for c in others]
        if not ranked:
            return _refused(
                request,
                rejected,
                f"no class named by policy.models ({', '.join(names)}) can serve this request",
            )
        rejected += [_outranked(c, ranked[0], spread=spread) for c in ranked[1:]]
        return _finish(request, ranked[0], rejected, summary, quota)
    return _substitute(request, ranked, others, rejected, summary, profiles, quota)


def _substitute(
    request: PlanRequest,
    mine: list[_Candidate],
    others: list[_Candidate],
    rejected: list[Rejection],
    summary: Summary,
    profiles: ProfileDB,
    quota: QuotaLimits | None,
) -> Plan:
    """The named model has no room: an equivalent set of another class."""
    source = _source_profile(request, mine, profiles)
    offers: list[tuple[_Candidate, str]] = []
    for cand in _rank(others):
        target = _profile(profiles, cand.stats.key)
        if source is None or target is None or not cand.room:
            why = "no room now" if not cand.room else "no profile to convert between"
            rejected.append(_reject(cand, f"not named by policy.models; substitute: {why}"))
            continue
        offers.append((cand, _convert(request, source, cand, target)))
    for cand in mine:
        rejected.append(_reject(cand, "named by policy.models but no node has room now"))
    # fewest devices first (least re-sharding of a job written for one
    # model), then the least over-provisioning
    offers.sort(key=lambda o: (o[0].sizing.devices, o[0].sizing.waste, o[0].stats.key))
    if not offers:
        if mine:
            return _finish(request, mine[0], rejected, summary, quota, waiting=True)
        return _refused(request, rejected, "named models are absent and no substitute has room")
    (best, arithmetic), *rest = offers
    rejected += [_outranked(c, best) for c, _ in rest]
    src = source.key if source is not None else ""
    if request.policy.substitution == "ask":
        offer = Offer(
            vendor=best.stats.vendor,
            model=best.stats.model,
            devices=best.sizing.devices,
            vram_mib_per_device=best.sizing.vram_mib_per_device,
            arithmetic=arithmetic,
        )
        reason = (
            f"{src} is exhausted; substitution is 'ask': would offer "
            f"{best.sizing.devices} × {best.stats.key} ({arithmetic})"
        )
        return Plan(ok=False, reason=reason, rejected=tuple(rejected), offer=offer)
    done = _finish(request, best, rejected, summary, quota)
    note = f"substituted for exhausted {src}: {arithmetic}"
    reason = f"{done.reason}; {note}" if done.reason else note
    return _replace(done, substituted_from=src, reason=reason)


def _source_profile(
    request: PlanRequest, mine: list[_Candidate], profiles: ProfileDB
) -> Profile | None:
    for cand in mine:
        found = _profile(profiles, cand.stats.key)
        if found is not None:
            return found
    for name in request.policy.models:
        found = profiles.match(None, name)
        if found is not None:
            return found
    return None


def _convert(request: PlanRequest, source: Profile, cand: _Candidate, target: Profile) -> str:
    """The arithmetic behind a substitution; whole-device requests are
    converted device for device by ACU and VRAM (``profiles.equivalent``)."""
    req = request.requests
    src_stats = ClassStats(
        vendor=source.vendor, model=source.model, vram_mib=source.vram_mib, acu=source.acu
    )
    src_size = size(req, src_stats, source)
    if isinstance(src_size, Sizing) and src_size.whole:
        conversion = equivalent(source, src_size.devices, target)
        devices = max(conversion.devices, cand.sizing.devices)
        waste = devices / conversion.exact - 1.0 if conversion.exact > 0 else 0.0
        cand.sizing = Sizing(
            devices, cand.stats.vram_mib, True, cand.stats.acu, waste, conversion.arithmetic
        )
        return conversion.arithmetic
    return cand.sizing.arithmetic + f" on {target.key}"


def _finish(
    request: PlanRequest,
    cand: _Candidate,
    rejected: list[Rejection],
    summary: Summary,
    quota: QuotaLimits | None,
    *,
    waiting: bool = False,
) -> Plan:
    sizing, stats = cand.sizing, cand.stats
    verdict = check_quota(request.namespace, sizing=sizing, summary=summary, quota=quota)
    reason = sizing.arithmetic
    if waiting or not cand.room:
        reason += "; no node has room now: the pod waits for devices to free up"
    ok = verdict.ok
    return Plan(
        ok=ok,
        reason=verdict.reason if not ok else reason,
        vendor=stats.vendor,
        model=stats.model,
        models=(stats.model,),
        devices=sizing.devices,
        vram_mib_per_device=sizing.vram_mib_per_device,
        whole_device=sizing.whole,
        acu_per_device=round(sizing.acu_per_device, 3),
        runtime_profile=stats.vendor,
        quota=verdict,
        rejected=tuple(rejected),
        node_capacity=node_capacity(stats),
    )


def node_capacity(stats: ClassStats) -> dict[str, int]:
    """What the largest node of the class advertises to its kubelet (the agent's
    units: bytes, whole devices), so the webhook can refuse a pod no node of the
    class would admit. ACU is left out: measured ACU may exceed the profile's."""
    if stats.max_usable_per_node <= 0:
        return {}
    return {
        VRAM_RESOURCE: mib_to_bytes(stats.max_usable_per_node * stats.vram_mib),
        DEVICES_RESOURCE: stats.max_usable_per_node,
    }


def check_quota(
    namespace: str, *, sizing: Sizing, summary: Summary, quota: QuotaLimits | None
) -> QuotaVerdict:
    used_vram, used_acu = summary.usage.get(namespace, (0, 0.0))
    if quota is None:
        return QuotaVerdict(ok=True, vram_mib_used=used_vram, acu_used=round(used_acu, 3))
    ask_vram = sizing.devices * sizing.vram_mib_per_device
    ask_acu = sizing.devices * sizing.acu_per_device
    problems = []
    if quota.vram_mib is not None and used_vram + ask_vram > quota.vram_mib:
        problems.append(
            f"VRAM limit {quota.vram_mib} MiB, used {used_vram} MiB, asked {ask_vram} MiB"
        )
    if quota.acu is not None and used_acu + ask_acu > quota.acu + _EPS:
        problems.append(f"ACU limit {quota.acu:g}, used {used_acu:.1f}, asked {ask_acu:.1f}")
    reason = f"quota of namespace {namespace} exceeded: " + "; ".join(problems) if problems else ""
    return QuotaVerdict(
        ok=not problems,
        reason=reason,
        vram_mib_used=used_vram,
        vram_mib_hard=quota.vram_mib,
        acu_used=round(used_acu, 3),
        acu_hard=quota.acu,
    )


def _refused(request: PlanRequest, rejected: list[Rejection], reason: str) -> Plan:
    if not rejected:
        reason += " (the cluster view holds no devices)"
    else:
        reason += ": " + "; ".join(f"{r.vendor}/{r.model}: {r.reason}" for r in rejected)
    return Plan(ok=False, reason=reason, rejected=tuple(rejected))


def _reject(cand: _Candidate, reason: str) -> Rejection:
    return Rejection(vendor=cand.stats.vendor, model=cand.stats.model, reason=reason)


def _not_named(cand: _Candidate, names: Iterable[str]) -> Rejection:
    return _reject(cand, f"not named by policy.models ({', '.join(names)}); substitution is off")


def _outranked(cand: _Candidate, best: _Candidate, *, spread: bool = False) -> Rejection:
    if not cand.room and best.room:
        return _reject(cand, "no node has room now")
    if spread and cand.sizing.waste == best.sizing.waste:
        return _reject(
            cand,
            f"{cand.stats.key} has {free_share(cand.stats):.0%} of its VRAM free, "
            f"{best.stats.key} {free_share(best.stats):.0%} (placement: spread)",
        )
    return _reject(
        cand,
        f"{cand.sizing.devices} × {cand.stats.key} fits worse than "
        f"{best.sizing.devices} × {best.stats.key} (over-provisioning {cand.sizing.waste:.0%} vs "
        f"{best.sizing.waste:.0%}, {cand.stats.acu:.0f} vs {best.stats.acu:.0f} ACU per device)",
    )


def _replace(plan_: Plan, **changes: object) -> Plan:
    import msgspec

    return msgspec.structs.replace(plan_, **changes)
