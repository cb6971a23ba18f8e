"""Per-demand caches of filter and score answers, so a filter or prioritize
over 5,000 names is set and dict look-ups, not 5,000 placement decisions.
A node's entries are dropped the moment the view changes that node. Pure."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from scheduler import extenders as wire
from scheduler import placing
from scheduler.pods import PlanAnnotation, PodInfo
from scheduler.state import ClusterState

MAX_DEMANDS = 64


@dataclass(frozen=True, slots=True)
class Entry:
    fit: placing.Fit
    parts: placing.Components | None
    score: int = 0  # for single devices without a job: topology and affinity are moot


class DemandCache:
    """Fit, reasons and pre-encoded scores of every node seen, for one demand."""

    def __init__(
        self, demand: PlanAnnotation, *, state: ClusterState, weights: placing.Weights
    ) -> None:
        self.demand, self.state, self.weights = demand, state, weights
        self.entries: dict[str, Entry] = {}
        self.ok: set[str] = set()
        self.failed: dict[str, str] = {}
        self.unresolvable: dict[str, str] = {}
        self.fragments: dict[str, bytes] = {}

    def drop(self, name: str) -> None:
        if self.entries.pop(name, None) is not None:
            self.ok.discard(name)
            self.failed.pop(name, None)
            self.unresolvable.pop(name, None)
            self.fragments.pop(name, None)

    def fill(self, names: list[str]) -> None:
        entries = self.entries
        for name in [n for n in names if n not in entries]:
            self.entry(name)

    def entry(self, name: str) -> Entry:
        found = self.entries.get(name)
        if found is not None:
            return found
        node = self.state.nodes.get(name)
        fit = placing.check_node(node, self.demand)
        parts = placing.components(node, fit, self.demand) if fit.ok and node else None
        score = 0
        if parts is not None:
            score = placing.node_score(parts, weights=self.weights, best_gbps=0.0, job_groups=None)
            self.ok.add(name)
        elif fit.unresolvable:
            self.unresolvable[name] = fit.reason
        else:
            self.failed[name] = fit.reason
        self.fragments[name] = wire.ENCODER.encode(wire.HostPriority(host=name, score=score))
        found = self.entries[name] = Entry(fit, parts, score)
        return found

    def filter(self, names: list[str]) -> tuple[list[str], dict[str, str], dict[str, str]]:
        ok = self.ok
        passed = [n for n in names if n in ok]
        if len(passed) == len(names):  # the common answer: one pass
            return passed, {}, {}
        self.fill(names)
        failed, unres = self.failed, self.unresolvable
        passed = [n for n in names if n in ok]
        out_failed = {n: failed[n] for n in names if n in failed} if failed else {}
        out_unres = {n: unres[n] for n in names if n in unres} if unres else {}
        return passed, out_failed, out_unres

    def plain_scores(self, names: list[str]) -> bytes:
        """The HostPriorityList JSON when topology and affinity do not matter."""
        fragments = self.fragments
        try:
            return b"[" + b",".join([fragments[n] for n in names]) + b"]"
        except KeyError:
            self.fill(names)
        return b"[" + b",".join([fragments[n] for n in names]) + b"]"

    def scores(self, names: list[str], *, job_groups: set[str] | None) -> list[wire.HostPriority]:
        parts = [self.entry(n).parts for n in names]
        best = max((p.topology_gbps for p in parts if p is not None), default=0.0)
        return [
            wire.HostPriority(
                host=name,
                score=placing.node_score(
                    p, weights=self.weights, best_gbps=best, job_groups=job_groups
                )
                if p is not None
                else 0,
            )
            for name, p in zip(names, parts, strict=True)
        ]


class NodeCache:
    """The demand caches of one replica plus the job → nodes index."""

    def __init__(self, state: ClusterState, *, weights: placing.Weights) -> None:
        self.state = state
        self.weights = weights
        self._by_demand: OrderedDict[PlanAnnotation, DemandCache] = OrderedDict()
        self.jobs: dict[str, set[str]] = {}  # "ns/job" → nodes holding it

    def changed(self, node: str) -> None:
        for cache in self._by_demand.values():
            cache.drop(node)
        for nodes in self.jobs.values():
            nodes.discard(node)
        view = self.state.nodes.get(node)
        if view is not None:
            for r in view.reservations.values():
                if r.job:
                    self.jobs.setdefault(f"{r.pod.namespace}/{r.job}", set()).add(node)

    def of(self, demand: PlanAnnotation) -> DemandCache:
        found = self._by_demand.get(demand)
        if found is None:
            found = DemandCache(demand, state=self.state, weights=self.weights)
            self._by_demand[demand] = found
            if len(self._by_demand) > MAX_DEMANDS:
                self._by_demand.popitem(last=False)
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
