"""Failure policy within the budget, plan refusals, and bad input: 400/413, never 500."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import pytest

from hcs_bus.messages import Plan, Rejection
from tests.injector.conftest import Responder, Webhook, create_review, gpu_review, pod_of


async def test_plan_timeout_fail_closed_denies_within_the_budget(
    webhook_factory: Callable[..., Any], responder: Responder
) -> None:
    responder.delay_s = 1.0
    async with webhook_factory(plan_timeout_s=0.2) as hook:
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await hook.review(gpu_review())
        elapsed = loop.time() - started
    assert elapsed < 0.6
    assert response["allowed"] is False
    assert response["status"]["code"] == 503
    assert "did not answer within 0.2s" in response["status"]["message"]
    assert "fail-closed" in response["status"]["message"]


async def test_no_plan_service_fail_open_admits_unpatched_with_a_warning(
    webhook_factory: Callable[..., Any],
) -> None:
    async with webhook_factory(plan_timeout_s=0.2, failure_policy="fail-open") as hook:
        response = await hook.review(gpu_review())
    assert response["allowed"] is True
    assert "patch" not in response
    assert "fail-open" in response["warnings"][0]


async def test_api_server_timeout_caps_the_plan_budget(
    webhook_factory: Callable[..., Any], responder: Responder
) -> None:
    responder.delay_s = 2.0
    async with webhook_factory(plan_timeout_s=5.0) as hook:
        hook.injector.url += "?timeout=1s"
        loop = asyncio.get_running_loop()
        started = loop.time()
        response = await hook.review(gpu_review())
        assert loop.time() - started < 1.0
    assert "within 0.5s" in response["status"]["message"]


async def test_plan_refusal_is_denied_with_reason_and_rejections(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = Plan(
        ok=False,
        reason="no class has 2 free devices",
        rejected=(
            Rejection(vendor="nvidia", model="A100-80G", reason="0 nodes with 2 free"),
            Rejection(vendor="huawei", model="Ascend910B2", reason="substitution denied"),
        ),
    )
    response = await webhook.review(gpu_review())
    message = response["status"]["message"]
    assert response["allowed"] is False
    assert "no class has 2 free devices" in message
    assert "nvidia/A100-80G: 0 nodes with 2 free" in message
    assert "huawei/Ascend910B2: substitution denied" in message
    assert "(ai.compute/" in message  # names what the pod asked for


def _without_request() -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}).encode()


def _with(**top: Any) -> bytes:
    return json.dumps({**create_review(), **top}).encode()


def _non_pod() -> bytes:
    doc = create_review()
    doc["request"]["kind"] = {"group": "apps", "version": "v1", "kind": "Deployment"}
    doc["request"]["resource"] = {"group": "apps", "version": "v1", "resource": "deployments"}
    return json.dumps(doc).encode()


@pytest.mark.parametrize(
    ("body", "said"),
    [
        (b"{not json", "malformed JSON"),
        (json.dumps(create_review()).encode()[:700], "malformed JSON"),
        (b"", "malformed JSON"),
        (b"[]", "not an AdmissionReview"),
        (_with(kind="Pod"), "kind must be AdmissionReview"),
        (_with(apiVersion="admission.k8s.io/v1beta1"), "apiVersion must be admission.k8s.io/v1"),
        (_non_pod(), "only pods are handled"),
        (_without_request(), "no request"),
    ],
    ids=["malformed", "truncated", "empty", "array", "kind", "apiVersion", "non-pod", "no-request"],
)
async def test_bad_envelopes_get_400_with_a_precise_message(
    webhook: Webhook, body: bytes, said: str
) -> None:
    status, text = await webhook.post(None, raw=body)
    assert status == 400
    assert said in text


async def test_truncated_body_names_the_uid_when_readable(webhook: Webhook) -> None:
    body = json.dumps(create_review()).encode()[:700]
    status, text = await webhook.post(None, raw=body)
    assert status == 400
    assert "0b7a3c1e-4f2d-4e8a-9b6c-1d2e3f4a5b6c" in text


async def test_oversized_body_gets_413(webhook_factory: Callable[..., Any]) -> None:
    async with webhook_factory(max_body_bytes=4096) as hook:
        status, text = await hook.post(None, raw=b" " * 10_000)
    assert status == 413
    assert "max_body_bytes" in text


@pytest.mark.parametrize(
    ("limits", "named"),
    [
        (
            {"ai.compute/vrma": "16Gi"},
            "unknown resource ai.compute/vrma; did you mean ai.compute/vram?",
        ),
        ({"ai.compute/vram": "16Gx"}, "ai.compute/vram: '16Gx' is not a valid quantity"),
        ({"ai.compute/devices": "1.5"}, "whole number of devices"),
        ({"ai.compute/acu": "-5"}, "ai.compute/acu: '-5'"),
        ({"ai.compute/vram": "1e400"}, "ai.compute/vram: '1e400' is too large"),
        ({"ai.compute/devices": "1e30"}, "ai.compute/devices: '1e30' is too large"),
    ],
)
async def test_bad_compute_requests_are_refused_naming_the_key(
    webhook: Webhook, responder: Responder, limits: dict[str, str], named: str
) -> None:
    response = await webhook.review(gpu_review(**limits))
    assert response["allowed"] is False
    assert named in response["status"]["message"]
    assert "spec.containers[0] (trainer)" in response["status"]["message"]
    assert responder.requests == []


async def test_readable_review_with_a_broken_pod_is_denied_not_500(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod_of(doc)["spec"]["containers"] = "trainer"
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "spec.containers is not a list" in response["status"]["message"]


async def test_health_readiness_and_metrics_are_served(webhook: Webhook) -> None:
    await webhook.review(gpu_review())
    base = webhook.injector.url.removesuffix("/mutate")
    for path, expected in (("/healthz", "ok"), ("/readyz", "ready")):
        async with webhook.session.get(base + path) as resp:
            assert resp.status == 200 and (await resp.text()).strip() == expected
    async with webhook.session.get(base + "/metrics") as resp:
        assert "hcs_injector_admissions" in await resp.text()
