"""Pods through hcs_bus.kube against the API double: eviction under a
PodDisruptionBudget (429 → retry later), Binding with annotations, lists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hcs_bus.errors import KubeConflict, KubeNotFound, KubeTooManyRequests
from hcs_bus.kube import Kube
from tests.apiserver import ApiServer

WIRE = Path(__file__).parent / "wire"
NS = "ml-team"
TRAINER = {"app": "trainer"}


def _three_trainers(apiserver: ApiServer) -> None:
    for i in range(3):
        apiserver.add_pod(NS, f"trainer-{i}", node="gpu-node-a", labels=TRAINER)


async def test_eviction_refused_by_a_pdb_is_too_many_requests_then_succeeds_once_allowed(
    apiserver: ApiServer, kube: Kube
) -> None:
    _three_trainers(apiserver)
    apiserver.add_pdb(NS, "trainer-pdb", match_labels=TRAINER, min_available=3)

    with pytest.raises(KubeTooManyRequests) as caught:
        await kube.evict_pod(NS, "trainer-0")
    assert caught.value.status == 429
    assert (NS, "trainer-0") in apiserver.pods

    apiserver.set_pdb(NS, "trainer-pdb", minAvailable=2)
    status = await kube.evict_pod(NS, "trainer-0")

    assert status["status"] == "Success"
    assert (NS, "trainer-0") not in apiserver.pods
    with pytest.raises(KubeTooManyRequests):  # the budget is spent again
        await kube.evict_pod(NS, "trainer-1")


async def test_the_429_answer_is_the_status_document_kube_apiserver_sends(
    apiserver: ApiServer, kube: Kube
) -> None:
    _three_trainers(apiserver)
    apiserver.add_pdb(NS, "trainer-pdb", match_labels=TRAINER, max_unavailable=0)

    with pytest.raises(KubeTooManyRequests) as caught:
        await kube.evict_pod(NS, "trainer-2")

    expected = json.loads((WIRE / "eviction-429-status.json").read_text())
    sent = json.loads(caught.value.__cause__.body)  # type: ignore[union-attr]
    assert sent == expected
    assert "disruption budget" in str(caught.value)


async def test_the_eviction_body_is_a_policy_v1_eviction(apiserver: ApiServer, kube: Kube) -> None:
    apiserver.add_pod(NS, "trainer-7c9d6b5f4-x2kqp", node="gpu-node-c")

    await kube.evict_pod(NS, "trainer-7c9d6b5f4-x2kqp")

    request = apiserver.requests[-1]
    wire = json.loads((WIRE / "eviction-policy-v1.json").read_text())
    assert (request.method, request.resource) == ("POST", "pods/eviction")
    assert request.path == f"/api/v1/namespaces/{NS}/pods/trainer-7c9d6b5f4-x2kqp/eviction"
    assert {k: request.body[k] for k in ("apiVersion", "kind", "metadata")} == {
        k: wire[k] for k in ("apiVersion", "kind", "metadata")
    }


async def test_a_dry_run_eviction_checks_the_budget_but_deletes_nothing(
    apiserver: ApiServer, kube: Kube
) -> None:
    _three_trainers(apiserver)
    apiserver.add_pdb(NS, "trainer-pdb", match_labels=TRAINER, min_available="50%")

    status = await kube.evict_pod(NS, "trainer-0", dry_run=True)

    assert status["code"] == 201
    assert len(apiserver.pods) == 3
    assert apiserver.requests[-1].body["deleteOptions"] == {"dryRun": ["All"]}


async def test_a_not_ready_pod_can_be_evicted_while_the_budget_is_healthy(
    apiserver: ApiServer, kube: Kube
) -> None:
    _three_trainers(apiserver)
    apiserver.add_pod(NS, "trainer-sick", labels=TRAINER, ready=False)
    apiserver.add_pdb(NS, "trainer-pdb", match_labels=TRAINER, min_available=3)

    await kube.evict_pod(NS, "trainer-sick")

    assert (NS, "trainer-sick") not in apiserver.pods


async def test_an_eviction_for_an_old_uid_leaves_a_same_named_replacement_alone(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_pod(NS, "train-0", node="n1")
    uid = apiserver.pods[(NS, "train-0")]["metadata"]["uid"]
    with pytest.raises(KubeConflict, match="Precondition failed"):
        await kube.evict_pod(NS, "train-0", uid=uid + "-old")
    assert (NS, "train-0") in apiserver.pods
    await kube.evict_pod(NS, "train-0", uid=uid)
    assert (NS, "train-0") not in apiserver.pods


async def test_evicting_a_missing_pod_is_kube_not_found(kube: Kube) -> None:
    with pytest.raises(KubeNotFound):
        await kube.evict_pod(NS, "gone")


async def test_binding_sets_the_node_and_lands_its_annotations_on_the_pod(
    apiserver: ApiServer, kube: Kube
) -> None:
    pod = apiserver.add_pod(
        NS, "trainer-7c9d6b5f4-x2kqp", annotations={"team": "ml"}, phase="Pending"
    )
    wire = json.loads((WIRE / "apiserver-pod-binding.json").read_text())

    status = await kube.bind_pod(
        NS,
        "trainer-7c9d6b5f4-x2kqp",
        uid=pod["metadata"]["uid"],
        node="gpu-node-c",
        annotations={"hcs.io/gpu-ids": "GPU-3,GPU-5"},
    )

    assert status["status"] == "Success"
    bound = await kube.get_pod(NS, "trainer-7c9d6b5f4-x2kqp")
    assert bound["spec"]["nodeName"] == "gpu-node-c"
    assert bound["metadata"]["annotations"] == {"team": "ml", "hcs.io/gpu-ids": "GPU-3,GPU-5"}
    sent = apiserver.requests[-2].body
    wire["metadata"]["uid"] = pod["metadata"]["uid"]
    assert sent == wire


async def test_binding_an_already_bound_pod_is_a_conflict(apiserver: ApiServer, kube: Kube) -> None:
    pod = apiserver.add_pod(NS, "trainer-0", node="gpu-node-a")

    with pytest.raises(KubeConflict, match="already assigned"):
        await kube.bind_pod(
            NS, "trainer-0", uid=pod["metadata"]["uid"], node="gpu-node-b", annotations={}
        )
    assert apiserver.pods[(NS, "trainer-0")]["spec"]["nodeName"] == "gpu-node-a"


async def test_binding_a_recreated_pod_with_the_old_uid_is_a_conflict(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_pod(NS, "trainer-0", phase="Pending")

    with pytest.raises(KubeConflict, match="Precondition failed"):
        await kube.bind_pod(NS, "trainer-0", uid="old-uid", node="gpu-node-b", annotations={})


async def test_list_pods_filters_by_field_and_label_selector_across_pages(
    apiserver: ApiServer, kube: Kube
) -> None:
    for i in range(1203):
        node = "gpu-node-a" if i % 2 else "gpu-node-b"
        apiserver.add_pod(NS if i % 3 else "other", f"p-{i:04d}", node=node, labels={"i": str(i)})

    on_a = await kube.list_pods(field_selector="spec.nodeName=gpu-node-a")
    in_ns = await kube.list_pods(namespace="other", label_selector="i in (0,3,4)")

    assert len(on_a) == 601
    assert {p["spec"]["nodeName"] for p in on_a} == {"gpu-node-a"}
    assert sorted(p["metadata"]["name"] for p in in_ns) == ["p-0000", "p-0003"]
    assert sum(r.verb == "list" for r in apiserver.requests) == 2 + 1  # pages of 500


async def test_proxy_variables_in_the_environment_do_not_divert_calls_to_the_api_server(
    apiserver: ApiServer, kube: Kube, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The API server is reached directly (each request used to look up proxy
    variables and ~/.netrc in a worker thread): a proxy named by the
    environment, here one that refuses every connection, is not used."""
    _three_trainers(apiserver)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    found = await kube.list_pods()
    assert sorted(p["metadata"]["name"] for p in found) == [f"trainer-{i}" for i in range(3)]


async def test_a_cached_pod_list_asks_the_api_servers_watch_cache(
    apiserver: ApiServer, kube: Kube
) -> None:
    """Scans every few seconds (stranded pods, orphan pledges) read
    ``resourceVersion=0``: the watch cache, not a quorum read of etcd."""
    _three_trainers(apiserver)
    cached = await kube.list_pods(namespace=NS, cached=True)
    fresh = await kube.list_pods(namespace=NS)
    assert len(cached) == len(fresh) == 3
    lists = [r for r in apiserver.requests if r.method == "GET" and r.path.endswith("/pods")]
    assert [r.query.get("resourceVersion") for r in lists[-2:]] == ["0", None]
