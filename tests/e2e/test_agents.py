"""The agent on a real cluster in node mode (the vendor tool's recorded output
on PATH), and ComputeNode status on the real CRD."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path
from typing import Any

from agents.parsing import npu_smi
from hcs_bus.profiles import load
from hcs_bus.units import parse_quantity
from tests.e2e.api import wait_for
from tests.e2e.cluster import Cluster
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, fleet_labelled

FIXTURES = Path(__file__).resolve().parents[1] / "agents" / "fixtures"
NODE = "npu-node-mode-0"


def _fake_tool(folder: Path, name: str, fixture: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat {fixture}\n")
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _on_the_npu_node(work: Workloads, name: str, *, vram: str) -> dict[str, Any]:
    """A pod asking ``vram`` of Ascend devices, held to the node-mode node; once Running."""
    work.pod(
        name,
        {"ai.compute/vram": vram},
        annotations={"hcs.io/vendors": "huawei"},
        nodeSelector={"kubernetes.io/hostname": NODE},
    )
    return work.running(name, timeout_s=60)


def test_a_node_mode_agent_labels_its_node_and_the_kubelet_admits_a_pod_there(
    cluster: Cluster, stack: Stack, work: Workloads, tmp_path: Path
) -> None:
    cluster.add_nodes([NODE])
    tools = tmp_path / "bin"
    _fake_tool(tools, "npu-smi", FIXTURES / "npu-smi-info-910b.txt")
    stack.start_part(
        "agents-node",
        [sys.executable, "-m", "agents", "--node", NODE],
        PATH=f"{tools}{os.pathsep}{os.environ.get('PATH', '')}",
        HCS_AGENT__MEASURE_ACU="false",
    )
    # the agent keeps running with the stack: a node whose agent stops is lost to
    # the healer (NoExecute taint), which would use up the circuit breaker's budget

    def advertised() -> dict[str, Any] | None:
        node = work.node(NODE)
        alloc = node["status"].get("allocatable", {})
        labels = node["metadata"].get("labels", {})
        if "ai.compute/vram" in alloc and labels.get("hcs.io/vendor") == "huawei":
            return node
        return None

    node = wait_for(
        advertised,
        what=f"{NODE} labelled by its agent",
        timeout_s=60,
        explain=lambda: stack.why() + str(work.node(NODE)["status"].get("allocatable")),
    )
    alloc = node["status"]["allocatable"]
    assert int(alloc["ai.compute/devices"]) == 8
    # the HBM the driver and firmware hold at rest (used, less what the listed
    # processes hold) is not advertised: the apiserver keeps the byte count,
    # in its canonical form ("523239424k")
    readings = npu_smi.parse_info((FIXTURES / "npu-smi-info-910b.txt").read_text(), db=load())
    usable_mib = sum(d.vram_usable_mib for d in readings.devices)
    assert 0 < usable_mib < sum(d.vram_total_mib for d in readings.devices)
    assert parse_quantity(alloc["ai.compute/vram"]) == usable_mib * 1024 * 1024
    pod = _on_the_npu_node(work, "on-npu", vram="16Gi")
    assert pod["spec"]["nodeName"] == NODE
    env = {e["name"] for e in pod["spec"]["containers"][0]["env"]}
    assert "ASCEND_VISIBLE_DEVICES" in env

    # 62 GiB fits a 910B's 64 GiB total, not what its driver leaves: the plan
    # takes two whole devices, as for any request larger than one device
    pod = _on_the_npu_node(work, "past-the-driver", vram="62Gi")
    plan = json.loads(pod["metadata"]["annotations"]["hcs.io/plan"])
    assert (plan["devices"], plan["whole_device"]) == (2, True), plan
    held = {d.index: d.vram_usable_mib for d in readings.devices}
    devices = [int(i) for i in pod["metadata"]["annotations"]["hcs.io/devices"].split(",")]
    assert sum(held[i] for i in devices) >= 62 * 1024


def test_every_fleet_node_has_a_compute_node_with_its_devices(
    stack: Stack, work: Workloads
) -> None:
    nodes = fleet_labelled(work, FLEET)

    def mirrored(name: str) -> dict[str, Any] | None:
        obj = work.api.get(f"/apis/hcs.io/v1alpha1/computenodes/{name}")
        return obj if obj.get("status", {}).get("devices") else None

    for name, node in nodes.items():
        obj = wait_for(
            lambda name=name: mirrored(name),
            what=f"ComputeNode {name}",
            timeout_s=30,
            explain=stack.why,
        )
        status = obj["status"]
        assert status["devices"] == int(node["status"]["allocatable"]["ai.compute/devices"])
        assert status["vendor"] == node["metadata"]["labels"]["hcs.io/vendor"]
        assert [d["index"] for d in status["deviceList"]] == list(range(status["devices"]))
        assert all(d["health"] for d in status["deviceList"])
