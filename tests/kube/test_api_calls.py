"""API_CALLS is the RBAC source of truth: every Kube method is run against the
double (through every branch that makes a request) and the (group, resource,
verb) it sent must equal its table rows — a new call without a row fails."""

from __future__ import annotations

import asyncio
import copy
import inspect
from collections.abc import Awaitable, Callable

import pytest

from hcs_bus import kube as kube_module
from hcs_bus.kube import API_CALLS, Kube
from tests.apiserver import ApiServer

NS = "ml-team"
LEASE = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}}
Scenario = Callable[[Kube, ApiServer], Awaitable[object]]


async def _taints(k: Kube, s: ApiServer) -> object:
    return await k.update_node_taints("n", lambda ts: [*ts, {"key": "x", "effect": "NoSchedule"}])


async def _watch(k: Kube, s: ApiServer) -> object:
    """List (p and q), then see r, added afterwards, through the watch."""

    async def until_r() -> object:
        names: list[str] = []
        async for _, pod in k.watch_pods():
            names.append(pod["metadata"]["name"])
            if names == ["p", "q"]:
                s.add_pod(NS, "r")
            if names[-1] == "r":
                return names
        return names

    return await asyncio.wait_for(until_r(), 5)


async def _watch_nodes(k: Kube, s: ApiServer) -> object:
    """List (n), then see m, added afterwards, through the watch."""

    async def until_m() -> object:
        async for _, node in k.watch_nodes():
            if node["metadata"]["name"] == "n":
                s.add_node("m")
            if node["metadata"]["name"] == "m":
                return node
        return None

    return await asyncio.wait_for(until_m(), 5)


async def _quota_usage(k: Kube, s: ApiServer) -> object:
    s.add_quota(NS, "team", {"hard": {"acu": 100}})
    return await k.patch_compute_quota_usage(NS, "team", {"acuSeconds": 1.0})


async def _quota_used(k: Kube, s: ApiServer) -> object:
    s.add_quota(NS, "team", {"hard": {"vram": "64Gi"}})
    return await k.patch_compute_quota_used(NS, "team", {"vram": "32Gi", "devices": 1})


async def _quota_conditions(k: Kube, s: ApiServer) -> object:
    s.add_quota(NS, "team", {"hard": {"acu": 100}, "guaranteed": {"acu": 50}})
    condition = {"type": "GuaranteeFits", "status": "True", "reason": "Fits", "message": "ok"}
    return await k.patch_compute_quota_conditions(NS, "team", [condition])


async def _job(k: Kube, s: ApiServer) -> object:
    s.store("jobs", (NS, "train"), {"metadata": {"name": "train", "namespace": NS}})
    found = await k.get_job(NS, "train")
    assert found["metadata"]["name"] == "train" and found["kind"] == "Job"
    return found


async def _deployment(k: Kube, s: ApiServer) -> object:
    s.store("deployments", (NS, "kube-sched"), {"metadata": {"name": "kube-sched"}})
    return await k.get_deployment(NS, "kube-sched")


async def _pod_groups(k: Kube, s: ApiServer) -> object:
    s.store("podgroups", (NS, "train"), {"metadata": {"name": "train"}, "spec": {"minMember": 4}})
    found = [
        await k.get_pod_group(group, version, NS, "train")
        for group, version in (
            ("scheduling.x-k8s.io", "v1alpha1"),
            ("scheduling.volcano.sh", "v1beta1"),
            ("scheduling.run.ai", "v2alpha2"),
        )
    ]
    assert all(f["spec"]["minMember"] == 4 for f in found)
    return found


async def _pod_annotations(k: Kube, s: ApiServer) -> object:
    s.update_pod(NS, "q", lambda pod: pod["metadata"].update(annotations={"hcs.io/pledge": "p1"}))
    found = await k.list_pod_annotations(NS)
    assert found == [
        {"metadata": {"annotations": {}}},
        {"metadata": {"annotations": {"hcs.io/pledge": "p1"}}},
    ]
    return found


async def _pod_summaries(k: Kube, s: ApiServer) -> object:
    """Every pod, reduced to what the ledger's reconcile reads of it."""
    s.update_pod(NS, "q", lambda pod: pod["metadata"].update(annotations={"hcs.io/pledge": "p1"}))
    found = {p["metadata"]["name"]: p for p in await k.list_pod_summaries()}
    full = {p["metadata"]["name"]: p for p in s.pods.values()}
    assert set(found) == {"p", "q"}
    for name, pod in found.items():
        meta, was = pod["metadata"], full[name]["metadata"]
        assert (meta["namespace"], meta["uid"]) == (NS, was["uid"])
        assert meta.get("annotations") == was.get("annotations")
        assert pod["spec"].get("nodeName") == full[name]["spec"].get("nodeName")
        assert pod["status"].get("phase") == full[name]["status"].get("phase")
        assert "containers" not in pod["spec"] and "managedFields" not in meta
    return found


SCENARIOS: dict[str, Scenario] = {
    "get_node": lambda k, s: k.get_node("n"),
    "patch_node_labels": lambda k, s: k.patch_node_labels("n", {"a": "b"}),
    "patch_node_capacity": lambda k, s: k.patch_node_capacity("n", {"ai.compute/vram": 1}),
    "update_node_taints": _taints,
    "patch_node_condition": lambda k, s: k.patch_node_condition(
        "n", {"type": "HcsGpuHealthy", "status": "True"}
    ),
    "evict_pod": lambda k, s: k.evict_pod(NS, "p"),
    "bind_pod": lambda k, s: k.bind_pod(
        NS, "q", uid=s.pods[(NS, "q")]["metadata"]["uid"], node="n", annotations={}
    ),
    "get_pod": lambda k, s: k.get_pod(NS, "p"),
    "delete_pod": lambda k, s: k.delete_pod(NS, "q", uid=s.pods[(NS, "q")]["metadata"]["uid"]),
    "create_pod": lambda k, s: k.create_pod(
        NS, {"metadata": {"name": "r"}, "spec": {"containers": [{"name": "m"}]}}
    ),
    "list_pods": lambda k, s: k.list_pods(namespace=NS),
    "list_pod_annotations": _pod_annotations,
    "list_pod_summaries": _pod_summaries,
    "watch_pods": _watch,
    "patch_pod_annotations": lambda k, s: k.patch_pod_annotations(NS, "q", {"hcs.io/wake": "1"}),
    "patch_pod_condition": lambda k, s: k.patch_pod_condition(
        NS, "q", {"type": "HCSStranded", "status": "True"}
    ),
    "create_event": lambda k, s: k.create_event(NS, {"metadata": {"name": "q.1"}, "reason": "x"}),
    "watch_nodes": _watch_nodes,
    "get_lease": lambda k, s: k.get_lease(NS, "l"),
    "create_lease": lambda k, s: k.create_lease(NS, {**LEASE, "metadata": {"name": "new"}}),
    "replace_lease": lambda k, s: k.replace_lease(NS, "l", copy.deepcopy(s.leases[(NS, "l")])),
    "list_compute_quotas": lambda k, s: k.list_compute_quotas(NS),
    "patch_compute_quota_usage": _quota_usage,
    "patch_compute_quota_used": _quota_used,
    "patch_compute_node_status": lambda k, s: k.patch_compute_node_status("n", {"acu": 1}),
    "patch_compute_quota_conditions": _quota_conditions,
    "patch_pod": lambda k, s: k.patch_pod(
        NS, "q", [{"op": "add", "path": "/metadata/labels", "value": {"a": "b"}}]
    ),
    "get_job": _job,
    "get_deployment": _deployment,
    "get_pod_group": _pod_groups,
    "get_version": lambda k, s: k.get_version(),
    "close": lambda k, s: k.close(),
}


def _public_methods() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(Kube, inspect.isfunction)
        if not name.startswith("_")
    } | {
        name
        for name, member in inspect.getmembers(Kube)
        if inspect.isasyncgenfunction(member) and not name.startswith("_")
    }


def test_every_public_kube_method_has_a_table_entry_and_a_scenario() -> None:
    assert _public_methods() == set(API_CALLS) == set(SCENARIOS)


@pytest.mark.parametrize("method", sorted(API_CALLS))
async def test_the_requests_a_method_sends_are_exactly_its_api_calls_rows(
    apiserver: ApiServer, method: str
) -> None:
    apiserver.add_node("n")
    apiserver.add_pod(NS, "p", node="n")
    apiserver.add_pod(NS, "q", phase="Pending")
    apiserver.store("leases", (NS, "l"), LEASE)
    client = await kube_module.connect_url(apiserver.url)
    try:
        await SCENARIOS[method](client, apiserver)
    finally:
        await client.close()

    expected = {(c.group, c.resource, v) for c in API_CALLS[method] for v in c.verbs}
    assert apiserver.seen() == expected
