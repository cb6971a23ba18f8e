"""Topology on a real cluster: collective-library flags written at bind from
the chosen devices' links, and a multi-pod job kept in one network group by
the Node labels."""

from __future__ import annotations

from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, fleet_labelled

P2P = "hcs.io/collective-p2p-disable"
IB = "hcs.io/collective-ib-disable"


def test_nvlink_devices_get_peer_to_peer_and_pcie_devices_do_not(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    work.pod(
        "nvlink", {"ai.compute/devices": "4"}, annotations={"hcs.io/models": "nvidia/A100-80G"}
    )
    work.pod("pcie", {"ai.compute/devices": "2"}, annotations={"hcs.io/models": "nvidia/L40S"})
    nvlink, pcie = work.running("nvlink"), work.running("pcie")
    assert nvlink["spec"]["nodeName"].startswith("gpu-a100-")
    assert pcie["spec"]["nodeName"] == "gpu-l40s-0"
    a, b = nvlink["metadata"]["annotations"], pcie["metadata"]["annotations"]
    assert len(a["hcs.io/devices"].split(",")) == 4
    assert (a.get(P2P), a.get(IB)) == ("0", "0"), a  # NVLink mesh, InfiniBand fabric
    assert (b.get(P2P), b.get(IB)) == ("1", "1"), b  # PCIe only, no RDMA fabric
    env = {e["name"]: e for e in nvlink["spec"]["containers"][0]["env"]}
    assert env["NCCL_P2P_DISABLE"]["valueFrom"]["fieldRef"]["fieldPath"] == (
        f"metadata.annotations['{P2P}']"
    )


def test_the_pods_of_one_job_land_in_one_network_group(stack: Stack, work: Workloads) -> None:
    """gpu-a100-0 is in ng-a, gpu-a100-1 and -2 in ng-b (Node labels). Rank 0 is
    pinned to gpu-a100-1; rank 1 fits on gpu-a100-0 (bin-packing's favourite when
    it holds other pods) and on gpu-a100-2, and must go to ng-b."""
    nodes = fleet_labelled(work, FLEET)
    group_of = {name: n["metadata"]["labels"]["hcs.io/network-group"] for name, n in nodes.items()}
    assert group_of["gpu-a100-0"] != group_of["gpu-a100-1"] == group_of["gpu-a100-2"]
    job = {"hcs.io/job": "allreduce"}
    notes = {"hcs.io/models": "nvidia/A100-80G"}
    work.pod(
        "rank-0",
        {"ai.compute/devices": "6"},
        labels=job,
        annotations=notes,
        nodeSelector={"kubernetes.io/hostname": "gpu-a100-1"},
    )
    assert work.running("rank-0")["spec"]["nodeName"] == "gpu-a100-1"
    work.pod("rank-1", {"ai.compute/devices": "4"}, labels=job, annotations=notes)
    assert work.running("rank-1")["spec"]["nodeName"] == "gpu-a100-2"
