"""coordination.k8s.io/v1 Leases with optimistic concurrency, and the HCS
custom resources (ComputeQuota list, ComputeNode status subresource)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from hcs_bus.errors import KubeConflict, KubeError, KubeNotFound
from hcs_bus.kube import Kube
from tests.apiserver import ApiServer

WIRE = Path(__file__).parent / "wire"
NS = "hcs-system"


def _lease_body() -> dict[str, Any]:
    doc = json.loads((WIRE / "lease-coordination-v1.json").read_text())
    del doc["metadata"]["resourceVersion"]  # a create must not carry one
    return doc  # type: ignore[no-any-return]


async def test_a_lease_is_created_read_and_renewed_with_its_resource_version(
    apiserver: ApiServer, kube: Kube
) -> None:
    created = await kube.create_lease(NS, _lease_body())
    renewed_body = copy.deepcopy(created)
    renewed_body["spec"]["renewTime"] = "2026-07-20T09:20:12.000000Z"

    renewed = await kube.replace_lease(NS, "hcs-node-healer", renewed_body)

    assert renewed["metadata"]["uid"] == created["metadata"]["uid"]
    assert int(renewed["metadata"]["resourceVersion"]) > int(created["metadata"]["resourceVersion"])
    assert (await kube.get_lease(NS, "hcs-node-healer"))["spec"] == renewed_body["spec"]
    assert apiserver.requests[-2].method == "PUT"


async def test_a_replace_from_a_stale_read_is_kube_conflict(
    apiserver: ApiServer, kube: Kube
) -> None:
    created = await kube.create_lease(NS, _lease_body())
    winner = copy.deepcopy(created)
    winner["spec"]["holderIdentity"] = "other-replica"
    await kube.replace_lease(NS, "hcs-node-healer", winner)

    loser = copy.deepcopy(created)  # still carries the old resourceVersion
    with pytest.raises(KubeConflict) as caught:
        await kube.replace_lease(NS, "hcs-node-healer", loser)

    assert caught.value.status == 409
    assert apiserver.leases[(NS, "hcs-node-healer")]["spec"]["holderIdentity"] == "other-replica"


async def test_creating_a_lease_twice_is_kube_conflict(kube: Kube) -> None:
    await kube.create_lease(NS, _lease_body())

    with pytest.raises(KubeConflict, match="already exists"):
        await kube.create_lease(NS, _lease_body())


async def test_a_missing_lease_is_kube_not_found(kube: Kube) -> None:
    with pytest.raises(KubeNotFound):
        await kube.get_lease(NS, "hcs-node-healer")


async def test_compute_quotas_are_listed_per_namespace(apiserver: ApiServer, kube: Kube) -> None:
    apiserver.add_quota("ml-team", "gpus", {"acu": 400})
    apiserver.add_quota("other", "gpus", {"acu": 100})

    quotas = await kube.list_compute_quotas("ml-team")

    assert [(q["metadata"]["name"], q["spec"]) for q in quotas] == [("gpus", {"acu": 400})]
    assert quotas[0]["apiVersion"] == "hcs.io/v1alpha1"
    assert apiserver.requests[-1].path == "/apis/hcs.io/v1alpha1/namespaces/ml-team/computequotas"


async def test_compute_node_status_is_created_then_merge_patched_on_the_subresource(
    apiserver: ApiServer, kube: Kube
) -> None:
    first = await kube.patch_compute_node_status("gpu-node-a", {"devices": 8, "acu": 800})
    second = await kube.patch_compute_node_status("gpu-node-a", {"acu": 700})

    assert first["status"] == {"devices": 8, "acu": 800}
    assert second["status"] == {"devices": 8, "acu": 700}
    assert second["kind"] == "ComputeNode"
    assert [(r.verb, r.resource) for r in apiserver.requests] == [
        ("patch", "computenodes/status"),
        ("create", "computenodes"),
        ("patch", "computenodes/status"),
        ("patch", "computenodes/status"),
    ]
    assert apiserver.requests[-1].content_type == "application/merge-patch+json"


async def test_custom_resources_refuse_strategic_merge_as_the_real_server_does(
    apiserver: ApiServer, kube: Kube
) -> None:
    await kube.patch_compute_node_status("gpu-node-a", {"acu": 1})

    with pytest.raises(KubeError) as caught:  # 415 has no type of its own
        await kube._call(
            "raw",
            kube._custom.patch_cluster_custom_object_status,
            "hcs.io",
            "v1alpha1",
            "computenodes",
            "gpu-node-a",
            {"status": {"acu": 2}},
            _content_type="application/strategic-merge-patch+json",
        )
    assert caught.value.status == 415
    assert apiserver.computenodes["gpu-node-a"]["status"] == {"acu": 1}
