"""Node labels and extended resources through hcs_bus.kube (API-server double)."""

from __future__ import annotations

from agents.labeling import ACU, VRAM, Labeler, capacity, labels_of_devices
from tests.agents.test_changes import dev


async def test_labels_and_capacity_are_written_once_and_again_on_change(apiserver, kube) -> None:
    apiserver.add_node("gpu-1")
    labeler = Labeler(kube, node="gpu-1")
    devices = [dev(0), dev(1), dev(2, error="nvml: GPU is lost")]
    labels = labels_of_devices(devices, base={"hcs.io/network-group": "ng-a", "other": "x"})
    assert await labeler.apply(labels, devices)
    node = apiserver.nodes["gpu-1"]
    assert node["metadata"]["labels"]["hcs.io/vendor"] == "nvidia"
    assert node["metadata"]["labels"]["hcs.io/model"] == "A100-80G"
    assert node["metadata"]["labels"]["hcs.io/network-group"] == "ng-a"
    assert "other" not in node["metadata"]["labels"]
    assert node["status"]["capacity"][VRAM] == str(2 * 81920)
    assert node["status"]["allocatable"][ACU] == "200"
    writes = len(apiserver.requests)
    assert not await labeler.apply(labels, devices)
    assert len(apiserver.requests) == writes
    assert await labeler.apply(labels, devices[:1])
    assert apiserver.nodes["gpu-1"]["status"]["capacity"][ACU] == "100"


async def test_without_a_cluster_the_labeler_logs_once_and_carries_on() -> None:
    labeler = Labeler(None, node="gpu-1")
    assert not await labeler.apply({}, [dev(0)])
    assert not await labeler.apply({}, [dev(0)])
    assert capacity([dev(0)]) == {VRAM: 81920, ACU: 100}
