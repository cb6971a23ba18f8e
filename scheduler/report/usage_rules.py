"""Usage metering from allocation lifetimes. Pure: no I/O,
no clock; ``now`` is always passed in.

A pod's devices are metered from its ``bound`` AllocationEvent to the
``released`` or ``expired`` one that ends it (``reserved`` is not metered: a
reservation becomes ``bound`` within a bind). An allocation still open
counts up to ``now``. One lifetime is a ``Span``; ``usage`` clips spans to a
window ``[since, now]`` and sums, per (namespace, vendor, model):

* device-seconds: devices held × seconds,
* ACU-seconds: the allocation's ACU (all its devices) × seconds,
* VRAM-GiB-seconds: VRAM held (the sum of its slices) in GiB × seconds.

Windows add up: the usage over ``[a, b]`` plus that over ``[b, c]`` is the
usage over ``[a, c]``. A second ``bound`` for an allocation already open
(the scheduler re-announces a pod it finds bound at expiry) does not restart
it; a release of an allocation never bound is ignored.

``split_by_guarantee`` (per namespace) and ``split_by_key`` (per namespace
and model) meter usage held within a namespace's ComputeQuota guarantee apart
from what it borrowed in the shared pool, in every unit above.

``quota_share`` and ``crossings`` decide the usage alert: a namespace whose
held VRAM or ACU reaches ``threshold`` of its ComputeQuota fires once, and is
in alert again only after falling below ``rearm``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from hcs_bus.messages import AllocationEvent

MIB_PER_GIB = 1024.0

Key = tuple[str, str, str]  # namespace, vendor, model
PodKey = tuple[str, str, str, str]  # node, namespace, pod name, pod uid


@dataclass(frozen=True, slots=True)
class Span:
    """One allocation's lifetime: bound at ``start_s``, ended at ``end_s``
    (None while still held)."""

    namespace: str
    pod: str
    node: str
    vendor: str
    model: str
    devices: int
    vram_mib: int
    acu: float
    start_s: float
    end_s: float | None = None

    @property
    def key(self) -> Key:
        return (self.namespace, self.vendor, self.model)

    def seconds(self, *, since: float, now: float) -> float:
        """Seconds of this span inside ``[since, now]`` (never negative)."""
        end = now if self.end_s is None else min(self.end_s, now)
        return max(0.0, end - max(self.start_s, since))


@dataclass(frozen=True, slots=True)
class Usage:
    device_s: float = 0.0
    acu_s: float = 0.0
    vram_gib_s: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            device_s=self.device_s + other.device_s,
            acu_s=self.acu_s + other.acu_s,
            vram_gib_s=self.vram_gib_s + other.vram_gib_s,
        )

    @classmethod
    def of(cls, span: Span, *, seconds: float) -> Usage:
        return cls(
            device_s=span.devices * seconds,
            acu_s=span.acu * seconds,
            vram_gib_s=span.vram_mib / MIB_PER_GIB * seconds,
        )


@dataclass(frozen=True, slots=True)
class Held:
    """What a namespace holds right now (its open allocations)."""

    devices: int = 0
    vram_mib: int = 0
    acu: float = 0.0


@dataclass
class Lifetimes:
    """Spans built from AllocationEvents applied in stream order."""

    open: dict[PodKey, Span] = field(default_factory=dict)
    closed: list[Span] = field(default_factory=list)

    def apply(self, event: AllocationEvent) -> Span | None:
        """Take one event; returns the span it closed, if any."""
        key = (event.node, event.pod.namespace, event.pod.name, event.pod.uid)
        time_s = event.time_s if math.isfinite(event.time_s) else 0.0
        if event.state == "bound":
            if key not in self.open:
                self.open[key] = _span(event, start_s=time_s)
            return None
        if event.state in ("released", "expired"):
            started = self.open.pop(key, None)
            if started is None:
                return None
            ended = _ended(started, end_s=max(time_s, started.start_s))
            self.closed.append(ended)
            return ended
        return None  # reserved, or a state a newer scheduler added

    def spans(self) -> Iterator[Span]:
        yield from self.closed
        yield from self.open.values()

    def prune(self, *, before_s: float) -> dict[Key, Usage]:
        """Drop closed spans that ended before ``before_s``; returns their
        whole usage, so a running total can keep it."""
        gone = [s for s in self.closed if s.end_s is not None and s.end_s < before_s]
        if gone:
            self.closed = [
                s for s in self.closed if not (s.end_s is not None and s.end_s < before_s)
            ]
        return usage(gone, since=-math.inf, now=math.inf)


def _span(event: AllocationEvent, *, start_s: float) -> Span:
    return Span(
        namespace=event.pod.namespace,
        pod=event.pod.name,
        node=event.node,
        vendor=event.vendor,
        model=event.model,
        devices=len(event.devices),
        vram_mib=sum(max(d.vram_mib, 0) for d in event.devices),
        acu=max(event.acu, 0.0) if math.isfinite(event.acu) else 0.0,
        start_s=start_s,
    )


def _ended(span: Span, *, end_s: float) -> Span:
    return Span(
        namespace=span.namespace,
        pod=span.pod,
        node=span.node,
        vendor=span.vendor,
        model=span.model,
        devices=span.devices,
        vram_mib=span.vram_mib,
        acu=span.acu,
        start_s=span.start_s,
        end_s=end_s,
    )


def usage(
    spans: Iterable[Span], *, since: float, now: float, namespace: str | None = None
) -> dict[Key, Usage]:
    """Usage per (namespace, vendor, model) over ``[since, now]``; only
    ``namespace``'s when given. Keys with no overlap are left out."""
    out: dict[Key, Usage] = {}
    for span in spans:
        if namespace is not None and span.namespace != namespace:
            continue
        seconds = span.seconds(since=since, now=now)
        if seconds <= 0:
            continue
        out[span.key] = out.get(span.key, Usage()) + Usage.of(span, seconds=seconds)
    return out


def merge(*parts: dict[Key, Usage]) -> dict[Key, Usage]:
    out: dict[Key, Usage] = {}
    for part in parts:
        for key, value in part.items():
            out[key] = out.get(key, Usage()) + value
    return out


def by_namespace(found: dict[Key, Usage]) -> dict[str, Usage]:
    out: dict[str, Usage] = {}
    for (namespace, _, _), value in found.items():
        out[namespace] = out.get(namespace, Usage()) + value
    return out


def held(spans: Iterable[Span]) -> dict[str, Held]:
    """Devices, VRAM and ACU each namespace holds in the open ``spans``."""
    out: dict[str, Held] = {}
    for span in spans:
        if span.end_s is not None:
            continue
        h = out.get(span.namespace, Held())
        out[span.namespace] = Held(
            devices=h.devices + span.devices,
            vram_mib=h.vram_mib + span.vram_mib,
            acu=h.acu + span.acu,
        )
    return out


def quota_share(
    holding: Held, *, vram_mib_hard: int | None, acu_hard: float | None
) -> tuple[float, str] | None:
    """The larger of held/hard over VRAM and ACU, with the resource's name;
    None when the quota limits neither."""
    shares: list[tuple[float, str]] = []
    if vram_mib_hard is not None:
        shares.append((_ratio(holding.vram_mib, vram_mib_hard), "vram"))
    if acu_hard is not None:
        shares.append((_ratio(holding.acu, acu_hard), "acu"))
    return max(shares) if shares else None


def _ratio(amount: float, hard: float) -> float:
    if hard <= 0:
        return math.inf if amount > 0 else 0.0
    return amount / hard


def crossings(
    shares: dict[str, float], *, alerting: frozenset[str], threshold: float, rearm: float
) -> tuple[list[str], frozenset[str]]:
    """Namespaces to alert now (their share reached ``threshold`` and they
    were not in alert), and the namespaces in alert afterwards: one leaves
    the alert state once its share falls below ``rearm`` (hysteresis), or
    when it no longer appears in ``shares``."""
    fired: list[str] = []
    still: set[str] = set()
    for namespace, share in sorted(shares.items()):
        if namespace in alerting:
            if share >= rearm:
                still.add(namespace)
        elif share >= threshold:
            fired.append(namespace)
            still.add(namespace)
    return fired, frozenset(still)


@dataclass(frozen=True, slots=True)
class Guarantee:
    """What a namespace's ComputeQuota guarantees; None: nothing in that unit."""

    acu: float | None = None
    vram_mib: int | None = None


@dataclass(frozen=True, slots=True)
class Split:
    """Usage held within the namespace's guarantee, and beyond it (borrowed)."""

    within: Usage = Usage()
    borrowed: Usage = Usage()

    def __add__(self, other: Split) -> Split:
        return Split(within=self.within + other.within, borrowed=self.borrowed + other.borrowed)

    @property
    def within_acu_s(self) -> float:
        return self.within.acu_s

    @property
    def borrowed_acu_s(self) -> float:
        return self.borrowed.acu_s


def split_by_guarantee(
    spans: Iterable[Span], *, since: float, now: float, guarantees: Mapping[str, Guarantee]
) -> dict[str, Split]:
    """Per namespace, its usage over ``[since, now]`` split at its guarantee
    (``split_by_key`` summed over its models)."""
    out: dict[str, Split] = {}
    for (namespace, _, _), part in split_by_key(
        spans, since=since, now=now, guarantees=guarantees
    ).items():
        out[namespace] = out.get(namespace, Split()) + part
    return out


def split_by_key(
    spans: Iterable[Span], *, since: float, now: float, guarantees: Mapping[str, Guarantee]
) -> dict[Key, Split]:
    """Per (namespace, vendor, model), its usage over ``[since, now]`` (``now``
    finite) split at the namespace's guarantee. At each moment, of what the
    namespace holds:

    * ACU up to its ACU guarantee is within, the rest borrowed; VRAM likewise
      against its VRAM guarantee; a unit it has no guarantee in (or a
      namespace with no ComputeQuota) is all borrowed;
    * devices are within as far as every unit the guarantee names is: the
      smaller of the ACU and VRAM fractions within (ComputeQuota guarantees
      no devices); with no guarantee at all, all borrowed.

    A namespace's fraction within applies alike to each of its models. Within
    plus borrowed is the window's usage, within never exceeds the guarantee
    times the window, and windows add up as ``usage``'s do."""
    steps: dict[str, list[tuple[float, int, Span]]] = {}
    for span in spans:
        start = max(span.start_s, since)
        end = now if span.end_s is None else min(span.end_s, now)
        if end > start:
            steps.setdefault(span.namespace, []).extend(((start, 1, span), (end, -1, span)))
    out: dict[Key, Split] = {}
    for namespace, changes in sorted(steps.items()):
        changes.sort(key=lambda c: (c[0], c[1]))
        _sweep(changes, since=since, guarantee=guarantees.get(namespace, Guarantee()), out=out)
    return out


def _sweep(
    changes: Sequence[tuple[float, int, Span]],
    *,
    since: float,
    guarantee: Guarantee,
    out: dict[Key, Split],
) -> None:
    """One namespace's holdings, step by step, into ``out``."""
    holding: dict[Key, list[float]] = {}  # key → [devices, vram MiB, ACU, open spans]
    last = since
    for time_s, sign, span in changes:
        seconds = time_s - last
        if seconds > 0 and holding:
            _accrue(holding, guarantee=guarantee, seconds=seconds, out=out)
        now_held = holding.setdefault(span.key, [0.0, 0.0, 0.0, 0.0])
        for i, amount in enumerate((span.devices, span.vram_mib, span.acu, 1)):
            now_held[i] += sign * amount
        if now_held[3] <= 0:
            del holding[span.key]
        last = time_s


def _accrue(
    holding: Mapping[Key, list[float]],
    *,
    guarantee: Guarantee,
    seconds: float,
    out: dict[Key, Split],
) -> None:
    acu = sum(h[2] for h in holding.values())
    vram = sum(h[1] for h in holding.values())
    f_acu = _fraction_within(acu, guarantee.acu)
    f_vram = _fraction_within(vram, guarantee.vram_mib)
    named = [f for f, g in ((f_acu, guarantee.acu), (f_vram, guarantee.vram_mib)) if g is not None]
    f_devices = min(named) if named else 0.0
    for key, (devices, vram_mib, key_acu, _) in holding.items():
        held = Usage(
            device_s=max(devices, 0.0) * seconds,
            acu_s=max(key_acu, 0.0) * seconds,
            vram_gib_s=max(vram_mib, 0.0) / MIB_PER_GIB * seconds,
        )
        within = Usage(
            device_s=held.device_s * f_devices,
            acu_s=held.acu_s * f_acu,
            vram_gib_s=held.vram_gib_s * f_vram,
        )
        borrowed = Usage(
            device_s=held.device_s * (1.0 - f_devices),
            acu_s=held.acu_s * (1.0 - f_acu),
            vram_gib_s=held.vram_gib_s * (1.0 - f_vram),
        )
        out[key] = out.get(key, Split()) + Split(within=within, borrowed=borrowed)


def _fraction_within(held: float, guaranteed: float | None) -> float:
    """The part of ``held`` within ``guaranteed`` (None: no guarantee, 0)."""
    floor = max(guaranteed or 0.0, 0.0)
    if held <= _TINY:
        return 1.0 if floor > 0 else 0.0
    return min(1.0, floor / held)


_TINY = 1e-9  # what a sum of added and removed ACU leaves of nothing
