"""A ComputeQuota on a real cluster holds against a burst: 20 pods created at
once under a quota for 2 → exactly 2 admitted and bound, the other 18 refused
at admission with the quota's reason (each admission's plan writes a pledge
into the ledger, and every plan counts the pledges). A plan note copied onto
another pod is refused. ``hcs check`` finds ledger and pods in agreement."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest

from tests.e2e.api import ApiError, wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.test_ledger import _hcs_check
from tests.e2e.workloads import Workloads, fleet_labelled

SLICE = {"ai.compute/vram": "32Gi"}
ON_A100 = {"hcs.io/models": "A100-80G"}
BURST = 20
COPIED = ("hcs.io/plan", "hcs.io/plan-sig", "hcs.io/pledge")


def _quota(work: Workloads, *, vram: str) -> dict[str, Any]:
    body = {
        "apiVersion": "hcs.io/v1alpha1",
        "kind": "ComputeQuota",
        "metadata": {"name": "team"},
        "spec": {"hard": {"vram": vram}},
    }
    return work.api.create(body, namespace=work.namespace)


def _create(work: Workloads, name: str, annotations: dict[str, str]) -> dict[str, Any] | str:
    try:
        return work.pod(name, SLICE, annotations=annotations)
    except ApiError as exc:
        if exc.status >= 500:
            raise
        return str(exc)


def _bound(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["spec"].get("nodeName")]


@pytest.mark.timeout(300)
def test_twenty_pods_at_once_under_a_quota_for_two_bind_exactly_two_and_copies_are_refused(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    _quota(work, vram="64Gi")  # two 32 GiB slices
    with ThreadPoolExecutor(max_workers=BURST) as pool:
        results = list(pool.map(lambda i: _create(work, f"burst-{i}", dict(ON_A100)), range(BURST)))
    admitted = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, str)]
    assert len(admitted) == 2, f"admitted {[p['metadata']['name'] for p in admitted]}: {refused}"
    assert all("quota of namespace" in r for r in refused), refused
    for pod in admitted:
        assert pod["metadata"]["annotations"].get("hcs.io/pledge"), pod["metadata"]
    wait_for(
        lambda: len(_bound(work.pods())) == 2,
        what="both admitted pods bound",
        timeout_s=90,
        explain=lambda: work.explain(admitted[0]["metadata"]["name"]),
    )

    # a pod carrying another pod's plan note, signature and pledge
    notes = admitted[0]["metadata"]["annotations"]
    copied = {k: notes[k] for k in COPIED} | ON_A100
    outcome = _create(work, "copy-0", copied)
    assert isinstance(outcome, str), "a copied plan note was admitted"
    assert "hcs.io/plan" in outcome and "reserved for HCS" in outcome, outcome
    # and nothing else got through meanwhile
    names = {p["metadata"]["name"] for p in _bound(work.pods())}
    assert names == {p["metadata"]["name"] for p in admitted}

    # ComputeQuota status.used is written from the ledger
    def used() -> dict[str, Any] | None:
        cq = work.api.get(f"/apis/hcs.io/v1alpha1/namespaces/{work.namespace}/computequotas/team")
        found = (cq.get("status") or {}).get("used") or {}
        return found if found.get("vram") == "64Gi" and found.get("devices") == 2 else None

    wait_for(used, what="ComputeQuota status.used from the ledger", timeout_s=60)

    status, lines = _hcs_check(stack)
    assert status == 0, "\n".join(lines)
