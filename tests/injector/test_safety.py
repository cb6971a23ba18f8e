"""Only HCS writes hcs.io/* reserved annotations; privileged pods get no devices."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from tests.injector.conftest import (
    HCS_SA,
    Responder,
    Webhook,
    gpu_review,
    patched,
    plain_review,
    pod_of,
)
from tests.metering import counted


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


def escaped(doc: dict, plain: str, written: str) -> bytes:
    """``doc`` as JSON with every ``"plain"`` string written as ``"written"``
    (a JSON escape of the same name)."""
    text = json.dumps(doc)
    assert f'"{plain}"' in text
    return text.replace(f'"{plain}"', f'"{written}"').encode()


ESCAPES = [
    ("hcs.io/devices", "hcs.io\\u002fdevices"),
    ("hcs.io/devices", "hcs.io\\/devices"),
    ("hcs.io/devices", "\\u0068cs.io/devices"),
    ("hcs.io/plan", "hcs\\u002Eio\\u002Fplan"),
]


@pytest.mark.parametrize(("plain", "written"), ESCAPES)
@pytest.mark.parametrize("review", [gpu_review, plain_review])
async def test_a_reserved_annotation_named_with_json_escapes_is_denied_as_the_name_it_decodes_to(
    webhook: Webhook, responder: Responder, plain: str, written: str, review: Any
) -> None:
    doc = review()
    pod_of(doc)["metadata"].setdefault("annotations", {})[plain] = "0,1,2,3"
    before = counted("hcs_injector_refusals", reason="reserved_annotation")
    status, answer = await webhook.post(None, raw=escaped(doc, plain, written))
    assert status == 200, answer
    response = answer["response"]
    assert response["allowed"] is False
    assert plain in response["status"]["message"]
    assert responder.requests == []
    assert counted("hcs_injector_refusals", reason="reserved_annotation") == before + 1


@pytest.mark.parametrize(("plain", "written"), ESCAPES)
async def test_an_update_adding_an_escaped_reserved_annotation_is_denied(
    webhook: Webhook, responder: Responder, plain: str, written: str
) -> None:
    doc = plain_review()
    doc["request"]["operation"] = "UPDATE"
    doc["request"]["userInfo"]["username"] = "alice"
    doc["request"]["oldObject"] = copy.deepcopy(pod_of(doc))
    pod_of(doc)["metadata"]["annotations"] = {plain: "0,1,2,3"}
    status, answer = await webhook.post(None, raw=escaped(doc, plain, written))
    assert status == 200, answer
    assert answer["response"]["allowed"] is False
    assert plain in answer["response"]["status"]["message"]


async def test_a_resource_named_with_json_escapes_is_placed_like_its_plain_name(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod_of(doc)["metadata"]["annotations"] = {}
    text = json.dumps(doc).replace('"ai.compute/', '"ai.compute\\u002f')
    raw = text.encode()
    assert b"ai.compute/" not in raw and b"hcs.io/" not in raw
    status, answer = await webhook.post(None, raw=raw)
    assert status == 200 and answer["response"]["allowed"] is True
    assert "patch" in answer["response"] and len(responder.requests) == 1


async def test_escaped_names_patch_the_decoded_pod_once_and_a_reinvocation_keeps_its_plan(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()  # the user's hcs.io/vendors written escaped
    raw = escaped(doc, "hcs.io/vendors", "hcs.io\\u002fvendors")
    status, answer = await webhook.post(None, raw=raw)
    assert status == 200 and answer["response"]["allowed"] is True
    pod = patched(doc, answer["response"])  # the patch applies to the pod as decoded
    annotations = pod["metadata"]["annotations"]
    assert annotations["hcs.io/vendors"] == "nvidia,huawei"
    assert {"hcs.io/plan", "hcs.io/plan-sig"} <= set(annotations)
    ops = json.loads(base64.b64decode(answer["response"]["patch"]))
    paths = [op["path"] for op in ops if op["path"].startswith("/metadata/annotations/")]
    assert "/metadata/annotations/hcs.io~1plan" in paths
    assert not [p for p in paths if "vendors" in p]  # the user's key is not written again
    # the API server sends the mutated pod back (reinvocation), every name escaped
    doc["request"]["object"] = pod
    text = json.dumps(doc)
    for key in annotations:
        text = text.replace(f'"{key}"', '"' + key.replace("/", "\\u002f") + '"')
    status, again = await webhook.post(None, raw=text.encode())
    assert status == 200 and again["response"]["allowed"] is True
    assert len(responder.requests) == 1  # its own plan note is recognised: not planned again
    assert patched(doc, again["response"])["metadata"]["annotations"] == annotations
