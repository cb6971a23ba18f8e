"""``status.conditions`` of ComputeQuotas (``GuaranteeFits``), written by the
quota status writer over the fleet's pool: False with the reason when the
guarantees cannot all be met, True once they fit; written once per change."""

from __future__ import annotations

from typing import Any

from scheduler.plan.rules import summarise
from scheduler.quota.source import QuotaSource, Used, UsedWriter
from tests.scheduler.helpers import FakeKube
from tests.scheduler.test_gang_rules import A100, fleet


def _quota(guaranteed: str) -> dict[str, Any]:
    return {"metadata": {"name": "team"}, "spec": {"guaranteed": {"vram": guaranteed}}}


def _condition(kube: FakeKube, ns: str) -> dict[str, Any]:
    [condition] = kube.quotas[ns][0]["status"]["conditions"]
    return condition


async def test_guarantees_beyond_the_pool_are_reported_on_every_quota_then_cleared() -> None:
    kube = FakeKube()
    kube.quotas["a"] = [_quota("400Gi")]  # the fleet: 8 x 80Gi = 640Gi
    kube.quotas["b"] = [_quota("400Gi")]
    state = fleet(("gpu", A100, "g1"))
    quotas = QuotaSource(kube=kube, file=None)
    writer = UsedWriter(
        kube=kube,
        quotas=quotas,
        used=lambda: {"a": Used(), "b": Used()},
        classes=lambda: summarise(state.schedulable()).classes,
        clock=lambda: 0.0,
    )
    await writer.write()
    for ns in ("a", "b"):
        condition = _condition(kube, ns)
        assert condition["type"] == "GuaranteeFits" and condition["status"] == "False"
        assert condition["reason"] == "GuaranteesOversubscribed"
        assert condition["lastTransitionTime"] == "1970-01-01T00:00:00Z"
    assert await writer.write() == 0  # unchanged: not written again

    kube.quotas["b"][0]["spec"]["guaranteed"]["vram"] = "160Gi"
    quotas.ttl_s = 0.0
    await quotas.limits("b")  # the stale answer now, a fresh read under way
    await quotas._reading["b"]
    writer.clock = lambda: 60.0
    await writer.write()
    assert _condition(kube, "b")["status"] == "True"
    assert _condition(kube, "a")["reason"] == "Fits"
    assert _condition(kube, "a")["lastTransitionTime"] == "1970-01-01T00:01:00Z"
