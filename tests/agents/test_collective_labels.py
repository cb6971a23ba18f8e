"""``ai.compute/collective`` and ``ai.compute/fabric`` on a node: one collective
library, one fabric per library and group, valid label values, written on the
Node (API-server double) with the operator's group read off the Node."""

from __future__ import annotations

import pytest

from agents.labeling import Labeler
from agents.labels import (
    COLLECTIVE,
    FABRIC,
    NETWORK_GROUP,
    RDMA_FABRIC,
    collective_labels,
    fabric_value,
    label_value_problem,
    labels_of_devices,
)
from hcs_bus import vocabulary
from tests.agents.test_changes import dev


@pytest.mark.parametrize(
    ("vendor", "library"),
    [
        ("nvidia", "nccl"),
        ("huawei", "hccl"),
        ("cambricon", "cncl"),
        ("amd", "rccl"),
        ("hygon", "rccl"),
        ("mthreads", "mccl"),
        ("iluvatar", "ixccl"),
        ("someone-new", "someone-new"),  # a vendor not listed speaks its own
    ],
)
def test_each_vendor_s_node_names_its_collective_library_and_fabric(
    vendor: str, library: str
) -> None:
    labels = labels_of_devices([dev(0, vendor=vendor)], base={NETWORK_GROUP: "rack-7"})
    derived = collective_labels(labels, node={})
    assert derived == {COLLECTIVE: library, FABRIC: f"{library}.rack-7"}
    assert all(label_value_problem(v) is None for v in derived.values() if v is not None)


def test_the_library_map_is_the_one_the_gang_planner_reads() -> None:
    from scheduler.plan import gang_rules

    assert gang_rules.LIBRARY is vocabulary.COLLECTIVE_LIBRARY
    assert gang_rules.library_of("Huawei") == vocabulary.collective_library("huawei") == "hccl"


def test_the_rdma_fabric_names_the_group_before_the_network_group_as_the_scheduler_reads() -> None:
    labels = {"hcs.io/vendor": "nvidia", NETWORK_GROUP: "ng-a"}
    assert collective_labels(labels, node={RDMA_FABRIC: "ib-1"})[FABRIC] == "nccl.ib-1"
    assert collective_labels(labels, node={RDMA_FABRIC: ""})[FABRIC] == "nccl.ng-a"
    # the group the agent writes wins over the Node's older one
    assert collective_labels(labels, node={NETWORK_GROUP: "old"})[FABRIC] == "nccl.ng-a"


def test_a_node_without_a_group_has_a_library_and_no_fabric_and_a_mixed_node_neither() -> None:
    assert collective_labels({"hcs.io/vendor": "huawei"}, node={}) == {
        COLLECTIVE: "hccl",
        FABRIC: None,
    }
    mixed = {"hcs.io/vendor": "mixed", NETWORK_GROUP: "ng-a"}
    assert collective_labels(mixed, node={}) == {COLLECTIVE: None, FABRIC: None}
    assert collective_labels({NETWORK_GROUP: "ng-a"}, node={}) == {}  # vendor not known yet


def test_a_long_group_gives_a_valid_fabric_that_stays_apart_from_another_long_one() -> None:
    one, two = "g" * 60 + "-east", "g" * 60 + "-west"
    a, b = fabric_value("hccl", one), fabric_value("hccl", two)
    assert a != b and len(a) == len(b) == 63
    assert label_value_problem(a) is None and label_value_problem(b) is None
    assert a.startswith("hccl.ggg")
    assert fabric_value("nccl", "ng-a") == "nccl.ng-a"


async def test_the_node_gets_both_labels_with_the_operator_s_group_from_the_node(
    apiserver, kube
) -> None:
    apiserver.add_node("npu-1", labels={NETWORK_GROUP: "rack-7"})  # set by the operator
    labeler = Labeler(kube, node="npu-1")
    devices = [dev(i, vendor="huawei", model="Ascend910B3") for i in range(8)]
    labels = labels_of_devices(devices, base={})
    assert await labeler.apply(labels, devices, now_s=0.0)
    written = apiserver.nodes["npu-1"]["metadata"]["labels"]
    assert (written[COLLECTIVE], written[FABRIC]) == ("hccl", "hccl.rack-7")
    assert written[NETWORK_GROUP] == "rack-7"  # the operator's label is left as it was
    requests = len(apiserver.requests)
    assert not labeler.due(labels, devices, now_s=1.0)
    assert not await labeler.apply(labels, devices, now_s=1.0)
    assert len(apiserver.requests) == requests


async def test_a_fabric_whose_group_is_gone_is_removed_at_the_resync(apiserver, kube) -> None:
    apiserver.add_node("npu-1", labels={NETWORK_GROUP: "rack-7"})
    labeler = Labeler(kube, node="npu-1", resync_s=60.0)
    devices = [dev(0, vendor="huawei", model="Ascend910B3")]
    labels = labels_of_devices(devices, base={})
    await labeler.apply(labels, devices, now_s=0.0)
    assert apiserver.nodes["npu-1"]["metadata"]["labels"][FABRIC] == "hccl.rack-7"
    apiserver.update_node("npu-1", lambda n: n["metadata"]["labels"].pop(NETWORK_GROUP))
    await labeler.apply(labels, devices, now_s=60.0)  # learns the group is gone
    await labeler.apply(labels, devices, now_s=61.0)
    written = apiserver.nodes["npu-1"]["metadata"]["labels"]
    assert FABRIC not in written and written[COLLECTIVE] == "hccl"
