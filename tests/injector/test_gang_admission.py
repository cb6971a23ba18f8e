"""A gang member at admission: its job's size comes from the pod, the plan
request names the gang (no pledge), and the pod waits behind the
``hcs.io/gang`` scheduling gate with its gang's annotations."""

from __future__ import annotations

import json
from typing import Any

from hcs_bus import vocabulary
from hcs_bus.messages import Plan
from tests.injector.conftest import A100_PLAN, Responder, Webhook, gpu_review, patched, pod_of

JOB_UID = "4b1c3d2e-0000-4000-8000-000000000001"


def member_review(*, size: str = "4", gates: list[dict[str, str]] | None = None) -> dict[str, Any]:
    doc = gpu_review()
    pod = pod_of(doc)
    pod["metadata"]["annotations"][vocabulary.JOB_SIZE] = size
    pod["metadata"]["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "train",
            "uid": JOB_UID,
            "controller": True,
        }
    ]
    if gates is not None:
        pod["spec"]["schedulingGates"] = gates
    return doc


async def test_a_member_of_a_job_of_four_is_gated_and_planned_as_its_gang(
    webhook: Webhook, responder: Responder
) -> None:
    doc = member_review()
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    asked = responder.requests[-1]
    namespace = doc["request"]["namespace"]
    assert asked.gang_key == f"{namespace}/train/{JOB_UID}"
    assert asked.gang_size == 4
    pod = patched(doc, response)
    assert pod["spec"]["schedulingGates"] == [{"name": vocabulary.GANG_GATE}]
    notes = pod["metadata"]["annotations"]
    assert notes[vocabulary.GANG] == asked.gang_key
    assert notes[vocabulary.GANG_SIZE] == "4"
    assert vocabulary.PLEDGE not in notes
    assert json.loads(notes[vocabulary.PLAN])["model"] == "A100-80G"


async def test_a_gate_of_another_controller_is_kept_and_ours_is_added_beside_it(
    webhook: Webhook, responder: Responder
) -> None:
    doc = member_review(gates=[{"name": "kueue.x-k8s.io/admission"}])
    response = await webhook.review(doc)
    gates = [g["name"] for g in patched(doc, response)["spec"]["schedulingGates"]]
    assert gates == ["kueue.x-k8s.io/admission", vocabulary.GANG_GATE]


async def test_a_pod_of_a_job_of_one_is_no_gang(webhook: Webhook, responder: Responder) -> None:
    doc = member_review(size="1")
    response = await webhook.review(doc)
    assert response["allowed"] is True
    assert responder.requests[-1].gang_key == ""
    assert "schedulingGates" not in patched(doc, response)["spec"]


async def test_a_gang_that_can_never_fit_is_refused_naming_why(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = Plan(ok=False, reason="gang ns/train needs 64 devices; it can never fit")
    response = await webhook.review(member_review(size="32"))
    assert response["allowed"] is False
    assert 400 <= response["status"]["code"] < 500
    assert "can never fit" in response["status"]["message"]
    responder.plan = A100_PLAN


async def test_an_unreadable_job_size_is_refused_by_name(
    webhook: Webhook, responder: Responder
) -> None:
    response = await webhook.review(member_review(size="many"))
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert vocabulary.JOB_SIZE in response["status"]["message"]
    assert responder.requests == []
