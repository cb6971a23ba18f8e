"""Node writes through hcs_bus.kube against the API double: the patch flavours
of docs/architecture.md#kubernetes-wire-facts (JSON patch for capacity, merge for labels, strategic merge for
conditions, read-modify-write with resourceVersion for taints)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hcs_bus import kube as kube_module
from hcs_bus.errors import KubeConflict, KubeInvalid, KubeNotFound
from hcs_bus.kube import TAINT_RETRIES, Kube
from tests.apiserver import ApiServer

WIRE = Path(__file__).parent / "wire"  # copies of the shared k8s/ wire documents

UNHEALTHY = {"key": "hcs.io/gpu-unhealthy", "value": "xid-79", "effect": "NoSchedule"}
GPU_NODE = {"key": "hcs.io/gpu-node", "value": "true", "effect": "NoSchedule"}


async def test_capacity_lands_as_integer_quantities_under_the_escaped_resource_name(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a")

    node = await kube.patch_node_capacity("gpu-node-a", {"ai.compute/vram": 81920, "hcs.io/gpu": 8})

    assert node["status"]["capacity"]["ai.compute/vram"] == "81920"
    assert node["status"]["allocatable"]["hcs.io/gpu"] == "8"
    assert node["status"]["capacity"]["cpu"] == "16"  # the rest of the status stays
    request = apiserver.requests[-1]
    assert (request.method, request.resource) == ("PATCH", "nodes/status")
    assert request.content_type == "application/json-patch+json"
    assert {"op": "add", "path": "/status/capacity/ai.compute~1vram", "value": "81920"} in (
        request.body
    )


async def test_capacity_patch_has_the_shape_of_the_wire_document(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a")

    await kube.patch_node_capacity("gpu-node-a", {"hcs.io/gpu": 8})

    expected = json.loads((WIRE / "node-status-capacity-json-patch.json").read_text())
    assert apiserver.requests[-1].body == expected


@pytest.mark.parametrize("amount", [1.5, -1, True, "8"])
async def test_capacity_that_is_not_a_whole_count_is_refused_before_any_request(
    apiserver: ApiServer, kube: Kube, amount: Any
) -> None:
    apiserver.add_node("gpu-node-a")

    with pytest.raises(KubeInvalid, match=r"ai\.compute/vram"):
        await kube.patch_node_capacity("gpu-node-a", {"ai.compute/vram": amount})
    assert apiserver.requests == []


async def test_capacity_on_a_node_without_a_status_map_is_a_failed_json_patch(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a")
    del apiserver.nodes["gpu-node-a"]["status"]["allocatable"]

    with pytest.raises(KubeInvalid) as caught:
        await kube.patch_node_capacity("gpu-node-a", {"hcs.io/gpu": 8})
    assert caught.value.status == 422


async def test_labels_merge_and_a_none_value_removes_only_that_label(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a", labels={"hcs.io/vendor": "nvidia", "zone": "a"})

    node = await kube.patch_node_labels(
        "gpu-node-a", {"hcs.io/vendor": None, "hcs.io/model": "H200"}
    )

    labels = node["metadata"]["labels"]
    assert labels == {"kubernetes.io/hostname": "gpu-node-a", "zone": "a", "hcs.io/model": "H200"}
    assert apiserver.requests[-1].content_type == "application/merge-patch+json"
    assert apiserver.nodes["gpu-node-a"]["metadata"]["labels"] == labels


async def test_a_missing_node_is_kube_not_found(kube: Kube) -> None:
    with pytest.raises(KubeNotFound) as caught:
        await kube.get_node("nowhere")
    assert caught.value.status == 404


async def test_taint_update_after_a_stale_read_retries_and_keeps_the_other_taint(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a", taints=[GPU_NODE])
    racer = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    # Someone else writes the node between our read and our write.
    apiserver.before("patch", "nodes", lambda: _add_taint(apiserver, "gpu-node-a", racer))

    taints = await kube.update_node_taints("gpu-node-a", lambda ts: [*ts, UNHEALTHY])

    assert taints == [GPU_NODE, racer, UNHEALTHY]
    assert apiserver.nodes["gpu-node-a"]["spec"]["taints"] == [GPU_NODE, racer, UNHEALTHY]
    patches = [r for r in apiserver.requests if r.verb == "patch"]
    assert len(patches) == 2  # the first got 409
    assert (
        patches[0].body["metadata"]["resourceVersion"]
        != (patches[1].body["metadata"]["resourceVersion"])
    )
    assert patches[1].content_type == "application/strategic-merge-patch+json"


async def test_taint_update_gives_up_with_kube_conflict_after_the_retries(
    apiserver: ApiServer, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kube_module, "TAINT_BACKOFF_S", 0.001)
    apiserver.add_node("gpu-node-a")
    apiserver.fail("patch", "nodes", code=409, times=TAINT_RETRIES)

    with pytest.raises(KubeConflict):
        await kube.update_node_taints("gpu-node-a", lambda ts: [*ts, UNHEALTHY])
    assert sum(r.verb == "patch" for r in apiserver.requests) == TAINT_RETRIES


async def test_removing_the_last_taint_writes_an_empty_list(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a", taints=[UNHEALTHY])

    taints = await kube.update_node_taints(
        "gpu-node-a", lambda ts: [t for t in ts if t["key"] != UNHEALTHY["key"]]
    )

    assert taints == []
    assert apiserver.nodes["gpu-node-a"]["spec"]["taints"] == []


async def test_an_unchanged_taint_list_is_not_written(apiserver: ApiServer, kube: Kube) -> None:
    apiserver.add_node("gpu-node-a", taints=[GPU_NODE])

    assert await kube.update_node_taints("gpu-node-a", lambda ts: ts) == [GPU_NODE]
    assert [r.verb for r in apiserver.requests] == ["get"]


async def test_a_strategic_merge_patch_replaces_the_taint_list_as_the_wire_document_shows(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a", taints=[{"key": "old", "effect": "NoExecute"}])
    doc = json.loads((WIRE / "node-taints-strategic-merge-patch.json").read_text())
    doc["metadata"]["resourceVersion"] = apiserver.nodes["gpu-node-a"]["metadata"][
        "resourceVersion"
    ]

    await kube._call("raw", kube._core.patch_node, "gpu-node-a", doc, _content_type=_SMP)

    assert apiserver.nodes["gpu-node-a"]["spec"]["taints"] == doc["spec"]["taints"]
    doc["metadata"]["resourceVersion"] = "1"
    with pytest.raises(KubeConflict):
        await kube._call("raw", kube._core.patch_node, "gpu-node-a", doc, _content_type=_SMP)


async def test_a_node_condition_is_merged_by_type_and_leaves_the_others(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("gpu-node-a")
    doc = json.loads((WIRE / "node-status-condition-strategic-merge-patch.json").read_text())
    condition = doc["status"]["conditions"][0]

    await kube.patch_node_condition("gpu-node-a", condition)
    healed = {**condition, "status": "True", "reason": "Recovered"}
    node = await kube.patch_node_condition("gpu-node-a", healed)

    conditions = {c["type"]: c for c in node["status"]["conditions"]}
    assert set(conditions) == {"Ready", "HcsGpuHealthy"}
    assert conditions["HcsGpuHealthy"]["status"] == "True"
    assert conditions["HcsGpuHealthy"]["message"] == condition["message"]
    assert conditions["Ready"]["status"] == "True"
    assert apiserver.requests[-1].body == {"status": {"conditions": [healed]}}
    assert apiserver.requests[-1].content_type == "application/strategic-merge-patch+json"


async def test_a_condition_without_type_or_status_is_refused(kube: Kube) -> None:
    with pytest.raises(KubeInvalid, match="needs type and status"):
        await kube.patch_node_condition("gpu-node-a", {"type": "HcsGpuHealthy"})


_SMP = "application/strategic-merge-patch+json"


def _add_taint(server: ApiServer, node: str, taint: dict[str, Any]) -> None:
    obj = server.nodes[node]
    obj["spec"]["taints"] = [*obj["spec"].get("taints", []), taint]
    server.store("nodes", node, obj)
