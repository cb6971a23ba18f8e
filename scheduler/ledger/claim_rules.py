"""Pod claims: one pod, one node. Pure: documents in, verdicts out; no I/O,
no clock (``now`` is passed in).

A bind first claims its pod in KV ``hcs_alloc`` under
``claims=<namespace>=<pod>`` (a compare-and-set create), naming the node it
binds to, and only then reserves devices on that node. Two binds of one pod
to two nodes (two scheduler replicas, a retried scheduling cycle) race on
that one key: the loser is refused while the winner's reservation stands or
is still being made, so a pod never holds reservations on two nodes. The
claim goes with the pod's reservation (release, expiry, a failed bind).

A claim is stale, and taken over, when it names another pod of the same
name (another uid: the first was deleted), or another node that holds no
reservation for the pod once ``ttl_s`` has passed since it was made (a bind
that crashed between claim and reservation).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from hcs_bus.messages import PodRef

KEY_PREFIX = "claims="


class PodClaim(msgspec.Struct, frozen=True, kw_only=True, tag="pod_claim", tag_field="type"):
    """The node a pod is being bound, or is bound, to by HCS."""

    node: str
    uid: str = ""
    time_s: float = 0.0


Outcome = Literal["take", "mine", "held", "binding"]


@dataclass(frozen=True, slots=True)
class Verdict:
    outcome: Outcome
    claim: PodClaim | None = None  # the claim found

    @property
    def ok(self) -> bool:
        return self.outcome in ("take", "mine")


def key_for(ref: PodRef) -> str:
    return f"{KEY_PREFIX}{ref.namespace}={ref.name}"


def is_claim_key(key: str) -> bool:
    return key.startswith(KEY_PREFIX)


def _same_pod(found: PodClaim, uid: str) -> bool:
    return not found.uid or not uid or found.uid == uid


def verdict(
    found: PodClaim | None,
    *,
    node: str,
    uid: str,
    now: float,
    ttl_s: float,
    held_there: bool,
) -> Verdict:
    """May a bind of pod ``uid`` to ``node`` claim the pod, given the claim
    ``found`` and whether that claim's node holds a reservation for the pod
    (``held_there``)? ``take``: write a claim for ``node``; ``mine``: the pod
    already claims ``node`` (a retried bind); ``held``: the pod holds a
    reservation on another node; ``binding``: another bind of it to another
    node is under way."""
    if found is None or not _same_pod(found, uid):
        return Verdict("take", found)
    if found.node == node:
        return Verdict("mine", found)
    if held_there:
        return Verdict("held", found)
    if now - found.time_s < ttl_s:
        return Verdict("binding", found)
    return Verdict("take", found)


def refusal(v: Verdict, *, ref: PodRef, node: str) -> str:
    """kube-scheduler's error for a refused claim."""
    other = v.claim.node if v.claim is not None else "?"
    who = f"{ref.namespace}/{ref.name}"
    if v.outcome == "held":
        return (
            f"hcs: pod {who} already holds a reservation on node {other}; not binding it to {node}"
        )
    return (
        f"hcs: pod {who} is being bound to node {other} by another bind; not binding it to {node}"
    )


def releasable(found: PodClaim | None, *, node: str, uid: str) -> bool:
    """Whether the claim ``found`` goes with the pod's reservation on ``node``."""
    return found is not None and found.node == node and _same_pod(found, uid)
