"""Collective-library flags from the chosen devices and the node: one rule
per test, and the vendor map checked against what the injector's runtimes read."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
import yaml

from agents.parsing import npu_smi
from hcs_bus.messages import DeviceFingerprint, PlanRequest, Policy, Requests
from scheduler.extender.collectives import (
    IB_DISABLE,
    INTRA_PCIE,
    INTRA_ROCE,
    P2P_DISABLE,
    READ_BY,
    collective_annotations,
)
from scheduler.plan import rules as planning
from tests.agents.conftest import fixture_text
from tests.scheduler.helpers import DB, dev, node_fp, state_of

RUNTIMES = Path(__file__).parents[2] / "injector" / "data" / "runtimes.yaml"
FABRIC = {"hcs.io/rdma-fabric": "ib-a"}


def _mesh(key: str, n: int, *, gbps: float = 300.0) -> dict[int, DeviceFingerprint]:
    """n devices, each linked to every other (by the profile's interconnect)."""
    return {i: dev(i, key, links={j: gbps for j in range(n) if j != i}) for i in range(n)}


def _flags(
    vendor: str,
    chosen: list[int],
    devices: dict[int, DeviceFingerprint],
    labels: dict[str, str] | None = None,
) -> dict[str, str]:
    return collective_annotations(
        vendor=vendor, chosen=chosen, devices=devices, labels=labels or {}
    )


def test_four_nvlinked_a100s_keep_p2p_on() -> None:
    flags = _flags("nvidia", [0, 1, 2, 3], _mesh("nvidia/A100-80G", 8), FABRIC)
    assert flags == {P2P_DISABLE: "0", IB_DISABLE: "0"}


def test_pcie_only_devices_disable_p2p() -> None:
    devices = _mesh("nvidia/L40S", 2, gbps=64.0)  # links of type pcie
    assert {link.type for d in devices.values() for link in d.links} == {"pcie"}
    assert _flags("nvidia", [0, 1], devices)[P2P_DISABLE] == "1"


def test_devices_without_any_links_disable_p2p() -> None:
    devices = {i: dev(i, "nvidia/T4") for i in range(2)}
    assert _flags("nvidia", [0, 1], devices)[P2P_DISABLE] == "1"


def test_one_pair_missing_its_peer_link_disables_p2p_for_the_set() -> None:
    devices = _mesh("nvidia/A100-80G", 4)
    devices[3] = dev(3, "nvidia/A100-80G", links={})
    devices = {  # nobody lists a link to device 3 either
        i: msgspec.structs.replace(d, links=tuple(x for x in d.links if x.peer_index != 3))
        for i, d in devices.items()
    }
    assert _flags("nvidia", [0, 1, 2], devices)[P2P_DISABLE] == "0"
    assert _flags("nvidia", [0, 1, 2, 3], devices)[P2P_DISABLE] == "1"


def test_a_link_listed_by_one_side_of_a_pair_is_enough() -> None:
    devices = {0: dev(0, "nvidia/A100-80G", links={1: 300.0}), 1: dev(1, "nvidia/A100-80G")}
    assert _flags("nvidia", [0, 1], devices)[P2P_DISABLE] == "0"


def test_a_set_spanning_numa_nodes_without_peer_links_disables_p2p() -> None:
    devices = {
        i: msgspec.structs.replace(dev(i, "nvidia/L40S", links={1 - i: 32.0}), numa_node=i)
        for i in range(2)
    }
    assert _flags("nvidia", [0, 1], devices)[P2P_DISABLE] == "1"


def test_a_set_spanning_numa_nodes_over_nvlink_keeps_p2p_on() -> None:
    devices = {
        i: msgspec.structs.replace(d, numa_node=i // 2)
        for i, d in _mesh("nvidia/A100-80G", 4).items()
    }
    assert _flags("nvidia", [0, 1, 2, 3], devices)[P2P_DISABLE] == "0"


def test_a_single_device_writes_p2p_as_not_disabled() -> None:
    assert _flags("nvidia", [5], {5: dev(5, "nvidia/T4")})[P2P_DISABLE] == "0"


def test_a_chosen_device_the_node_no_longer_reports_counts_as_unlinked() -> None:
    devices = _mesh("nvidia/A100-80G", 2)
    assert _flags("nvidia", [0, 1, 7], devices)[P2P_DISABLE] == "1"


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({"hcs.io/rdma-fabric": "ib-a"}, "0"),
        ({"hcs.io/rdma-fabric": ""}, "1"),
        ({"hcs.io/network-group": "ng-a"}, "1"),  # a network group is not an RDMA fabric
        ({}, "1"),
    ],
)
def test_ib_is_disabled_unless_the_node_has_an_rdma_fabric(
    labels: dict[str, str], expected: str
) -> None:
    assert _flags("nvidia", [0], {0: dev(0)}, labels)[IB_DISABLE] == expected


def test_hccs_linked_ascend_npus_use_the_intra_node_path_and_not_roce() -> None:
    flags = _flags("huawei", [0, 1, 2, 3], _mesh("huawei/Ascend910B3", 8), FABRIC)
    assert flags == {INTRA_PCIE: "1", INTRA_ROCE: "0"}


def test_ascend_npus_without_hccs_between_them_go_over_roce() -> None:
    devices = _mesh("huawei/Ascend310P", 2, gbps=32.0)  # pcie links only
    assert _flags("huawei", [0, 1], devices) == {INTRA_PCIE: "0", INTRA_ROCE: "1"}


def _ascend_910b_node(topo: str | None) -> dict[int, DeviceFingerprint]:
    """The 8 NPUs of the recorded 910B table, linked as the agent links them
    from a recorded ``npu-smi info -t topo`` (none: a node whose agent read no matrix)."""
    devices = npu_smi.parse_info(fixture_text("npu-smi-info-910b.txt"), db=DB).devices
    if topo is not None:
        cells, _ = npu_smi.parse_topo(fixture_text(topo))
        devices, _ = npu_smi.with_links(devices, cells, db=DB)
    return {d.index: d for d in devices}


def test_a_multi_npu_ascend_pod_on_npus_the_agent_read_as_hccs_linked_uses_hccs() -> None:
    devices = _ascend_910b_node("npu-smi-info-t-topo-910b.txt")
    for chosen in ([0, 1], [2, 5, 7], list(range(8))):
        assert _flags("huawei", chosen, devices, FABRIC) == {INTRA_PCIE: "1", INTRA_ROCE: "0"}


@pytest.mark.parametrize("topo", ["npu-smi-info-t-topo-pcie.txt", None])
def test_a_multi_npu_ascend_pod_on_npus_without_hccs_still_goes_over_roce(
    topo: str | None,
) -> None:
    devices = _ascend_910b_node(topo)
    assert _flags("huawei", [0, 1], devices, FABRIC) == {INTRA_PCIE: "0", INTRA_ROCE: "1"}


@pytest.mark.parametrize(
    ("topo", "accepted"),
    [
        ("npu-smi-info-t-topo-910b.txt", True),
        ("npu-smi-info-t-topo-pcie.txt", False),
        (None, False),
    ],
)
def test_topology_high_bandwidth_on_ascend_is_planned_only_where_npus_have_hccs(
    topo: str | None, accepted: bool
) -> None:
    node = node_fp("ascend-1", devices=tuple(_ascend_910b_node(topo).values()))
    summary = planning.summarise(state_of(node).nodes.values())
    policy = Policy(vendors=("huawei",), topology="high-bandwidth")
    request = PlanRequest(namespace="ml", requests=Requests(devices=4), policy=policy)
    plan = planning.plan(request, summary=summary, profiles=DB)
    assert plan.ok is accepted, plan.reason
    if accepted:
        assert (plan.vendor, plan.devices) == ("huawei", 4)
    else:
        assert "no peer links (PCIe only)" in plan.reason
    anywhere = PlanRequest(namespace="ml", requests=Requests(devices=4), policy=Policy())
    assert planning.plan(anywhere, summary=summary, profiles=DB).ok  # without the policy: any


def test_one_ascend_npu_keeps_hccls_defaults() -> None:
    assert _flags("huawei", [0], {0: dev(0, "huawei/Ascend910B3")}) == {
        INTRA_PCIE: "1",
        INTRA_ROCE: "0",
    }


@pytest.mark.parametrize(
    ("vendor", "key"), [("hygon", "hygon/K100"), ("cambricon", "cambricon/MLU590")]
)
def test_xgmi_and_mlulink_are_peer_links_and_only_p2p_is_written(vendor: str, key: str) -> None:
    assert _flags(vendor, [0, 1], _mesh(key, 2), FABRIC) == {P2P_DISABLE: "0"}
    unlinked = {i: dev(i, key) for i in range(2)}
    assert _flags(vendor, [0, 1], unlinked, FABRIC) == {P2P_DISABLE: "1"}


def test_a_vendor_without_a_collective_library_gets_no_flags() -> None:
    assert _flags("someone-new", [0, 1], _mesh("nvidia/A100-80G", 2), FABRIC) == {}


def test_each_vendor_gets_exactly_the_collective_annotations_its_runtime_reads() -> None:
    vendors = yaml.safe_load(RUNTIMES.read_text())["vendors"]
    read = {
        vendor: {a for a in (spec.get("annotation_env") or {}).values() if "collective-" in str(a)}
        for vendor, spec in vendors.items()
    }
    written = {vendor: set(READ_BY.get(vendor, ())) for vendor in vendors}
    assert written == read
    assert set(READ_BY) <= set(vendors)
