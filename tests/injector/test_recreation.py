"""A pod that asks for ``hcs.io/replan: recreate`` keeps a signed copy of
itself as submitted (``hcs.io/submitted``): the mutated pod cannot be turned
back into it, so the scheduler re-creates a stranded bare pod from the copy."""

from __future__ import annotations

import copy
import json
from typing import Any

from scheduler.replan import rules as replanning
from tests.injector.conftest import HCS_SA, Responder, Webhook, gpu_review, patched, pod_of

SUBMITTED = "hcs.io/submitted"


def _asking(**extra_notes: str) -> dict[str, Any]:
    """A GPU pod that asks to be re-created, with a user LD_PRELOAD and runtime class."""
    doc = gpu_review()
    pod = pod_of(doc)
    pod["metadata"]["annotations"] |= {"hcs.io/replan": "recreate", **extra_notes}
    pod["spec"]["runtimeClassName"] = "gvisor"
    pod["spec"]["containers"][0]["env"] = [{"name": "LD_PRELOAD", "value": "/opt/mine.so"}]
    return doc


def _as_submitted(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` less what the API server fills in again on create."""
    out = copy.deepcopy(spec)
    out.pop("priority")
    out.pop("volumes")  # only the service-account token volume
    out["containers"][0].pop("volumeMounts")  # only its mount
    return out


def _copy(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(pod["metadata"]["annotations"][SUBMITTED])  # type: ignore[no-any-return]


async def test_the_mutated_pod_keeps_a_copy_of_itself_as_submitted(
    webhook: Webhook, responder: Responder
) -> None:
    doc = _asking()
    submitted = copy.deepcopy(pod_of(doc))
    response = await webhook.review(doc)
    assert response["allowed"] is True
    pod = patched(doc, response)
    # what the mutation overwrote leaves no trace of the user's value ...
    assert pod["spec"]["runtimeClassName"] != "gvisor"
    (preload,) = [e for e in pod["spec"]["containers"][0]["env"] if e["name"] == "LD_PRELOAD"]
    assert preload["value"] != "/opt/mine.so"
    # ... the copy holds it
    kept = _copy(pod)
    assert kept["spec"] == _as_submitted(submitted["spec"])
    assert kept["annotations"] == {"hcs.io/vendors": "nvidia,huawei", "hcs.io/replan": "recreate"}
    assert len(pod["metadata"]["annotations"][SUBMITTED]) == len(
        json.dumps(kept, separators=(",", ":"))
    )  # compact


async def test_a_pod_that_does_not_ask_keeps_no_copy(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    assert "hcs.io/plan" in pod["metadata"]["annotations"]
    assert SUBMITTED not in pod["metadata"]["annotations"]


async def test_reinvocation_keeps_the_copy_and_adds_nothing(
    webhook: Webhook, responder: Responder
) -> None:
    doc = _asking()
    doc["request"]["object"] = patched(doc, await webhook.review(doc))
    again = await webhook.review(doc)
    assert again["allowed"] is True and "patch" not in again
    assert len(responder.requests) == 1


async def test_a_copy_changed_before_reinvocation_is_refused(
    webhook: Webhook, responder: Responder
) -> None:
    doc = _asking()
    pod = patched(doc, await webhook.review(doc))
    kept = _copy(pod)
    kept["spec"]["containers"][0]["image"] = "evil:latest"
    pod["metadata"]["annotations"][SUBMITTED] = json.dumps(kept)
    doc["request"]["object"] = pod
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert SUBMITTED in response["status"]["message"]


async def test_a_user_cannot_write_the_copy(webhook: Webhook, responder: Responder) -> None:
    doc = _asking()
    pod_of(doc)["metadata"]["annotations"][SUBMITTED] = json.dumps({"v": 1, "spec": {}})
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert SUBMITTED in response["status"]["message"]
    assert responder.requests == []


async def test_a_pod_too_large_to_keep_is_admitted_without_a_copy_and_told_so(
    webhook: Webhook, responder: Responder
) -> None:
    doc = _asking()
    pod_of(doc)["spec"]["containers"][0]["args"] = ["x" * 70_000]
    response = await webhook.review(doc)
    assert response["allowed"] is True
    assert SUBMITTED not in patched(doc, response)["metadata"]["annotations"]
    assert any("too large" in w for w in response.get("warnings", []))


async def test_the_scheduler_recreating_it_gets_a_fresh_plan_and_the_same_copy(
    webhook: Webhook, responder: Responder
) -> None:
    doc = _asking(team="vision")
    first = patched(doc, await webhook.review(doc))
    first["metadata"]["name"] = "trainer-7c9d6b5f4-x2k9q"  # named by the API server
    body = replanning.recreation(first)
    assert body is not None
    assert body["metadata"]["annotations"] == {
        "team": "vision",
        "hcs.io/vendors": "nvidia,huawei",
        "hcs.io/replan": "recreate",
    }
    again = gpu_review()
    again["request"]["userInfo"]["username"] = HCS_SA
    again["request"]["object"] = body
    second = patched(again, await webhook.review(again))
    assert len(responder.requests) == 2  # planned afresh, not from an old note
    assert _copy(second)["spec"] == _copy(first)["spec"]
    assert second["spec"]["runtimeClassName"] == first["spec"]["runtimeClassName"]
    assert second["spec"]["containers"][0]["env"] == first["spec"]["containers"][0]["env"]
