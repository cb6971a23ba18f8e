"""What to do about a node (pure): from the state already applied and the
node's new judgement to a plan of taint, evictions and checkpoint requests.

* failed   → taint NoSchedule; evict at once the pods on newly failed devices.
* degraded → taint with ``rules.degraded_taint_effect``; ask the jobs on newly
  degraded devices to checkpoint, then evict them.
* lost     → taint NoExecute (the taint manager evicts; PDBs not consulted).
* healthy  → remove our taint.

Going from untainted to tainted is an *isolation* and must pass the circuit
breaker; a refused isolation is remembered (``blocked``) so the same verdict
does not raise the alarm again and again.
"""

from __future__ import annotations

from dataclasses import dataclass

from healer.histories import NodeJudgement, NodeVerdict
from healer.rules import Rules


@dataclass(frozen=True, slots=True)
class NodeState:
    verdict: NodeVerdict = "healthy"
    effect: str = ""
    failed: frozenset[int] = frozenset()
    degraded: frozenset[int] = frozenset()
    blocked: bool = False


@dataclass(frozen=True, slots=True)
class NodePlan:
    state: NodeState
    taint: str | None = None  # effect to set; "" removes our taint; None leaves it
    evict_now: tuple[int, ...] = ()
    checkpoint_then_evict: tuple[int, ...] = ()
    isolates: bool = False
    reason: str = ""

    @property
    def empty(self) -> bool:
        return self.taint is None and not self.evict_now and not self.checkpoint_then_evict


def effect_for(verdict: NodeVerdict, *, rules: Rules) -> str:
    if verdict == "failed":
        return "NoSchedule"
    if verdict == "lost":
        return "NoExecute"
    if verdict == "degraded":
        return rules.degraded_taint_effect
    return ""


def plan(previous: NodeState, judged: NodeJudgement, *, rules: Rules) -> NodePlan:
    effect = effect_for(judged.verdict, rules=rules)
    failed, degraded = frozenset(judged.failed), frozenset(judged.degraded)
    state = NodeState(judged.verdict, effect, failed, degraded)
    if previous.blocked and previous.verdict == judged.verdict:
        return NodePlan(NodeState(judged.verdict, "", failed, degraded, blocked=True))
    taint = None if effect == previous.effect else effect
    evict_now = tuple(sorted(failed - previous.failed)) if judged.verdict != "lost" else ()
    slow = () if judged.verdict == "lost" else tuple(sorted(degraded - previous.degraded))
    isolates = bool(effect) and not previous.effect
    return NodePlan(state, taint, evict_now, slow, isolates, judged.reason)


def blocked(plan_: NodePlan) -> NodeState:
    """The state to remember when the breaker refused this plan's isolation."""
    s = plan_.state
    return NodeState(s.verdict, "", s.failed, s.degraded, blocked=True)
