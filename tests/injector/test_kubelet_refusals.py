"""A pod the API server or the kubelet would refuse for its ai.compute/*
resources is refused by the webhook first: allowed false, a 4xx status and a
message naming the resource and the value."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import Any

import msgspec
import pytest

from hcs_bus import demands
from hcs_bus.demands import DemandError
from injector import fitting
from tests.injector.conftest import A100_PLAN, Responder, Webhook, gpu_review, pod_of

GIB = 2**30
# 8 × A100-80G as the agent advertises it: VRAM in bytes, ACU, devices
A100_NODE = {"ai.compute/vram": 8 * 80 * GIB, "ai.compute/acu": 800, "ai.compute/devices": 8}


def pod(
    *,
    limits: dict[str, str] | None = None,
    requests: dict[str, str] | None = None,
    init: dict[str, str] | None = None,
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    spec: dict[str, Any] = {"containers": [{"name": "trainer", "resources": resources}]}
    if init is not None:
        spec["initContainers"] = [
            {"name": "warmup", "resources": {"limits": init, "requests": dict(init)}}
        ]
    return {"metadata": {"name": "p"}, "spec": spec}


def both(**amounts: str) -> dict[str, Any]:
    keys = {f"ai.compute/{k.replace('_', '-')}": v for k, v in amounts.items()}
    return pod(limits=keys, requests=dict(keys))


@pytest.mark.parametrize(
    ("key", "value", "unit"),
    [
        ("ai.compute/vram", "100m", "bytes"),
        ("ai.compute/vram", "0.5", "bytes"),
        ("ai.compute/acu", "12.5", "ACU"),
        ("ai.compute/tflops-fp16", "99.9", "TFLOPS"),
        ("ai.compute/devices", "1.5", "devices"),
    ],
)
def test_an_amount_that_is_not_a_whole_number_in_the_node_unit_is_refused(
    key: str, value: str, unit: str
) -> None:
    with pytest.raises(DemandError) as caught:
        demands.read(pod(limits={key: value}, requests={key: value}))
    message = str(caught.value)
    assert f"{key}: {value!r} must be a whole number of {unit}" in message


def test_whole_numbers_in_any_suffix_pass_and_vram_is_kept_in_bytes() -> None:
    demand = demands.read(both(vram="1.5Gi", acu="50", devices="2"))
    assert demand is not None
    assert demand.amounts == {
        "ai.compute/acu": Decimal(50),
        "ai.compute/devices": Decimal(2),
        "ai.compute/vram": Decimal(3 * 2**29),
    }
    assert demand.requests.vram_mib == 1536


def test_a_request_without_a_limit_is_refused_naming_the_key() -> None:
    with pytest.raises(DemandError, match=r"ai\.compute/vram is requested \(17179869184\) without"):
        demands.read(pod(requests={"ai.compute/vram": "16Gi"}, limits={}))


def test_a_request_different_from_its_limit_is_refused_with_both_values() -> None:
    with pytest.raises(DemandError, match=r"ai\.compute/acu request 50 and limit 60 differ"):
        demands.read(pod(limits={"ai.compute/acu": "60"}, requests={"ai.compute/acu": "50"}))


def test_an_init_container_asking_for_a_key_nodes_never_advertise_is_refused() -> None:
    with pytest.raises(DemandError, match=r"init container cannot request ai\.compute/tflops-fp16"):
        demands.read(pod(limits={}, requests={}, init={"ai.compute/tflops-fp16": "100"}))
    allowed = demands.read(pod(limits={}, requests={}, init={"ai.compute/vram": "16Gi"}))
    assert allowed is not None and allowed.amounts == {"ai.compute/vram": Decimal(16 * GIB)}


def test_more_than_the_largest_node_of_the_class_advertises_is_refused_per_key() -> None:
    demand = demands.read(both(vram="700Gi", devices="9", acu="800"))
    assert demand is not None
    why = fitting.refusal(demand, node_capacity=A100_NODE, where="nvidia/A100-80G")
    assert why is not None
    assert "ai.compute/vram: the pod asks for 751619276800 bytes" in why
    assert "largest nvidia/A100-80G node advertises 687194767360 bytes" in why
    assert "ai.compute/devices: the pod asks for 9 devices" in why
    assert "OutOfai.compute/devices" in why
    assert "ai.compute/acu" not in why  # 800 fits exactly


def test_the_pod_total_counts_not_each_container() -> None:
    doc = both(devices="5")
    second = copy.deepcopy(doc["spec"]["containers"][0])
    second["name"] = "sidecar"
    doc["spec"]["containers"].append(second)
    demand = demands.read(doc)
    assert demand is not None
    why = fitting.refusal(demand, node_capacity=A100_NODE, where="nvidia/A100-80G")
    assert why is not None and "asks for 10 devices" in why


def test_a_pod_that_fits_or_a_key_the_plan_does_not_bound_passes() -> None:
    demand = demands.read(both(vram="640Gi", devices="8", tflops_fp16="5000"))
    assert demand is not None
    assert fitting.refusal(demand, node_capacity=A100_NODE, where="x") is None
    assert fitting.refusal(demand, node_capacity={}, where="x") is None


async def test_the_webhook_refuses_a_pod_bigger_than_any_node_of_the_planned_class(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = msgspec.structs.replace(A100_PLAN, node_capacity=A100_NODE)
    response = await webhook.review(gpu_review(**{"ai.compute/devices": "16"}))
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    message = response["status"]["message"]
    assert "ai.compute/devices: the pod asks for 16 devices" in message
    assert "nvidia/A100-80G node advertises 8 devices" in message
    assert len(responder.requests) == 1


async def test_the_webhook_admits_a_pod_that_fits_the_largest_node(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = msgspec.structs.replace(A100_PLAN, node_capacity=A100_NODE)
    response = await webhook.review(gpu_review())
    assert response["allowed"] is True and "patch" in response


@pytest.mark.parametrize(
    ("resources", "said"),
    [
        (
            {"limits": {"ai.compute/acu": "0.5"}, "requests": {"ai.compute/acu": "0.5"}},
            "ai.compute/acu: '0.5' must be a whole number of ACU",
        ),
        (
            {"limits": {}, "requests": {"ai.compute/vram": "16Gi"}},
            "ai.compute/vram is requested (17179869184) without a limit",
        ),
        (
            {"limits": {"ai.compute/vram": "16Gi"}, "requests": {"ai.compute/vram": "8Gi"}},
            "ai.compute/vram request 8589934592 and limit 17179869184 differ",
        ),
    ],
    ids=["fraction", "no-limit", "request-not-limit"],
)
async def test_the_webhook_refuses_what_the_api_server_would_before_asking_for_a_plan(
    webhook: Webhook, responder: Responder, resources: dict[str, Any], said: str
) -> None:
    doc = gpu_review()
    pod_of(doc)["spec"]["containers"][0]["resources"] = resources
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert said in response["status"]["message"]
    assert responder.requests == []
