"""What to do about a node (pure): from the state already applied and the
node's new judgement to a plan of taint, evictions and checkpoint requests.

Devices are isolated one by one; the node only when it is out as a whole
(docs/architecture.md#health):

* a failed device is *out*: its pods are evicted at once (the scheduler keeps
  it out of placement from its verdict); a degraded device's jobs are asked
  to checkpoint, then evicted. Neither taints the node by itself.
* the node is tainted ``hcs.io/unhealthy`` only
  - for a node-wide fault (an event without a device index, or of a kind the
    vocabulary calls node-wide; held at the ``NODE`` history index < 0) or a
    taint adopted from a previous leader (also < 0): NoSchedule when failed,
    ``rules.degraded_taint_effect`` when degraded;
  - when the failed share of its devices reaches ``rules.taint_failed_share``
    (NoSchedule), or the failed-or-degraded share does (degraded effect);
  - NoExecute only when the whole node is lost (the taint manager evicts;
    PDBs not consulted).
* the node's own verdict (``NodeState.verdict``, published as the node
  verdict): lost; failed when tainted NoSchedule; degraded when some devices
  are out or degraded but the node stays in service; else healthy.

A node going from nothing isolated to something isolated (a device or the
node) is an *isolation* and must pass the circuit breaker; a refused
isolation is remembered (``blocked``) so the same verdict does not raise the
alarm again and again.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from hcs_bus import vocabulary
from healer.histories import NodeJudgement, NodeVerdict
from healer.rules import Rules

NODE = -1  # history index for events about the whole node (no device index)


@dataclass(frozen=True, slots=True)
class NodeState:
    verdict: NodeVerdict = "healthy"
    effect: str = ""
    failed: frozenset[int] = frozenset()
    degraded: frozenset[int] = frozenset()
    blocked: bool = False

    @property
    def isolating(self) -> bool:
        """Whether anything of the node (a device or all of it) is held out."""
        return not self.blocked and bool(self.effect or self.failed or self.degraded)


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


def history_index(*, device: int | None, kind: str) -> int:
    """Where an event is judged: its device, or ``NODE`` for an event without a
    device index or of a node-wide kind (the whole node then goes out)."""
    if device is None or vocabulary.node_wide(kind):
        return NODE
    return device


def out_share(out: Collection[int], *, devices: int) -> float:
    """Share of the node's ``devices`` among ``out`` (indices < 0 are not devices).
    ``devices`` 0 (unknown): the devices named are all there is."""
    real = sum(1 for i in out if i >= 0)
    total = max(devices, real)
    return real / total if total else 0.0


def node_wide(out: Collection[int]) -> bool:
    return any(i < 0 for i in out)


def scope(judged: NodeJudgement, *, devices: int, rules: Rules) -> tuple[NodeVerdict, str]:
    """The node's own verdict and the taint effect it gets ("" none)."""
    if judged.verdict == "lost":
        return "lost", "NoExecute"
    failed, degraded = judged.failed, judged.degraded
    threshold = rules.taint_failed_share
    if node_wide(failed) or (failed and out_share(failed, devices=devices) >= threshold):
        return "failed", "NoSchedule"
    unwell = {*failed, *degraded}
    if node_wide(degraded) or (unwell and out_share(unwell, devices=devices) >= threshold):
        return "degraded", rules.degraded_taint_effect
    return ("degraded" if unwell else "healthy"), ""


def plan(previous: NodeState, judged: NodeJudgement, *, rules: Rules, devices: int = 0) -> NodePlan:
    """The plan for a node of ``devices`` devices (0: unknown) judged ``judged``."""
    verdict, effect = scope(judged, devices=devices, rules=rules)
    failed, degraded = frozenset(judged.failed), frozenset(judged.degraded)
    state = NodeState(verdict, effect, failed, degraded)
    if previous.blocked and previous.verdict == verdict:
        return NodePlan(NodeState(verdict, "", failed, degraded, blocked=True))
    taint = None if effect == previous.effect else effect
    lost = verdict == "lost"
    evict_now = () if lost else tuple(sorted(failed - previous.failed))
    slow = () if lost else tuple(sorted(degraded - previous.degraded))
    isolates = state.isolating and not previous.isolating
    return NodePlan(state, taint, evict_now, slow, isolates, judged.reason)


def blocked(plan_: NodePlan) -> NodeState:
    """The state to remember when the breaker refused this plan's isolation."""
    s = plan_.state
    return NodeState(s.verdict, "", s.failed, s.degraded, blocked=True)
