"""A pod that names its checkpoint directory gets the checkpoint sidecar from
the real webhook: every patch is applied with jsonpatch to the incoming pod
and the result validated as a Kubernetes 1.30 Pod."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes_validate

from tests.injector.conftest import (
    Responder,
    Webhook,
    gpu_review,
    patched,
    plain_review,
    pod_of,
)

JOB_UID = "5b0e7a52-8f4c-4c1e-9d0a-2f3b4c5d6e7f"


def checkpointing(doc: dict[str, Any], *, directory: str = "/ckpt/run") -> dict[str, Any]:
    """``doc``'s pod made a Job's pod that writes checkpoints under ``/ckpt``."""
    pod = pod_of(doc)
    meta = pod["metadata"]
    meta.setdefault("annotations", {})["hcs.io/checkpoint-dir"] = directory
    meta["ownerReferences"] = [
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "name": "llama",
            "uid": JOB_UID,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["volumes"].append({"name": "ckpt", "persistentVolumeClaim": {"claimName": "c"}})
    pod["spec"]["containers"][0]["volumeMounts"].append({"name": "ckpt", "mountPath": "/ckpt"})
    return doc


def sidecar_of(pod: dict[str, Any], field: str = "initContainers") -> dict[str, Any]:
    [found] = [c for c in pod["spec"].get(field, []) if c["name"] == "hcs-checkpoint"]
    return found


async def test_a_job_pod_naming_a_checkpoint_dir_gets_a_native_sidecar_reading_that_volume(
    webhook: Webhook, responder: Responder
) -> None:
    doc = checkpointing(gpu_review())
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    pod = patched(doc, response)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    sidecar = sidecar_of(pod)
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["image"] == "ghcr.io/hcs-project/hcs-healer:0.1.0"
    assert sidecar["command"] == ["python", "-m", "healer.checkpointing"]
    assert sidecar["args"] == [
        *("--dir", "/ckpt/run"),
        *("--namespace", "ml-team"),
        *("--job", "llama"),
        *("--run", JOB_UID),
    ]
    mounts = {m["name"]: m for m in sidecar["volumeMounts"]}
    assert mounts["ckpt"] == {"name": "ckpt", "mountPath": "/ckpt"}  # the request file goes here
    seed_dir = mounts["hcs-checkpoint-nats"]["mountPath"]
    assert mounts["hcs-checkpoint-nats"]["readOnly"] is True
    env = {e["name"]: e["value"] for e in sidecar["env"]}
    assert env["HCS_BUS__NKEY_SEED_FILE"] == f"{seed_dir}/seed.nk"
    assert env["HCS_BUS__URL"] == "nats://hcs-nats.hcs-system.svc:4222"
    [seed] = [v for v in pod["spec"]["volumes"] if v["name"] == "hcs-checkpoint-nats"]
    assert seed["secret"] == {
        "secretName": "hcs-checkpoint-nats",
        "items": [{"key": "seed.nk", "path": "seed.nk"}],
    }
    # the trainer itself is still patched for its devices, and keeps its own mount
    trainer = pod["spec"]["containers"][0]
    assert {"name": "ckpt", "mountPath": "/ckpt"} in trainer["volumeMounts"]
    assert any(e["name"] == "NVIDIA_VISIBLE_DEVICES" for e in trainer["env"])


async def test_with_native_sidecars_off_the_sidecar_is_a_plain_container(
    webhook_factory: Callable[..., Any], responder: Responder
) -> None:
    doc = checkpointing(gpu_review())
    async with webhook_factory(native_sidecars=False, checkpoint_image="reg/h:1") as hook:
        response = await hook.review(doc)
    pod = patched(doc, response)
    kubernetes_validate.validate(pod, "1.27", strict=True)
    sidecar = sidecar_of(pod, "containers")
    assert "restartPolicy" not in sidecar and sidecar["image"] == "reg/h:1"
    assert not [c for c in pod["spec"].get("initContainers", []) if c["name"] == "hcs-checkpoint"]


async def test_a_pod_asking_for_no_devices_gets_the_sidecar_alone(
    webhook: Webhook, responder: Responder
) -> None:
    doc = checkpointing(plain_review())
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    pod = patched(doc, response)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    assert sidecar_of(pod)["args"][-2:] == ["--run", JOB_UID]
    assert "schedulerName" not in json.dumps(response.get("warnings", []))
    assert responder.requests == []  # nothing to plan


async def test_the_sidecar_is_added_once_when_the_webhook_sees_the_pod_again(
    webhook: Webhook, responder: Responder
) -> None:
    doc = checkpointing(plain_review())
    first = await webhook.review(doc)
    pod_of(doc).update(patched(doc, first))
    again = await webhook.review(doc)
    assert again["allowed"] is True and "patch" not in again


async def test_a_checkpoint_dir_of_a_pod_of_no_job_is_refused_naming_the_job_label(
    webhook: Webhook, responder: Responder
) -> None:
    doc = checkpointing(plain_review())
    pod_of(doc)["metadata"]["ownerReferences"] = []
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "hcs.io/checkpoint-dir" in response["status"]["message"]
    assert "hcs.io/job" in response["status"]["message"]


async def test_a_checkpoint_dir_no_container_mounts_is_refused(
    webhook: Webhook, responder: Responder
) -> None:
    doc = checkpointing(plain_review(), directory="/data/ckpt")
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "/data/ckpt" in response["status"]["message"]


async def test_a_user_may_name_the_run_to_resume_from(
    webhook: Webhook, responder: Responder
) -> None:
    doc = checkpointing(gpu_review())
    pod_of(doc)["metadata"]["annotations"]["hcs.io/resume-run"] = "earlier-run-uid"
    response = await webhook.review(doc)
    assert response["allowed"] is True, response
    bad = checkpointing(gpu_review())
    pod_of(bad)["metadata"]["annotations"]["hcs.io/resume-run"] = "a.b"
    refused = await webhook.review(bad)
    assert refused["allowed"] is False
    assert "run" in refused["status"]["message"]
