"""The fleet's class summary kept node by node (pure): a summary costs the
nodes changed since the last one, not the fleet (``Parts``). ``rules.merged``
of every node's part is what it equals."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Final, TypeVar

from scheduler.plan.rules import ClassPart, ClassStats, NodePart, Summary, Usage, node_part
from scheduler.view.state import NodeView

_K = TypeVar("_K")


class Parts:
    """The summary kept up to date node by node: each node's ``NodePart`` is
    made again only when the view says the node changed (``changed``, a view
    listener), and a summary takes out the old part's share and adds the new
    one's, so it costs the nodes changed since the last, not the fleet.

    Every change to a node must reach ``changed``: its devices, its
    reservations, and whether it is schedulable (the view's follow loop tells
    its listeners of each verdict, Node block and newly stale node; a stale
    node turns fresh only by a fingerprint, which it tells too). A node the
    mapping holds that was never told (the first summary, a ``Parts`` made
    after the view filled) is found by the count of nodes differing."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[NodePart, bool]] = {}  # node → part, schedulable when made
        self._changed: dict[str, None] = {}  # as a set, in the order told
        self._classes: dict[str, _ClassTally] = {}
        self._usage: dict[str, _UsageTally] = {}
        self._ids: dict[str, int] = {}  # pledge id → reservations made from it
        self._stats: dict[str, ClassStats] = {}  # each class as last built
        self._used: dict[str, tuple[int, float]] = {}  # each namespace as last built
        self._touched: dict[str, None] = {}  # classes to build again, in order
        self._touched_ns: dict[str, None] = {}
        self._pledge_ids: frozenset[str] | None = frozenset()

    def changed(self, node: str) -> None:
        self._changed[node] = None

    def summary(self, nodes: Mapping[str, NodeView]) -> Summary:
        self._take_in(nodes)
        return Summary(
            classes=self._class_stats(), usage=self._usage_now(), pledge_ids=self._ids_now()
        )

    def usage(self, nodes: Mapping[str, NodeView]) -> dict[str, Usage]:
        """Per namespace: what its reservations hold over ``nodes``, every
        node counted whether schedulable or not (``rules.namespace_usage``
        of all their reservations), kept node by node like the summary."""
        self._take_in(nodes)
        return {
            ns: Usage(vram_mib=u.vram_mib, acu=u.acu.value(), devices=u.devices)
            for ns, u in self._usage.items()
        }

    def _take_in(self, nodes: Mapping[str, NodeView]) -> None:
        """Count again the nodes told of since the last call (and any come or
        gone untold)."""
        told, self._changed = self._changed, {}
        for name in told:
            node = nodes.get(name)
            if node is None:
                self._take(name)
            else:
                self._put(name, node)
        if len(self._held) != len(nodes):
            self._reconcile(nodes)

    def _reconcile(self, nodes: Mapping[str, NodeView]) -> None:
        """Nodes gone or come without being told of."""
        for gone in [name for name in self._held if name not in nodes]:
            self._take(gone)
        for name, node in nodes.items():
            if name not in self._held:
                self._put(name, node)

    def _put(self, name: str, node: NodeView) -> None:
        fresh = (node_part(node), node.schedulable)
        held = self._held.get(name)
        if held == fresh:  # a periodic report that changed nothing
            return
        if held is not None:
            self._count(*held, sign=-1)
        self._held[name] = fresh
        self._count(*fresh, sign=1)

    def _take(self, name: str) -> None:
        held = self._held.pop(name, None)
        if held is not None:
            self._count(*held, sign=-1)

    def _count(self, part: NodePart, schedulable: bool, *, sign: int) -> None:
        """Add (``sign`` 1) or take out (-1) a node's share (see ``merged``)."""
        for ns, vram, acu, devices in part.usage:
            usage = self._usage.get(ns)
            if usage is None:
                usage = self._usage[ns] = _UsageTally()
            if usage.count(vram, acu, devices, sign=sign) == 0:
                del self._usage[ns]
            self._touched_ns[ns] = None
        for pledge_id in part.pledge_ids:
            left = _count(self._ids, pledge_id, sign)
            if left == 0 or (sign > 0 and left == 1):  # an id came or went
                self._pledge_ids = None
        if not schedulable:
            return
        for c in part.classes:
            tally = self._classes.get(c.key)
            if tally is None:
                tally = self._classes[c.key] = _ClassTally(c.vendor, c.model)
            if tally.count(c, sign=sign) == 0:
                del self._classes[c.key]
            self._touched[c.key] = None

    def _class_stats(self) -> dict[str, ClassStats]:
        """Fresh objects each time: callers may change what they are handed."""
        for key in self._touched:
            tally = self._classes.get(key)
            if tally is None:
                self._stats.pop(key, None)
            else:
                self._stats[key] = tally.stats()
        self._touched.clear()
        return {
            key: replace(s, kth_free=list(s.kth_free), free_counts=dict(s.free_counts))
            for key, s in sorted(self._stats.items())
        }

    def _usage_now(self) -> dict[str, tuple[int, float]]:
        for ns in self._touched_ns:
            usage = self._usage.get(ns)
            if usage is None:
                self._used.pop(ns, None)
            else:
                self._used[ns] = (usage.vram_mib, usage.acu.value())
        self._touched_ns.clear()
        return dict(self._used)

    def _ids_now(self) -> frozenset[str]:
        if self._pledge_ids is None:
            self._pledge_ids = frozenset(self._ids)
        return self._pledge_ids


def _count(counts: dict[_K, int], value: _K, n: int) -> int:
    """Add ``n`` to ``value``'s count in a multiset (none kept at 0); the count."""
    left = counts.get(value, 0) + n
    if left:
        counts[value] = left
    else:
        del counts[value]
    return left


class _ClassTally:
    """One class's share of the summary over the parts counted, its smallest
    and largest figures as multisets so a part taken out leaves them exact."""

    __slots__ = (
        "acu",
        "devices",
        "free_counts",
        "free_mib",
        "idle",
        "idle_devices",
        "kth_free",
        "linked",
        "model",
        "parts",
        "usable",
        "vendor",
        "vram_mib",
    )

    def __init__(self, vendor: str, model: str) -> None:
        self.vendor, self.model = vendor, model
        self.parts = self.devices = self.free_mib = self.idle_devices = self.linked = 0
        self.vram_mib: dict[int, int] = {}
        self.acu: dict[float, int] = {}
        self.usable: dict[int, int] = {}
        self.idle: dict[int, int] = {}
        self.free_counts: dict[int, int] = {}
        self.kth_free: list[dict[int, int]] = []  # per k: the parts' k-th largest free VRAM

    def count(self, c: ClassPart, *, sign: int) -> int:
        """Add or take out one node's part; how many parts are left."""
        self.parts += sign
        self.devices += sign * c.devices
        self.free_mib += sign * c.free_mib
        self.idle_devices += sign * c.idle
        self.linked += sign * c.linked
        _count(self.vram_mib, c.vram_mib, sign)
        _count(self.acu, c.acu, sign)
        _count(self.usable, c.usable, sign)
        _count(self.idle, c.idle, sign)
        for value, n in c.free_counts:
            _count(self.free_counts, value, sign * n)
        kth = self.kth_free
        for k, value in enumerate(c.frees):
            if k == len(kth):
                kth.append({})
            _count(kth[k], value, sign)
        while kth and not kth[-1]:
            kth.pop()
        return self.parts

    def stats(self) -> ClassStats:
        return ClassStats(
            vendor=self.vendor,
            model=self.model,
            vram_mib=min(self.vram_mib),
            acu=min(self.acu),
            devices=self.devices,
            free_mib=self.free_mib,
            max_usable_per_node=max(self.usable),
            max_idle_per_node=max(self.idle),
            kth_free=[max(values) for values in self.kth_free],
            free_counts=dict(self.free_counts),
            linked=self.linked > 0,
            idle_devices=self.idle_devices,
        )


class _UsageTally:
    """A namespace's usage over the parts counted."""

    __slots__ = ("acu", "devices", "parts", "vram_mib")

    def __init__(self) -> None:
        self.parts = self.vram_mib = self.devices = 0
        self.acu = _ExactSum()

    def count(self, vram_mib: int, acu: float, devices: int, *, sign: int) -> int:
        self.parts += sign
        self.vram_mib += sign * vram_mib
        self.devices += sign * devices
        self.acu.count(acu, sign=sign)
        return self.parts


class _ExactSum:
    """A sum of floats that values can be taken out of without drift: each
    finite float is a whole number of 2**-1074, summed as an int; the value
    is that sum rounded once. Infinities and NaNs are counted apart and give
    what a float sum of them would."""

    __slots__ = ("odd", "units")
    _BITS: Final = 1074

    def __init__(self) -> None:
        self.units = 0
        self.odd: dict[str, int] = {}  # "inf", "-inf", "nan" → how many

    def count(self, value: float, *, sign: int) -> None:
        if math.isfinite(value):
            n, d = value.as_integer_ratio()  # d a power of two
            self.units += sign * (n << (self._BITS + 1 - d.bit_length()))
        else:
            _count(self.odd, "nan" if math.isnan(value) else str(value), sign)

    def value(self) -> float:
        odd = self.odd
        if odd:
            if "nan" in odd or len(odd) > 1:
                return math.nan
            return math.inf if "inf" in odd else -math.inf
        try:
            return self.units / (1 << self._BITS)  # correctly rounded
        except OverflowError:
            return math.copysign(math.inf, self.units)
