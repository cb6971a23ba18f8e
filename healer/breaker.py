"""Circuit breaker (pure): never isolate more than a fraction of the fleet in a window.

A mass event (a bad driver rollout, a flaky top-of-rack switch, a bug in a
rule) must not drain the whole cluster: beyond ``max_fraction`` of the known
nodes isolated within ``window_s`` the healer only alerts. At least
``min_isolations`` are always allowed so a small cluster can still isolate a
node. Times are the caller's clock (``now``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class BreakerDecision:
    allowed: bool
    isolated: int
    limit: int
    known_nodes: int

    @property
    def reason(self) -> str:
        verb = "allowed" if self.allowed else "refused"
        return (
            f"{verb}: {self.isolated} isolated in window, "
            f"limit {self.limit} of {self.known_nodes} nodes"
        )


@dataclass(slots=True)
class Breaker:
    max_fraction: float
    window_s: float
    min_isolations: int = 1
    _isolations: deque[tuple[float, str]] = field(default_factory=deque)

    def limit(self, known_nodes: int) -> int:
        return max(self.min_isolations, math.floor(self.max_fraction * known_nodes))

    def isolated(self, *, now: float) -> int:
        self._expire(now)
        return len({node for _, node in self._isolations})

    def check(self, node: str, *, known_nodes: int, now: float) -> BreakerDecision:
        """May ``node`` be isolated now? Recording is separate (``record``)."""
        self._expire(now)
        nodes = {n for _, n in self._isolations}
        limit = self.limit(known_nodes)
        allowed = node in nodes or len(nodes) < limit
        return BreakerDecision(allowed, len(nodes), limit, known_nodes)

    def record(self, node: str, *, now: float) -> None:
        self._isolations.append((now, node))

    def admit(self, node: str, *, known_nodes: int, now: float) -> BreakerDecision:
        """``check`` and, when allowed, ``record`` in one step."""
        decision = self.check(node, known_nodes=known_nodes, now=now)
        if decision.allowed:
            self.record(node, now=now)
        return decision

    def _expire(self, now: float) -> None:
        while self._isolations and now - self._isolations[0][0] > self.window_s:
            self._isolations.popleft()
