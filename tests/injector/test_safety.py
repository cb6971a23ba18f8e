"""Only HCS writes hcs.io/* reserved annotations; privileged pods get no devices."""

from __future__ import annotations

import copy

import pytest

from tests.injector.conftest import HCS_SA, Responder, Webhook, gpu_review, plain_review, pod_of


@pytest.mark.parametrize(
    "key",
    [
        "hcs.io/devices",
        "hcs.io/vram-quota",
        "hcs.io/plan",
        "hcs.io/collective-p2p-disable",
        "hcs.io/resume-from",
    ],
)
async def test_reserved_annotation_set_by_a_user_is_denied_with_its_name(
    webhook: Webhook, responder: Responder, key: str
) -> None:
    doc = gpu_review()
    pod_of(doc)["metadata"]["annotations"][key] = "0,1,2,3"
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert key in response["status"]["message"]
    assert "reserved" in response["status"]["message"]
    assert responder.requests == []


async def test_reserved_annotation_on_a_pod_without_devices_is_denied_too(
    webhook: Webhook, responder: Responder
) -> None:
    doc = plain_review()
    pod_of(doc)["metadata"]["annotations"] = {"hcs.io/devices": "0"}
    response = await webhook.review(doc)
    assert response["allowed"] is False


async def test_reserved_annotation_set_by_hcs_service_account_is_allowed(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    doc["request"]["userInfo"]["username"] = HCS_SA
    pod_of(doc)["metadata"]["annotations"]["hcs.io/resume-from"] = "s3://ckpt/step-100"
    response = await webhook.review(doc)
    assert response["allowed"] is True


def update_review(*, old_devices: str | None, new_devices: str | None, user: str) -> dict:
    doc = gpu_review()
    doc["request"]["operation"] = "UPDATE"
    doc["request"]["userInfo"]["username"] = user
    old = copy.deepcopy(pod_of(doc))
    if old_devices is not None:
        old["metadata"]["annotations"]["hcs.io/devices"] = old_devices
    if new_devices is not None:
        pod_of(doc)["metadata"]["annotations"]["hcs.io/devices"] = new_devices
    doc["request"]["oldObject"] = old
    return doc


async def test_update_changing_reserved_annotation_by_a_user_is_denied(
    webhook: Webhook, responder: Responder
) -> None:
    doc = update_review(old_devices="0", new_devices="0,1,2,3", user="alice")
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "hcs.io/devices" in response["status"]["message"]
    removed = update_review(old_devices="0", new_devices=None, user="alice")
    assert (await webhook.review(removed))["allowed"] is False


async def test_update_by_hcs_or_leaving_reserved_annotations_alone_is_allowed(
    webhook: Webhook, responder: Responder
) -> None:
    by_hcs = update_review(old_devices="0", new_devices="1", user=HCS_SA)
    assert (await webhook.review(by_hcs))["allowed"] is True
    unchanged = update_review(old_devices="0", new_devices="0", user="alice")
    pod_of(unchanged)["metadata"]["labels"]["extra"] = "yes"
    response = await webhook.review(unchanged)
    assert response["allowed"] is True and "patch" not in response
    assert responder.requests == []


async def test_privileged_container_requesting_devices_is_denied(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod_of(doc)["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "privileged" in response["status"]["message"]
    assert "trainer" in response["status"]["message"]
    assert responder.requests == []
