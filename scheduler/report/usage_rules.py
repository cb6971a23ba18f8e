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

``split_by_guarantee`` meters a namespace's ACU-seconds within its guarantee
apart from those it borrowed in the shared pool.

``quota_share`` and ``crossings`` decide the usage alert: a namespace whose
held VRAM or ACU reaches ``threshold`` of its ComputeQuota fires once, and is
in alert again only after falling below ``rearm``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator
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
class Split:
    """ACU-seconds a namespace held within its guarantee, and beyond it (borrowed)."""

    within_acu_s: float = 0.0
    borrowed_acu_s: float = 0.0


def split_by_guarantee(
    spans: Iterable[Span], *, since: float, now: float, guaranteed_acu: dict[str, float]
) -> dict[str, Split]:
    """Per namespace, its ACU held over ``[since, now]`` split at its
    guarantee (absent: 0, all borrowed): at each moment what it holds up to
    the guarantee is within, the rest borrowed. The two add up to the
    window's ACU-seconds, and windows add up as ``usage``'s do."""
    steps: dict[str, list[tuple[float, float]]] = {}
    for span in spans:
        start = max(span.start_s, since)
        end = now if span.end_s is None else min(span.end_s, now)
        if end <= start or span.acu <= 0:
            continue
        steps.setdefault(span.namespace, []).extend(((start, span.acu), (end, -span.acu)))
    out: dict[str, Split] = {}
    for namespace, changes in sorted(steps.items()):
        floor = max(guaranteed_acu.get(namespace, 0.0), 0.0)
        within = lent = held_acu = 0.0
        last = since
        for time_s, delta in sorted(changes):
            seconds = time_s - last
            within += min(held_acu, floor) * seconds
            lent += max(held_acu - floor, 0.0) * seconds
            held_acu, last = held_acu + delta, time_s
        out[namespace] = Split(within_acu_s=within, borrowed_acu_s=lent)
    return out
