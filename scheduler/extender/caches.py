"""Per-demand caches of filter and score answers, so a filter or prioritize
over 5,000 names is set and dict look-ups, not 5,000 placement decisions.
A node's entries are dropped the moment the view changes that node. Pure.

Everything here is bounded whatever kube-scheduler (or anyone on the port)
sends: only nodes the view knows are remembered (an unknown name gets one
shared answer per demand, never an entry), at most ``max_demands`` demand
caches (least recently used go first) and ``max_entries`` node entries across
them all; past that, answers are computed and not kept. ``PodMemo`` keeps
the pods filtered here for bind, bounded in pods and in bytes.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from scheduler.extender import rules as placing
from scheduler.extender import wire
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.view.state import ClusterState

MAX_DEMANDS = 64
MAX_ENTRIES = 100_000  # ≈ 10k nodes × 10 demands; a few hundred bytes each
MAX_PODS = 10_000
MAX_POD_BYTES = 32 * 1024 * 1024
PICK_HOLD_S = 10.0  # longest a node picked in filter counts a pod not yet booked there


@dataclass(frozen=True, slots=True)
class Entry:
    fit: placing.Fit
    parts: placing.Components | None
    score: int = 0  # for single devices without a job: topology and affinity are moot
    rank: float = 0.0  # the score, then under spread the free share (placing.ranked)


@dataclass(slots=True)
class Budget:
    """Node entries held by all demand caches of one replica, and the most allowed."""

    limit: int
    used: int = 0


class DemandCache:
    """Fit, reasons and pre-encoded scores of every known node seen, for one demand."""

    def __init__(
        self,
        demand: PlanAnnotation,
        *,
        state: ClusterState,
        weights: placing.Weights,
        budget: Budget | None = None,
    ) -> None:
        self.demand, self.state, self.weights = demand, state, weights
        self.budget = budget if budget is not None else Budget(limit=MAX_ENTRIES)
        self.entries: dict[str, Entry] = {}
        self.ok: set[str] = set()
        self.kept_ranks: dict[str, float] = {}  # of the kept entries that fit
        # the reasons of the kept entries that do not: preemption may help, or never
        self.no: dict[str, str] = {}
        self.never: dict[str, str] = {}
        self.fragments: dict[str, bytes] = {}
        self._all_fit: bytes | None = None  # plain_scores of exactly ``ok``, built once
        self.retired = False  # evicted: answers are still given, never kept
        self._unknown = Entry(placing.check_node(None, demand), None)

    def drop(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self._all_fit = None
            self.ok.discard(name)
            self.kept_ranks.pop(name, None)
            self.no.pop(name, None)
            self.never.pop(name, None)
            self.fragments.pop(name, None)
            self.budget.used -= 1

    def retire(self) -> None:
        self.retired = True
        self.budget.used -= len(self.entries)
        self.entries, self.ok, self.kept_ranks, self.fragments = {}, set(), {}, {}
        self.no, self.never = {}, {}
        self._all_fit = None

    def entry(self, name: str) -> Entry:
        found = self.entries.get(name)
        if found is not None:
            return found
        node = self.state.nodes.get(name)
        if node is None:  # any string may arrive here: nothing is kept for it
            return self._unknown
        fit = placing.check_node(node, self.demand)
        parts = placing.components(node, fit, self.demand) if fit.ok else None
        score, rank = placing.ranked(parts, weights=self.weights) if parts is not None else (0, 0.0)
        found = Entry(fit, parts, score, rank)
        if not self.retired and self.budget.used < self.budget.limit:
            self.entries[name] = found
            self._all_fit = None
            self.budget.used += 1
            if parts is not None:
                self.ok.add(name)
                self.kept_ranks[name] = rank
            elif fit.unresolvable:
                self.never[name] = fit.reason
            else:
                self.no[name] = fit.reason
            self.fragments[name] = _fragment(name, score)
        return found

    def filter(self, names: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        """The names that fit, and the reasons of those that do not (preemption
        may help the first dict, never the second), each in ``names`` order."""
        ok = self.ok
        if ok.issuperset(names):  # the common answer: one pass, in C
            return list(names), {}, {}
        entries, wanted = self.entries, set(names)
        for name in wanted.difference(entries):  # changed since, or never seen
            self.entry(name)
        if not entries.keys() >= wanted:  # an entry not kept: judged one by one
            return self._filter_each(names)
        # every name kept (the usual case once nodes fill): the passing ones in
        # C, and Python only over the others, their reasons kept with them
        rest = list(itertools.filterfalse(ok.__contains__, names))
        no, never = self.no, self.never
        failed = {n: no[n] for n in rest if n in no}
        unresolvable = {n: never[n] for n in rest if n in never}
        return list(filter(ok.__contains__, names)), failed, unresolvable

    def _filter_each(self, names: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        passed, failed, unresolvable = [], {}, {}
        for name in names:
            found = self.entry(name)
            if found.parts is not None:
                passed.append(name)
            elif found.fit.unresolvable:
                unresolvable[name] = found.fit.reason
            else:
                failed[name] = found.fit.reason
        return passed, failed, unresolvable

    def best(self, names: list[str]) -> str:
        """The first of ``names`` (nodes that fit) with the highest rank (the
        score; under spread, then the free share) when topology and affinity
        do not matter: one ``max`` over the kept ranks (it keeps the first of
        a tie). ``filter`` passes only nodes whose fit is kept, so the ranks
        are there unless the budget is spent."""
        try:
            return max(names, key=self.kept_ranks.__getitem__)
        except KeyError:  # an entry not kept: ranked one by one
            found = [self.entry(n).rank for n in names]
            return names[found.index(max(found))]

    def best_if_all_fit(self, names: list[str]) -> str | None:
        """``best(names)`` when every one of ``names`` fits and is kept, else
        None: one ``max`` over the kept ranks, which fails on the first name
        without one, so the common answer costs one pass, not a ``filter``
        pass and then a ``best`` pass."""
        try:
            return max(names, key=self.kept_ranks.__getitem__) if names else None
        except KeyError:
            return None

    def plain_scores_if_all_fit(self, names: list[str]) -> bytes | None:
        """``plain_scores(names)`` when ``names`` are exactly the kept nodes
        that fit (kube-scheduler asks for every feasible node, and its merge
        of the answer goes by host, not by place), from bytes built once
        while those entries stand; else None."""
        if len(names) != len(self.ok) or not self.ok.issuperset(names):
            return None
        if self._all_fit is None:
            self._all_fit = self.plain_scores(list(self.ok))
        return self._all_fit

    def plain_fragments(self, names: list[str]) -> list[bytes]:
        """The HostPriority JSON of each name when topology and affinity do not matter."""
        fragments = self.fragments
        try:  # the common answer: every name kept, looked up in C
            return list(map(fragments.__getitem__, names))
        except KeyError:
            pass
        out = []
        for name in names:
            found = fragments.get(name)
            if found is None:
                score = self.entry(name).score  # keeps the fragment when it keeps the entry
                found = self.fragments.get(name) or _fragment(name, score)
            out.append(found)
        return out

    def plain_scores(self, names: list[str]) -> bytes:
        """The HostPriorityList JSON when topology and affinity do not matter."""
        return b"[" + b",".join(self.plain_fragments(names)) + b"]"

    def parts_of(self, names: list[str]) -> list[placing.Components | None]:
        return [self.entry(n).parts for n in names]

    def scored(
        self,
        names: list[str],
        parts: list[placing.Components | None],
        *,
        best_gbps: float,
        job_groups: set[str] | None,
    ) -> list[wire.HostPriority]:
        return [
            wire.HostPriority(
                host=name,
                score=placing.node_score(
                    p, weights=self.weights, best_gbps=best_gbps, job_groups=job_groups
                )
                if p is not None
                else 0,
            )
            for name, p in zip(names, parts, strict=True)
        ]

    def scores(self, names: list[str], *, job_groups: set[str] | None) -> list[wire.HostPriority]:
        parts = self.parts_of(names)
        return self.scored(names, parts, best_gbps=best_gbps(parts), job_groups=job_groups)


def best_gbps(parts: list[placing.Components | None]) -> float:
    return max((p.topology_gbps for p in parts if p is not None), default=0.0)


def _fragment(name: str, score: int) -> bytes:
    return wire.ENCODER.encode(wire.HostPriority(host=name, score=score))


class NodeCache:
    """The demand caches of one replica plus the job → nodes index."""

    def __init__(
        self,
        state: ClusterState,
        *,
        weights: placing.Weights,
        max_demands: int = MAX_DEMANDS,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        self.state = state
        self.weights = weights
        self.max_demands = max_demands
        self.budget = Budget(limit=max_entries)
        self._by_demand: OrderedDict[PlanAnnotation, DemandCache] = OrderedDict()
        self.jobs: dict[str, set[str]] = {}  # "ns/job" → nodes holding it

    @property
    def demands(self) -> int:
        return len(self._by_demand)

    def changed(self, node: str) -> None:
        for cache in self._by_demand.values():
            cache.drop(node)
        for key in [k for k, nodes in self.jobs.items() if node in nodes]:
            self.jobs[key].discard(node)
            if not self.jobs[key]:
                del self.jobs[key]
        view = self.state.nodes.get(node)
        if view is not None:
            for r in view.reservations.values():
                if r.job:
                    self.jobs.setdefault(f"{r.pod.namespace}/{r.job}", set()).add(node)

    def of(self, demand: PlanAnnotation) -> DemandCache:
        found = self._by_demand.get(demand)
        if found is not None:
            self._by_demand.move_to_end(demand)
            return found
        while self._by_demand and (
            len(self._by_demand) >= self.max_demands or self.budget.used >= self.budget.limit
        ):
            _, old = self._by_demand.popitem(last=False)
            old.retire()
        found = DemandCache(demand, state=self.state, weights=self.weights, budget=self.budget)
        self._by_demand[demand] = found
        return found

    def job_groups(self, pod: PodInfo) -> set[str] | None:
        if not pod.job:
            return None
        groups = set()
        for name in self.jobs.get(f"{pod.ref.namespace}/{pod.job}", ()):
            node = self.state.nodes.get(name)
            group = placing.network_group(node) if node else None
            if group:
                groups.add(group)
        return groups or None


_POD_ENCODER = msgspec.msgpack.Encoder()


class PodMemo:
    """The pods filtered here, by UID, for their bind: least recently filtered
    go first past ``max_pods`` or ``max_bytes`` (their encoded size); a pod
    bigger than a 64th of the bytes is not kept (bind reads it from the API)."""

    def __init__(self, *, max_pods: int = MAX_PODS, max_bytes: int = MAX_POD_BYTES) -> None:
        self.max_pods, self.max_bytes = max_pods, max_bytes
        self.bytes = 0
        self._pods: OrderedDict[str, tuple[PodInfo, int]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._pods)

    def put(self, uid: str, pod: PodInfo) -> None:
        self.pop(uid)
        size = len(uid) + len(_POD_ENCODER.encode(pod))
        if size > self.max_bytes // 64:
            return
        self._pods[uid] = (pod, size)
        self.bytes += size
        while len(self._pods) > self.max_pods or self.bytes > self.max_bytes:
            _, (_, dropped) = self._pods.popitem(last=False)
            self.bytes -= dropped

    def get(self, uid: str) -> PodInfo | None:
        found = self._pods.get(uid)
        return found[0] if found is not None else None

    def pop(self, uid: str) -> PodInfo | None:
        found = self._pods.pop(uid, None)
        if found is None:
            return None
        self.bytes -= found[1]
        return found[0]


@dataclass(frozen=True, slots=True)
class Pick:
    key: str  # namespace/name, as the node's reservations hold it once booked
    demand: PlanAnnotation
    until: float


class Picks:
    """Pods that filter answered with one node and that are not booked there
    yet. kube-scheduler binds in the background: the next pods' filters come
    before the first pod's bind has written its reservation, and a node
    picked for all of them turns the last ones away at bind (each a
    back-off of a second or more in kube-scheduler). A pick lasts until the
    view holds the pod's reservation on that node, its bind fails, or
    ``hold_s`` passes; at most ``max_pods`` are kept (oldest go first)."""

    def __init__(
        self,
        *,
        hold_s: float = PICK_HOLD_S,
        max_pods: int = MAX_PODS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hold_s, self.max_pods, self.clock = hold_s, max_pods, clock
        self._nodes: dict[str, dict[str, Pick]] = {}  # node -> pod UID -> its pick
        self._where: OrderedDict[str, str] = OrderedDict()  # pod UID -> node

    def __len__(self) -> int:
        return len(self._where)

    def add(self, uid: str, key: str, node: str, demand: PlanAnnotation) -> None:
        self.drop(uid)
        self._nodes.setdefault(node, {})[uid] = Pick(key, demand, self.clock() + self.hold_s)
        self._where[uid] = node
        while len(self._where) > self.max_pods:
            self.drop(next(iter(self._where)))

    def drop(self, uid: str) -> None:
        node = self._where.pop(uid, None)
        if node is None:
            return
        held = self._nodes.get(node)
        if held is not None:
            held.pop(uid, None)
            if not held:
                del self._nodes[node]

    def on(self, node: str, *, besides: str, booked: Callable[[str], bool]) -> list[PlanAnnotation]:
        """The demands of the pods other than ``besides`` picked for ``node``
        and not yet ``booked`` there (those, and the expired, are let go)."""
        held = self._nodes.get(node)
        if not held:
            return []
        now = self.clock()
        for uid in [u for u, p in held.items() if p.until <= now or booked(p.key)]:
            self.drop(uid)
        return [p.demand for u, p in held.items() if u != besides]
