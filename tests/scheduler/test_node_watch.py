"""A replica with a cluster (the API double, real HTTP) and a real bus: Node
labels read from the Nodes place a job in one network group, a relabelled
Node is scored afresh, and the Binding carries the collective-library flags
that fit the chosen devices and the node."""

from __future__ import annotations

from typing import Any

import pytest

from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from scheduler.extender.collectives import IB_DISABLE, P2P_DISABLE
from scheduler.view import follow_loop as viewing
from tests.apiserver import ApiServer
from tests.scheduler.conftest import Start
from tests.scheduler.helpers import (
    A100_SLICE,
    dev,
    k8s_doc,
    node_fp,
    pod,
    post,
    publish_fleet,
    until,
)

NS = "ml-team"
GROUP = "hcs.io/network-group"
FABRIC = "hcs.io/rdma-fabric"


def _nvlinked(name: str, n: int) -> Any:
    """A node of n A100s, every pair joined by NVLink."""
    devices = tuple(dev(i, links={j: 300.0 for j in range(n) if j != i}) for i in range(n))
    return node_fp(name, devices=devices)


def _whole(model: str, n: int, acu: float) -> dict[str, Any]:
    return {
        "vendor": "nvidia",
        "model": model,
        "devices": n,
        "vram_mib_per_device": 0,
        "whole_device": True,
        "acu_per_device": acu,
    }


async def _bind(port: int, apiserver: ApiServer, name: str, node: str, **pod_kw: Any) -> None:
    """Create the pod in the cluster and ask the extender to bind it to ``node``."""
    body = pod(name, **pod_kw)
    apiserver.store("pods", (NS, name), body)
    args = {"PodName": name, "PodNamespace": NS, "PodUID": f"uid-{name}", "Node": node}
    status, out = await post(port, "bind", args)
    assert status == 200 and out == {"Error": ""}, out


async def _scores(port: int, names: list[str], **pod_kw: Any) -> dict[str, int]:
    args = k8s_doc("extender-filter-args-nodecache.json")
    args["Pod"] = pod("train-next", **pod_kw)
    args["NodeNames"] = names
    status, out = await post(port, "prioritize", args)
    assert status == 200, out
    return {item["Host"]: item["Score"] for item in out}


async def test_the_binding_carries_collective_flags_for_nvlinked_a100s_and_pcie_only_l40s(
    bus: Bus, start_scheduler: Start, apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("nv-node", labels={FABRIC: "ib-a"})  # the fabric only on the Node
    apiserver.add_node("pcie-node")
    await publish_fleet(bus, _nvlinked("nv-node", 8), node_fp("pcie-node", "nvidia/L40S", count=2))
    sched = await start_scheduler(bus, kube)
    await until(lambda: len(sched.view.state.nodes) == 2)

    await _bind(sched.port, apiserver, "big", "nv-node", plan=_whole("A100-80G", 4, 100.0))
    await _bind(sched.port, apiserver, "small", "pcie-node", plan=_whole("L40S", 2, 117.0))

    big = apiserver.pods[(NS, "big")]["metadata"]["annotations"]
    small = apiserver.pods[(NS, "small")]["metadata"]["annotations"]
    assert len(big["hcs.io/devices"].split(",")) == 4
    assert (big[P2P_DISABLE], big[IB_DISABLE]) == ("0", "0")
    assert len(small["hcs.io/devices"].split(",")) == 2
    assert (small[P2P_DISABLE], small[IB_DISABLE]) == ("1", "1")
    assert apiserver.pods[(NS, "big")]["spec"]["nodeName"] == "nv-node"


async def test_a_job_is_drawn_to_its_network_group_as_the_nodes_label_it(
    bus: Bus, start_scheduler: Start, apiserver: ApiServer, kube: Kube
) -> None:
    names = ["a1", "a2", "b1", "b2"]
    for name in names:  # the fingerprints say one group; the Nodes say two
        apiserver.add_node(name, labels={GROUP: f"ng-{name[0]}"})
    await publish_fleet(bus, *(node_fp(n, labels={GROUP: "ng-stale"}) for n in names))
    sched = await start_scheduler(bus, kube)
    await until(lambda: len(sched.view.state.nodes) == 4)
    job = {"plan": A100_SLICE, "labels": {"hcs.io/job": "train"}}

    await _bind(sched.port, apiserver, "train-0", "b1", **job)
    await until(lambda: sched.view.state.find_pod(f"{NS}/train-0") is not None)
    scores = await _scores(sched.port, names, **job)
    assert min(scores["b1"], scores["b2"]) > max(scores["a1"], scores["a2"]), scores

    # a2 joins the job's group on its Node: the cached score of a2 must go
    apiserver.update_node("a2", lambda n: n["metadata"]["labels"].update({GROUP: "ng-b"}))
    await until(lambda: sched.view.state.nodes["a2"].labels[GROUP] == "ng-b")
    again = await _scores(sched.port, names, **job)
    assert again["a2"] == again["b2"] > again["a1"], again

    # the label removed from the Node stops counting (the fingerprint's stale one too)
    apiserver.update_node("a2", lambda n: n["metadata"]["labels"].pop(GROUP))
    await until(lambda: GROUP not in sched.view.state.nodes["a2"].labels)
    last = await _scores(sched.port, names, **job)
    assert last["a2"] == last["a1"] < last["b2"], last


async def _filter(port: int, names: list[str], **pod_kw: Any) -> dict[str, Any]:
    args = k8s_doc("extender-filter-args-nodecache.json")
    args["Pod"] = pod("train-next", **pod_kw)
    args["NodeNames"] = names
    status, out = await post(port, "filter", args)
    assert status == 200, out
    return dict(out)


async def test_a_job_is_kept_in_its_network_group_while_a_node_there_fits(
    bus: Bus, start_scheduler: Start, apiserver: ApiServer, kube: Kube
) -> None:
    names = ["a1", "a2", "b1", "b2"]
    for name in names:
        apiserver.add_node(name, labels={GROUP: f"ng-{name[0]}"})
    await publish_fleet(bus, *(node_fp(n) for n in names))
    sched = await start_scheduler(bus, kube)
    await until(lambda: len(sched.view.state.nodes) == 4)
    job = {"plan": A100_SLICE, "labels": {"hcs.io/job": "train"}}
    first = await _filter(sched.port, names, **job)
    assert sorted(first["NodeNames"]) == names  # no member placed yet: every node

    await _bind(sched.port, apiserver, "train-0", "b1", **job)
    await until(lambda: sched.view.state.find_pod(f"{NS}/train-0") is not None)
    out = await _filter(sched.port, names, **job)
    assert sorted(out["NodeNames"]) == ["b1", "b2"], out
    assert "network group ng-b" in out["FailedNodes"]["a1"]

    # no node of the job's group among the candidates: it may spill over
    spill = await _filter(sched.port, ["a1", "a2"], **job)
    assert sorted(spill["NodeNames"]) == ["a1", "a2"], spill
    other = await _filter(sched.port, names, plan=A100_SLICE)  # not in the job
    assert sorted(other["NodeNames"]) == names


async def test_a_replica_is_ready_only_once_the_nodes_are_listed(
    bus: Bus, start_scheduler: Start, apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_node("n1", labels={FABRIC: "ib-a"})
    await publish_fleet(bus, node_fp("n1"))
    apiserver.fail("list", "nodes", code=503, times=3)  # retried with backoff first
    sched = await start_scheduler(bus, kube)  # returns once ready
    await until(lambda: "n1" in sched.view.state.nodes)
    assert sched.view.state.nodes["n1"].labels[FABRIC] == "ib-a"
    assert sum(r.verb == "list" and r.resource == "nodes" for r in apiserver.requests) == 4


async def test_a_replica_that_cannot_list_nodes_gets_ready_on_fingerprint_labels(
    bus: Bus,
    start_scheduler: Start,
    apiserver: ApiServer,
    kube: Kube,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(viewing, "SYNC_WAIT_S", 0.3)
    apiserver.add_node("n1", labels={FABRIC: "ib-node"})
    apiserver.fail("list", "nodes", code=403, times=1000)  # RBAC missing: not retried inside
    await publish_fleet(bus, node_fp("n1", labels={FABRIC: "ib-fp"}))
    sched = await start_scheduler(bus, kube)
    await until(lambda: "n1" in sched.view.state.nodes)
    assert sched.view.ready.is_set()
    assert sched.view.state.nodes["n1"].labels[FABRIC] == "ib-fp"
