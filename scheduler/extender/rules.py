"""Device decisions at filter, prioritize, bind and preempt. Pure: no I/O.

* ``check_node`` — can this node hold the pod now? A refusal says whether
  preemption could help (``unresolvable`` when not: unknown or stale node,
  isolated node, wrong vendor/model class, too few usable devices even empty).
* ``choose_devices`` — the device set inside a node: one device by best fit
  (the fullest device that still fits, so big holes stay big); several by the
  best interconnect (maximise the minimum pairwise bandwidth, then the total;
  exact branch-and-bound search, candidate sets are ≤ 16 devices).
* ``node_score`` — components in 0..1, combined by configurable weights into
  an integer 0..10 (the extender's scale):

  - ``binpack``: share of the node's class VRAM reserved once the pod is
    placed (partly used nodes first, empty nodes kept whole); with
    ``placement: spread`` the share left free instead (emptiest first);
  - ``health``: (mean + min) / 2 of the chosen devices' health scores;
  - ``job_affinity``: 1 when the node shares a network group (RDMA fabric
    label, else network-group label; read from the Node object where the
    Node is known) with the job's existing reservations; left out for pods
    without a job or for the job's first pod;
  - ``right_size``: how much of each chosen device the pod uses (VRAM for a
    slice, ACU for a whole device) — a T4-sized request scores low on an H200;
  - ``topology``: minimum pairwise bandwidth of the chosen set relative to
    the best node scored in the same call (1 for single devices).
* ``victims_for`` — lowest priority first, never equal or higher priority,
  never a gang member (``split_gang``: a gang goes whole or not at all).
* ``fragmentation`` — share of free VRAM in pieces too small for a typical
  request.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hcs_bus.messages import DeviceSlice, NodeReservations, Reservation
from hcs_bus.settings import SchedulerSettings
from scheduler.plan.pods import PlanAnnotation
from scheduler.view.state import NETWORK_LABELS, DeviceView, NodeView, booked, hold_slices

Demand = PlanAnnotation
MAX_EXACT_DEVICES = 16
TIE_WEIGHT = 0.5  # under one score step: the free share orders nodes of one score only


@dataclass(frozen=True, slots=True)
class Fit:
    ok: bool
    reason: str = ""
    unresolvable: bool = False
    candidates: tuple[DeviceView, ...] = ()


@dataclass(frozen=True, slots=True)
class Weights:
    binpack: float = 1.0
    health: float = 1.0
    job_affinity: float = 1.0
    right_size: float = 1.0
    topology: float = 1.0
    spread: bool = False  # the binpack part counts the other way: emptiest first

    @classmethod
    def from_settings(cls, settings: SchedulerSettings) -> Weights:
        return cls(
            binpack=settings.weight_binpack,
            health=settings.weight_health,
            job_affinity=settings.weight_job_affinity,
            right_size=settings.weight_right_size,
            topology=settings.weight_topology,
            spread=settings.placement == "spread",
        )


@dataclass(frozen=True, slots=True)
class Components:
    """A node's score parts in 0..1 (``topology_gbps`` raw, normalised later)."""

    binpack: float
    health: float
    right_size: float
    topology_gbps: float
    group: str | None


def device_class(device: DeviceView) -> str:
    return f"{device.fp.vendor}/{device.fp.model}"


def _unresolvable(reason: str) -> Fit:
    return Fit(ok=False, reason=reason, unresolvable=True)


def check_node(node: NodeView | None, demand: Demand) -> Fit:
    """Whether ``node`` can hold ``demand`` now, and on which devices."""
    if node is None:
        return _unresolvable("hcs: node unknown to HCS (no fingerprint from its agent)")
    if node.stale:
        return _unresolvable("hcs: node is stale (its agent stopped reporting)")
    if node.verdict == "failed":
        return _unresolvable("hcs: node isolated by the healer")
    key, n, vram = demand.key, demand.devices, demand.vram_mib_per_device
    of_class = [d for d in node.devices.values() if device_class(d) == key]
    if not of_class:
        have = ", ".join(sorted(node.models())) or "no devices"
        return _unresolvable(f"hcs: no {key} devices on this node (it has {have})")
    usable = [d for d in of_class if d.usable and d.fp.vram_usable_mib >= vram]
    if len(usable) < n:
        return _unresolvable(
            f"hcs: {len(usable)} usable {key} devices of {len(of_class)}, pod needs {n}"
            + (f" with {vram} MiB each" if not demand.whole_device else "")
            + _driver_note(of_class, vram_mib=vram)
        )
    if demand.whole_device:
        fitting = [d for d in usable if d.idle]
        what = "idle"
    else:
        fitting = [d for d in usable if d.free_mib >= vram]
        what = f"with {vram} MiB free"
    if len(fitting) < n:
        return Fit(
            ok=False,
            reason=f"hcs: {len(fitting)} {key} {what}, pod needs {n} (preemption may help)",
        )
    return Fit(ok=True, candidates=tuple(fitting))


def _driver_note(devices: Sequence[DeviceView], *, vram_mib: int) -> str:
    """Why devices large enough by their total still cannot hold ``vram_mib``."""
    held = [d.fp for d in devices if d.fp.vram_usable_mib < vram_mib <= d.fp.vram_total_mib]
    if not held:
        return ""
    top = max(held, key=lambda fp: fp.vram_usable_mib)
    return (
        f" (the driver holds {top.vram_driver_mib} MiB of each {top.vram_total_mib} MiB,"
        f" so at most {top.vram_usable_mib} MiB can be promised)"
    )


# ------------------------------------------------------------ device sets --


def bandwidths(devices: Iterable[DeviceView]) -> dict[tuple[int, int], float]:
    """Pairwise link bandwidth (GB/s) by device index, both directions."""
    out: dict[tuple[int, int], float] = {}
    for device in devices:
        for link in device.fp.links:
            a, b = device.index, link.peer_index
            best = max(out.get((a, b), 0.0), link.bandwidth_gbps)
            out[(a, b)] = out[(b, a)] = best
    return out


def choose_devices(fit: Fit, demand: Demand) -> list[DeviceView]:
    """The device set for ``demand`` among ``fit.candidates`` (which hold ≥ n)."""
    order = sorted(fit.candidates, key=lambda d: (d.free_mib, -d.health_score, d.index))
    n = demand.devices
    if n == 1 or len(order) == n:
        return order[:n]
    bw = bandwidths(order)
    chosen = best_set([d.index for d in order], n=n, bw=bw)
    by_index = {d.index: d for d in order}
    return [by_index[i] for i in chosen]


def set_bandwidth(indices: Sequence[int], bw: dict[tuple[int, int], float]) -> tuple[float, float]:
    """(minimum, total) pairwise bandwidth of a device set."""
    pairs = [bw.get((a, b), 0.0) for a, b in itertools.combinations(indices, 2)]
    return (min(pairs), sum(pairs)) if pairs else (0.0, 0.0)


def best_set(order: list[int], *, n: int, bw: dict[tuple[int, int], float]) -> list[int]:
    """The n-subset of ``order`` with the best (min, total) pairwise bandwidth.

    Exact branch and bound: a partial set whose minimum is already below the
    best found, or whose total cannot catch up, is pruned. Ties keep the
    earlier (better-fitting) devices. Beyond 16 candidates the first 16 count.
    """
    order = order[:MAX_EXACT_DEVICES]
    values = {bw.get(pair, 0.0) for pair in itertools.combinations(order, 2)}
    if len(values) <= 1:
        return order[:n]
    top = max(values)
    score: list[float] = [-1.0, -1.0]
    found: list[int] = order[:n]

    def grow(start: int, chosen: list[int], low: float, total: float) -> None:
        left = n - len(chosen)
        if left == 0:
            if (low, total) > (score[0], score[1]):
                score[:] = [low, total]
                found[:] = chosen
            return
        best_low, best_total = score
        pairs_left = left * len(chosen) + left * (left - 1) // 2
        if low < best_low or (low == best_low and total + pairs_left * top <= best_total):
            return
        for i in range(start, len(order) - left + 1):
            d = order[i]
            links = [bw.get((c, d), 0.0) for c in chosen]
            grow(i + 1, [*chosen, d], min([low, *links]), total + sum(links))

    grow(0, [], float("inf"), 0.0)
    return found


# ----------------------------------------------------------------- scores --


def components(node: NodeView, fit: Fit, demand: Demand) -> Components:
    """Score parts of a node that fits (cacheable per node and demand)."""
    chosen = choose_devices(fit, demand)
    of_class = [d for d in node.devices.values() if device_class(d) == demand.key]
    total = sum(d.fp.vram_usable_mib for d in of_class) or 1
    used = sum(d.fp.vram_usable_mib - d.free_mib for d in of_class)
    placed = sum(_takes(d, demand) for d in chosen)
    scores = [d.health_score for d in chosen]
    health = (sum(scores) / len(scores) + min(scores)) / 200.0
    fit_share = sum(_right_size(d, demand) for d in chosen) / len(chosen)
    low, _ = set_bandwidth([d.index for d in chosen], bandwidths(chosen))
    return Components(
        binpack=min((used + placed) / total, 1.0),
        health=max(min(health, 1.0), 0.0),
        right_size=fit_share,
        topology_gbps=low if demand.devices > 1 else 0.0,
        group=network_group(node),
    )


def with_others(
    node: NodeView, parts: Components, demand: Demand, others: Sequence[Demand]
) -> Components:
    """``parts`` (of ``node`` for ``demand``) once ``others``, pods promised
    the node and not booked there yet, hold their VRAM of ``demand``'s class
    too: its binpack share when their binds land."""
    key = demand.key
    if not any(o.key == key for o in others):
        return parts
    of_class = [d for d in node.devices.values() if device_class(d) == key]
    total = sum(d.fp.vram_usable_mib for d in of_class) or 1
    largest = max((d.fp.vram_usable_mib for d in of_class), default=0)
    taken = sum(
        o.devices * (largest if o.whole_device else o.vram_mib_per_device)
        for o in others
        if o.key == key
    )
    return replace(parts, binpack=min(parts.binpack + taken / total, 1.0))


def _takes(device: DeviceView, demand: Demand) -> int:
    return device.fp.vram_usable_mib if demand.whole_device else demand.vram_mib_per_device


def _right_size(device: DeviceView, demand: Demand) -> float:
    if demand.whole_device:
        if demand.acu_per_device <= 0 or device.fp.compute.acu <= 0:
            return 1.0
        return min(demand.acu_per_device / device.fp.compute.acu, 1.0)
    return min(demand.vram_mib_per_device / max(device.fp.vram_usable_mib, 1), 1.0)


def network_group(node: NodeView) -> str | None:
    """The node's RDMA fabric, else its network group (Node labels first:
    ``state.merged_labels``)."""
    labels = node.labels
    for label in NETWORK_LABELS:
        value = labels.get(label)
        if value:
            return value
    return None


def node_score(
    parts: Components, *, weights: Weights, best_gbps: float, job_groups: set[str] | None
) -> int:
    """Combine components into the extender's 0..10 integer."""
    topology = parts.topology_gbps / best_gbps if best_gbps > 0 else 1.0
    pairs = [
        (weights.binpack, 1.0 - parts.binpack if weights.spread else parts.binpack),
        (weights.health, parts.health),
        (weights.right_size, parts.right_size),
        (weights.topology, topology),
    ]
    if job_groups:
        pairs.append((weights.job_affinity, 1.0 if parts.group in job_groups else 0.0))
    total_weight = sum(w for w, _ in pairs)
    if total_weight <= 0:
        return 0
    value = sum(w * c for w, c in pairs) / total_weight
    return max(0, min(10, round(value * 10)))


def ranked(parts: Components, *, weights: Weights) -> tuple[int, float]:
    """(score, rank) of a node for a pod whose score topology and job affinity
    leave alone (one device, no job placed yet). The rank picks one node of
    several: the score, and under spread then the free share (the emptiest
    first). The 0..10 scores are coarse: an 80 GiB × 8 node scores the same
    holding 8 or 23 pods of 16 GiB, so without the finer order a burst fills
    the first of them. The share adds less than one score step
    (``TIE_WEIGHT``), so it orders ties only."""
    score = node_score(parts, weights=weights, best_gbps=0.0, job_groups=None)
    if not weights.spread:
        return score, float(score)
    return score, score + TIE_WEIGHT * (1.0 - parts.binpack)


# ------------------------------------------------------------- preemption --


def fits_after(
    node: NodeView, doc: NodeReservations | None, others: Sequence[Demand], demand: Demand
) -> bool:
    """Whether ``node`` holding ``doc`` can still hold ``demand`` once each
    of ``others`` has its devices too (chosen as a bind would; one that no
    longer fits is left out)."""
    copy = booked(node, doc)
    for i, other in enumerate(others):
        fit = check_node(copy, other)
        if fit.ok:
            hold_slices(copy, f"(picked {i})", slices_for(choose_devices(fit, other), other))
    return check_node(copy, demand).ok


def fits_with_picks(
    node: NodeView, doc: NodeReservations | None, others: Sequence[Demand], demand: Demand
) -> bool:
    """``fits_after`` for a ``node`` that holds ``doc`` already (the view's
    node and its document): counted in slices when that decides it exactly,
    else played out on a copy."""
    counted = _slices_left(node, others, demand)
    return fits_after(node, doc, others, demand) if counted is None else counted


def _slices_left(node: NodeView, others: Sequence[Demand], demand: Demand) -> bool | None:
    """Whether ``demand`` still fits once ``others`` hold their devices, when
    it and every one of ``others`` of its class is one slice of the same size
    (a burst of one kind of pod): a device with ``f`` MiB free holds
    ``f // size`` such slices wherever each lands, so the demand fits after
    the others exactly when the node holds more slices than there are others.
    Others of another class take other devices. None: not that case."""
    if demand.whole_device or demand.devices != 1 or demand.vram_mib_per_device <= 0:
        return None
    key, size = demand.key, demand.vram_mib_per_device
    ahead = 0
    for other in others:
        if other.key != key:
            continue
        if other.whole_device or other.devices != 1 or other.vram_mib_per_device != size:
            return None
        ahead += 1
    if not check_node(node, demand).ok:  # others only take: it cannot fit after them
        return False
    slices = 0
    for device in node.devices.values():
        if device.usable and device.fp.vram_usable_mib >= size and device_class(device) == key:
            slices += device.free_mib // size
            if slices > ahead:
                return True
    return False


def slices_for(devices: Iterable[DeviceView], demand: Demand) -> tuple[DeviceSlice, ...]:
    """What ``demand`` takes of each of the chosen ``devices``."""
    return tuple(
        DeviceSlice(
            index=d.index,
            uuid=d.fp.uuid,
            vram_mib=d.fp.vram_usable_mib if demand.whole_device else demand.vram_mib_per_device,
            whole=demand.whole_device,
        )
        for d in devices
    )


def victims_for(
    node: NodeView,
    doc: NodeReservations | None,
    demand: Demand,
    *,
    priority: int,
    already: set[str],
    spared: Collection[str] = (),
) -> list[Reservation] | None:
    """The fewest lowest-priority reservations whose removal (with the pods
    kube-scheduler already chose, ``already`` UIDs) lets ``demand`` fit; None
    when no set of strictly lower-priority victims helps. The pods ``spared``
    (UIDs: gang members, which go whole or not at all) are never chosen."""
    held = doc.reservations if doc is not None else ()
    keep = [r for r in held if r.pod.uid not in already]
    if check_node(booked(node, _doc(node.name, keep)), demand).ok:
        return []
    indices = {d.index for d in node.devices.values() if device_class(d) == demand.key}
    pool = [
        r for r in keep if r.priority < priority and _holds(r, indices) and r.pod.uid not in spared
    ]
    pool.sort(key=lambda r: (r.priority, -r.time_s))
    chosen: list[Reservation] = []
    for victim in pool:
        chosen.append(victim)
        if _fits_without(node, keep, chosen, demand):
            return _trim(node, keep, chosen, demand)
    return None


def split_gang(victims: Collection[str], gangs: Mapping[str, Collection[str]]) -> str:
    """The first gang (by key) of which ``victims`` (pod keys, namespace/name)
    hold some members but not all; "" when every gang is taken whole or not
    at all (``gangs``: each gang's member pod keys)."""
    chosen = set(victims)
    for key in sorted(gangs):
        members = set(gangs[key])
        if members & chosen and not members <= chosen:
            return key
    return ""


def _holds(reservation: Reservation, indices: set[int]) -> bool:
    return any(s.index in indices for s in reservation.devices)


def _doc(node: str, reservations: Iterable[Reservation]) -> NodeReservations:
    return NodeReservations(node=node, reservations=tuple(reservations))


def _fits_without(
    node: NodeView, keep: list[Reservation], victims: list[Reservation], demand: Demand
) -> bool:
    gone = {id(v) for v in victims}
    return check_node(
        booked(node, _doc(node.name, (r for r in keep if id(r) not in gone))), demand
    ).ok


def _trim(
    node: NodeView, keep: list[Reservation], victims: list[Reservation], demand: Demand
) -> list[Reservation]:
    """Drop victims that turned out unnecessary (highest priority first)."""
    out = list(victims)
    for victim in sorted(victims, key=lambda r: (-r.priority, r.time_s)):
        trial = [v for v in out if v is not victim]
        if _fits_without(node, keep, trial, demand):
            out = trial
    return out


# ---------------------------------------------------------- fragmentation --


def fragmentation(nodes: Iterable[NodeView], *, piece_mib: int) -> float:
    """Share of free VRAM (0..1) in per-device pieces smaller than ``piece_mib``."""
    small = free = 0
    for node in nodes:
        if not node.schedulable:
            continue
        for device in node.devices.values():
            if not device.usable:
                continue
            left = device.free_mib
            free += left
            if 0 < left < piece_mib:
                small += left
    return small / free if free else 0.0
