"""What the adapter sends, and the nodes and pods it leaves behind, validate
strictly against the upstream Kubernetes OpenAPI schema (kubernetes-validate)."""

from __future__ import annotations

import copy
from typing import Any

import kubernetes_validate
import pytest

from hcs_bus.kube import Kube
from tests.apiserver import ApiServer

NS = "ml-team"


def _validate(doc: dict[str, Any]) -> None:
    kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


async def test_write_bodies_and_resulting_objects_match_the_upstream_schema(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a")
    pod = apiserver.add_pod(NS, "trainer", phase="Pending")
    apiserver.add_pod(NS, "victim", node="gpu-node-a")

    await kube.patch_node_capacity("gpu-node-a", {"ai.compute/vram": 81920})
    await kube.patch_node_labels("gpu-node-a", {"hcs.io/vendor": "nvidia"})
    await kube.update_node_taints(
        "gpu-node-a", lambda ts: [*ts, {"key": "hcs.io/gpu-unhealthy", "effect": "NoSchedule"}]
    )
    await kube.patch_node_condition(
        "gpu-node-a",
        {"type": "HcsGpuHealthy", "status": "False", "reason": "XidError79", "message": "m"},
    )
    await kube.bind_pod(
        NS, "trainer", uid=pod["metadata"]["uid"], node="gpu-node-a", annotations={"a": "b"}
    )
    await kube.evict_pod(NS, "victim", dry_run=True)
    lease = await kube.create_lease(
        NS,
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "hcs-scheduler"},
            "spec": {"holderIdentity": "r1", "leaseDurationSeconds": 15},
        },
    )
    await kube.replace_lease(NS, "hcs-scheduler", copy.deepcopy(lease))

    whole = [r.body for r in apiserver.requests if r.verb in ("create", "update")]
    assert {b["kind"] for b in whole} == {"Binding", "Eviction", "Lease"}
    for body in whole:
        _validate(body)
    _validate(await kube.get_node("gpu-node-a"))
    _validate(await kube.get_pod(NS, "trainer"))


def test_the_schema_check_does_catch_a_misspelt_field() -> None:
    with pytest.raises(kubernetes_validate.ValidationError):
        _validate({"apiVersion": "v1", "kind": "Binding", "metadata": {}, "target": {"nme": "x"}})
