"""Vendor-neutral pods on a real control plane and real kubelets: the agent's
Node labels and capacity, the webhook, the extender's filter/prioritize/bind
(kube-scheduler calls it over mutual TLS: no one else gets a bind through),
the console behind its token, and the kubelet's own admission."""

from __future__ import annotations

import http.client
import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from bench.mixes import planned_class
from hcs_bus.certs import make_dev_certs
from hcs_bus.vocabulary import MODEL_LABEL, VENDOR_LABEL
from injector import runtimes
from tests.e2e.api import ApiError, wait_for
from tests.e2e.conftest import FLEET
from tests.e2e.stack import Stack
from tests.e2e.workloads import Workloads, expected_capacity, fleet_labelled

GI = 1024**3


def test_the_agent_labels_every_node_and_writes_capacity_the_kubelet_accepts(
    stack: Stack, work: Workloads
) -> None:
    expected = expected_capacity(FLEET)
    nodes = fleet_labelled(work, FLEET)
    for name, want in expected.items():
        labels = nodes[name]["metadata"]["labels"]
        alloc = nodes[name]["status"]["allocatable"]
        assert int(alloc["ai.compute/vram"]) == want["vram"], name
        assert int(alloc["ai.compute/devices"]) == want["devices"], name
        assert abs(int(alloc["ai.compute/acu"]) - want["acu"]) <= 0.05 * want["acu"], name
        assert labels["hcs.io/vendor"] and labels["hcs.io/model"], name


@pytest.mark.parametrize(
    "requests",
    [
        {"ai.compute/vram": "16Gi"},
        {"ai.compute/acu": "50"},
        {"ai.compute/tflops-fp16": "100"},
        {"ai.compute/devices": "2"},
    ],
    ids=["vram", "acu", "tflops-fp16", "devices"],
)
def test_a_vendor_neutral_pod_is_admitted_scheduled_bound_and_running(
    stack: Stack, work: Workloads, requests: dict[str, str]
) -> None:
    fleet_labelled(work, FLEET)
    created = work.pod("job", requests)
    assert created["spec"]["schedulerName"] == "hcs-scheduler"
    pod = work.running("job")
    annotations = pod["metadata"].get("annotations", {})
    assert annotations.get("hcs.io/devices"), annotations
    node = work.node(pod["spec"]["nodeName"])
    vendor = node["metadata"]["labels"]["hcs.io/vendor"]
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
    wanted = set(runtimes.load().vendors[vendor].visible_devices_env)  # the injector's profile
    assert wanted <= env, (vendor, wanted, env)


def test_a_pod_the_kubelet_would_refuse_is_refused_by_the_webhook_naming_the_resource(
    stack: Stack, work: Workloads
) -> None:
    fleet_labelled(work, FLEET)
    with pytest.raises(ApiError) as refused:
        work.pod("too-big", {"ai.compute/vram": "4Pi"})
    assert 400 <= refused.value.status < 500
    assert "ai.compute/vram" in str(refused.value), refused.value
    with pytest.raises(ApiError) as fractional:
        work.pod("fraction", {"ai.compute/acu": "500m"})
    assert 400 <= fractional.value.status < 500
    assert "ai.compute/acu" in str(fractional.value), fractional.value
    assert not work.pods()  # nothing was created


def test_the_hcs_kube_scheduler_authenticates_with_the_project_rbac(stack: Stack) -> None:
    scheduler = stack.cluster.scheduler
    assert scheduler is not None and scheduler.alive
    wait_for(
        lambda: "Serving securely" in scheduler.log.read_text(),
        what="kube-scheduler serving its secure port",
        timeout_s=30,
    )
    log = scheduler.log.read_text()  # the authentication config was read before serving
    # without deploy/kube-system's RoleBinding: 'configmaps "extension-apiserver-authentication"
    # is forbidden: User "system:serviceaccount:hcs-system:hcs-kube-scheduler" cannot get ...'
    # (an Event refused in a namespace being deleted is no RBAC refusal: no "cannot")
    refused = [ln for ln in log.splitlines() if "forbidden" in ln.lower() and "cannot" in ln]
    assert not refused, refused[:5]


@pytest.mark.parametrize("vendor", ["nvidia", "huawei", "hygon", "cambricon"])
def test_a_pod_of_every_vendor_runs_with_its_runtime_and_device_nodes(
    stack: Stack, work: Workloads, vendor: str
) -> None:
    fleet_labelled(work, FLEET)
    work.pod("per-vendor", {"ai.compute/devices": "1"}, annotations={"hcs.io/vendors": vendor})
    pod = work.running("per-vendor")
    node = work.node(pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["hcs.io/vendor"] == vendor
    profile = runtimes.load().vendors[vendor]
    assert pod["spec"].get("runtimeClassName") == profile.runtime_class
    env = {e["name"] for e in pod["spec"]["containers"][0].get("env", [])}
    assert set(profile.visible_devices_env) <= env


def test_a_cordoned_class_draws_no_plan_and_the_pod_runs_where_there_is_room(
    stack: Stack, work: Workloads
) -> None:
    nodes = fleet_labelled(work, FLEET)
    requests = {"ai.compute/vram": "16Gi"}
    first = wait_for(  # the scheduler's view may still be replaying the fleet
        lambda: work.dry_run_class(requests), what="a dry-run plan", timeout_s=30
    )
    names = [
        name
        for name, node in nodes.items()
        if "/".join(node["metadata"]["labels"][k] for k in (VENDOR_LABEL, MODEL_LABEL)) == first
    ]
    assert names, (first, sorted(nodes))

    def cordon(on: bool) -> None:
        for name in names:
            work.api.patch(f"/api/v1/nodes/{name}", {"spec": {"unschedulable": on or None}})

    cordon(True)
    try:
        moved = wait_for(
            lambda: (c := work.dry_run_class(requests)) != first and c,
            what=f"plans leaving {first} once its nodes {names} are cordoned",
            timeout_s=30,
        )
        work.pod("job", requests)
        pod = work.running("job")
        assert pod["spec"]["nodeName"] not in names
        assert planned_class(pod) == moved
    finally:
        cordon(False)
    wait_for(
        lambda: work.dry_run_class(requests) == first,
        what=f"plans back in {first} once its nodes are uncordoned",
        timeout_s=60,
    )


def _call(
    url: str, *, context: ssl.SSLContext | None = None, body: Any = None, token: str = ""
) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as refused:
        return refused.code, refused.read().decode()


def test_only_kube_schedulers_certificate_gets_a_bind_through_and_the_console_wants_its_token(
    stack: Stack, tmp_path: Path
) -> None:
    bind = {"PodName": "p", "PodNamespace": "default", "PodUID": "u-1", "Node": "nowhere"}
    url = f"{stack.extender_url}/bind"
    status, text = _call(url, context=stack.tls_context(), body=bind)
    assert status == 401 and "client certificate" in text, text
    stranger = make_dev_certs(
        tmp_path, dns=["localhost"], ips=["127.0.0.1"], client="hcs-kube-scheduler"
    )
    assert stranger.client_cert_file and stranger.client_key_file
    forged = stack.tls_context()  # kube-scheduler's name, from a CA the extender does not trust
    forged.load_cert_chain(stranger.client_cert_file, stranger.client_key_file)
    with pytest.raises(OSError):  # ssl.SSLError, a reset, or URLError wrapping them
        _call(url, context=forged, body=bind)
    status, text = _call(url, context=stack.tls_context(as_kube_scheduler=True), body=bind)
    assert status == 200 and "Error" in json.loads(text), text  # an answer: no such pod
    with pytest.raises((OSError, http.client.HTTPException)):  # no plain HTTP beside it
        _call(url.replace("https://", "http://"), body=bind)
    console = f"http://127.0.0.1:{stack.console_ports['scheduler']}/api/overview"
    status, text = _call(console)
    assert status == 401 and "token" in json.loads(text)["error"], text
    status, text = _call(console, token=stack.console_token)
    assert status == 200 and json.loads(text)["ready"] is True, text
