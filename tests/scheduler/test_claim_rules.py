"""One pod, one node: the claim verdicts (pure)."""

from __future__ import annotations

import pytest

from hcs_bus.messages import PodRef
from scheduler.ledger import claim_rules as claims
from scheduler.ledger.claim_rules import PodClaim

REF = PodRef(namespace="ml", name="train-0", uid="u1")


@pytest.mark.parametrize(
    ("found", "held_there", "now", "outcome"),
    [
        (None, False, 100.0, "take"),
        (PodClaim(node="a", uid="u1", time_s=99.0), False, 100.0, "mine"),
        (PodClaim(node="b", uid="u1", time_s=99.0), True, 100.0, "held"),
        (PodClaim(node="b", uid="u1", time_s=99.0), False, 100.0, "binding"),
        (PodClaim(node="b", uid="u1", time_s=30.0), False, 100.0, "take"),  # stale
        (PodClaim(node="b", uid="u1", time_s=30.0), True, 100.0, "held"),  # old but held
        (PodClaim(node="b", uid="u0", time_s=99.0), True, 100.0, "take"),  # another pod
    ],
    ids=["none", "retried", "held-elsewhere", "in-flight", "stale", "held-old", "new-uid"],
)
def test_a_bind_claims_its_pod_only_where_no_other_node_holds_or_binds_it(
    found: PodClaim | None, held_there: bool, now: float, outcome: str
) -> None:
    v = claims.verdict(found, node="a", uid="u1", now=now, ttl_s=60.0, held_there=held_there)
    assert v.outcome == outcome
    assert v.ok == (outcome in ("take", "mine"))
    if not v.ok:
        assert "node b" in claims.refusal(v, ref=REF, node="a")


def test_a_claim_goes_only_with_the_reservation_it_names() -> None:
    mine = PodClaim(node="a", uid="u1", time_s=1.0)
    assert claims.releasable(mine, node="a", uid="u1")
    assert not claims.releasable(mine, node="b", uid="u1")
    assert not claims.releasable(mine, node="a", uid="u2")
    assert not claims.releasable(None, node="a", uid="u1")
    assert claims.key_for(REF) == "claims=ml=train-0" and claims.is_claim_key("claims=ml=x")
