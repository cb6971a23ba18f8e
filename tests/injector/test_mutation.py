"""A vendor-neutral pod becomes a runnable vendor pod: every patch is applied
with jsonpatch to the incoming object and the result checked."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import kubernetes_validate
import pytest

from hcs_bus.messages import Plan
from tests.injector.conftest import (
    Responder,
    Webhook,
    gpu_review,
    patched,
    plain_review,
    pod_of,
)

DEVICES_REF = "metadata.annotations['hcs.io/devices']"


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def field_path(var: dict[str, Any]) -> str:
    return str(var["valueFrom"]["fieldRef"]["fieldPath"])


async def test_gpu_pod_gets_affinity_scheduler_env_mounts_and_plan(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    response = await webhook.review(doc)
    assert response["allowed"] is True
    pod = patched(doc, response)
    kubernetes_validate.validate(pod, "1.30", strict=True)
    spec = pod["spec"]
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {
            "matchExpressions": [
                {"key": "hcs.io/vendor", "operator": "In", "values": ["nvidia"]},
                {"key": "hcs.io/model", "operator": "In", "values": ["A100-80G"]},
            ]
        }
    ]
    assert spec["schedulerName"] == "hcs-scheduler"
    assert spec["runtimeClassName"] == "nvidia"
    env = env_of(spec["containers"][0])
    assert field_path(env["NVIDIA_VISIBLE_DEVICES"]) == DEVICES_REF
    assert field_path(env["HCS_VRAM_QUOTA"]) == "metadata.annotations['hcs.io/vram-quota']"
    assert field_path(env["HCS_RESUME_FROM"]) == "metadata.annotations['hcs.io/resume-from']"
    p2p = field_path(env["NCCL_P2P_DISABLE"])
    assert p2p == "metadata.annotations['hcs.io/collective-p2p-disable']"
    assert env["LD_PRELOAD"]["value"] == "/usr/local/hcs/lib/libhcs_interceptor.so"
    # one container asks: the ledger lives in the pod's own /dev/shm, no volume
    assert env["HCS_SHM_PATH"]["value"] == "/dev/shm/hcs-vram.shm"
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    assert "hcs-shm" not in mounts
    assert mounts["hcs-interceptor"] == {
        "name": "hcs-interceptor",
        "mountPath": "/usr/local/hcs/lib",
        "readOnly": True,
    }
    assert "kube-api-access-7xk2p" in mounts  # the user's mount kept
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["hcs-interceptor"]["hostPath"]["path"] == "/usr/local/hcs/lib"
    note = json.loads(pod["metadata"]["annotations"]["hcs.io/plan"])
    assert (note["vendor"], note["model"], note["devices"], note["vram_mib_per_device"]) == (
        "nvidia",
        "A100-80G",
        2,
        16384,
    )
    assert pod["metadata"]["annotations"]["hcs.io/vendors"] == "nvidia,huawei"
    asked = responder.requests[0]
    assert (asked.namespace, asked.pod_name) == ("ml-team", "trainer-7c9d6b5f4-")
    assert (asked.requests.vram_mib, asked.requests.devices) == (32768, 2)
    assert asked.policy.vendors == ("nvidia", "huawei")
    assert asked.dry_run is False


async def test_existing_node_affinity_gets_hcs_expressions_in_every_term(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    zone = {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["a"]}
    pod_of(doc)["spec"]["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [zone]},
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]},
                ]
            },
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [zone]}}
            ],
        }
    }
    pod = patched(doc, await webhook.review(doc))
    node = pod["spec"]["affinity"]["nodeAffinity"]
    terms = node["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms[0]["matchExpressions"][0] == zone
    assert [e["key"] for e in terms[0]["matchExpressions"]] == [
        "topology.kubernetes.io/zone",
        "hcs.io/vendor",
        "hcs.io/model",
    ]
    assert terms[1]["matchFields"][0]["values"] == ["n1"]
    assert [e["key"] for e in terms[1]["matchExpressions"]] == ["hcs.io/vendor", "hcs.io/model"]
    assert node["preferredDuringSchedulingIgnoredDuringExecution"][0]["weight"] == 1


async def test_user_ld_library_path_is_kept_and_ours_appended(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    container = pod_of(doc)["spec"]["containers"][0]
    container["env"] = [
        {"name": "LD_LIBRARY_PATH", "value": "/opt/app/lib"},
        {"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}},
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
        {"name": "APP_MODE", "value": "train"},
    ]
    response = await webhook.review(doc)
    env = env_of(patched(doc, response)["spec"]["containers"][0])
    paths = env["LD_LIBRARY_PATH"]["value"].split(":")
    assert paths[0] == "/opt/app/lib"
    assert "/usr/local/nvidia/lib64" in paths
    assert env["HCS_USER_LD_PRELOAD"]["valueFrom"]["configMapKeyRef"]["name"] == "c"
    assert env["LD_PRELOAD"]["value"] == (
        "$(HCS_USER_LD_PRELOAD):/usr/local/hcs/lib/libhcs_interceptor.so"
    )
    names = [e["name"] for e in patched(doc, response)["spec"]["containers"][0]["env"]]
    assert names.index("HCS_USER_LD_PRELOAD") < names.index("LD_PRELOAD")
    # a user cannot choose devices: the vendor's visible-devices env is ours
    assert field_path(env["NVIDIA_VISIBLE_DEVICES"]) == DEVICES_REF
    assert env["APP_MODE"]["value"] == "train"
    assert any("NVIDIA_VISIBLE_DEVICES" in w for w in response["warnings"])


async def test_init_containers_asking_are_patched_and_others_untouched(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    spec = pod_of(doc)["spec"]
    spec["initContainers"] = [
        {"name": "warmup", "image": "w:1", "resources": {"limits": {"ai.compute/vram": "8Gi"}}},
        {"name": "fetch", "image": "f:1"},
    ]
    spec["containers"].append({"name": "sidecar", "image": "s:1"})
    pod = patched(doc, await webhook.review(doc))
    warmup, fetch = pod["spec"]["initContainers"]
    assert field_path(env_of(warmup)["NVIDIA_VISIBLE_DEVICES"]) == DEVICES_REF
    assert {m["name"] for m in warmup["volumeMounts"]} >= {"hcs-interceptor", "hcs-shm"}
    assert fetch == {"name": "fetch", "image": "f:1"}
    assert pod["spec"]["containers"][1] == {"name": "sidecar", "image": "s:1"}
    # two containers ask: one ledger for both, in a memory emptyDir each mounts
    main = pod["spec"]["containers"][0]
    shm = {v["name"]: v for v in pod["spec"]["volumes"]}["hcs-shm"]
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Mi"}
    for asking in (warmup, main):
        assert env_of(asking)["HCS_SHM_PATH"]["value"] == "/var/run/hcs/vram.shm"
        assert {"name": "hcs-shm", "mountPath": "/var/run/hcs"} in asking["volumeMounts"]
    # effective pod demand: max(sum of containers, largest init container)
    assert responder.requests[0].requests.vram_mib == 32768


async def test_pod_without_compute_requests_passes_without_patch(
    webhook: Webhook, responder: Responder
) -> None:
    response = await webhook.review(plain_review())
    assert response == {"uid": plain_review()["request"]["uid"], "allowed": True}
    assert responder.requests == []


async def test_reinvocation_is_not_planned_twice_and_adds_nothing(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    first = await webhook.review(doc)
    doc["request"]["object"] = patched(doc, first)
    second = await webhook.review(doc)
    assert second["allowed"] is True
    assert "patch" not in second
    assert len(responder.requests) == 1


async def test_reinvocation_after_another_webhook_dropped_our_env_restores_only_it(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    container = pod["spec"]["containers"][0]
    container["env"] = [e for e in container["env"] if e["name"] != "LD_PRELOAD"]
    doc["request"]["object"] = pod
    response = await webhook.review(doc)
    again = patched(doc, response)
    assert env_of(again["spec"]["containers"][0])["LD_PRELOAD"]["value"].endswith(
        "libhcs_interceptor.so"
    )
    assert len(responder.requests) == 1


async def test_plan_note_with_a_forged_signature_is_refused(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    pod["metadata"]["annotations"]["hcs.io/plan-sig"] = "forged"
    doc["request"]["object"] = pod
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "hcs.io/plan" in response["status"]["message"]


async def test_dry_run_asks_for_a_dry_run_plan_and_still_patches(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    doc["request"]["dryRun"] = True
    response = await webhook.review(doc)
    assert response["allowed"] is True and response["patch"]
    assert responder.requests[0].dry_run is True


async def test_huawei_plan_mounts_only_what_the_ascend_runtime_leaves_out_read_only(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = Plan(
        ok=True, vendor="huawei", model="Ascend910B2", devices=1, vram_mib_per_device=65536
    )
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    container = pod["spec"]["containers"][0]
    env = env_of(container)
    assert field_path(env["ASCEND_VISIBLE_DEVICES"]) == DEVICES_REF
    assert env["HCCL_CONNECT_TIMEOUT"]["value"] == "1800"
    assert "/usr/local/Ascend/driver/lib64" in env["LD_LIBRARY_PATH"]["value"]
    # the Ascend Docker Runtime mounts driver lib64, dcmi and npu-smi itself:
    # only the two files its default list leaves out are hostPath volumes
    mounted = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert "/usr/local/Ascend/driver" not in mounted and "/usr/local/dcmi" not in mounted
    info = mounted["/etc/ascend_install.info"]
    assert info["readOnly"] is True and mounted["/usr/local/Ascend/driver/version.info"]["readOnly"]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[info["name"]]["hostPath"] == {"path": "/etc/ascend_install.info", "type": "File"}
    assert pod["spec"]["runtimeClassName"] == "ascend"


async def test_runtime_rebinding_swaps_image_and_copies_code_in_an_init_container(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod_of(doc)["metadata"]["annotations"].update(
        {"hcs.io/rebind": "runtime", "hcs.io/code-path": "/app"}
    )
    pod = patched(doc, await webhook.review(doc))
    main = pod["spec"]["containers"][0]
    assert main["image"] == "nvcr.io/nvidia/pytorch:24.05-py3"
    assert main["command"] == ["python", "-m", "trainer.main"]
    copy_init = pod["spec"]["initContainers"][-1]
    assert copy_init["image"] == "registry.example.com/ml/trainer:2.4.1"
    assert {"name": "HCS_CODE_PATH", "value": "/app"} in copy_init["env"]
    assert {"name": "hcs-code-0", "mountPath": "/app"} in main["volumeMounts"]
    assert {"name": "hcs-code-0", "emptyDir": {}} in pod["spec"]["volumes"]
    kubernetes_validate.validate(pod, "1.30", strict=True)
    # vendor policy narrowed to vendors that have a runtime image
    assert set(responder.requests[0].policy.vendors) == {"nvidia", "huawei"}


async def test_engine_rebinding_uses_the_vendor_build_of_the_engine(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = Plan(
        ok=True, vendor="hygon", model="K100", devices=4, vram_mib_per_device=65536
    )
    doc = gpu_review()
    pod_of(doc)["metadata"]["annotations"] = {
        "hcs.io/engine": "llm",
        "hcs.io/engine-model-path": "/models/qwen",
    }
    pod = patched(doc, await webhook.review(doc))
    main = pod["spec"]["containers"][0]
    assert main["command"] == ["python", "-m", "vllm.entrypoints.openai.api_server"]
    assert main["args"][:4] == ["--model", "/models/qwen", "--tensor-parallel-size", "4"]
    assert "vllm" in main["image"]
    assert responder.requests[0].policy.vendors == ("huawei", "hygon", "nvidia")


@pytest.mark.parametrize(
    ("annotations", "named"),
    [
        ({"hcs.io/engine": "nope"}, "unknown engine 'nope'"),
        ({"hcs.io/rebind": "runtim"}, "unknown value 'runtim'"),
        ({"hcs.io/vendors": "cambricon", "hcs.io/engine": "llm"}, "no vendor both allowed"),
        ({"hcs.io/substitution": "maybe"}, "hcs.io/substitution"),
    ],
)
async def test_bad_opt_in_annotations_are_refused_by_name(
    webhook: Webhook, responder: Responder, annotations: dict[str, str], named: str
) -> None:
    doc = gpu_review()
    pod_of(doc)["metadata"]["annotations"] = annotations
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert named in response["status"]["message"]
    assert responder.requests == []


async def test_plan_note_is_what_the_scheduler_bind_decodes(
    webhook: Webhook, responder: Responder
) -> None:
    pods = pytest.importorskip("scheduler.plan.pods")
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    note = pods.plan_annotation(pod["metadata"]["annotations"])
    assert (note.vendor, note.model, note.devices, note.vram_mib_per_device) == (
        "nvidia",
        "A100-80G",
        2,
        16384,
    )


async def test_absent_parents_are_added_whole_and_other_affinity_kept(
    webhook: Webhook, responder: Responder
) -> None:
    doc = gpu_review()
    pod = pod_of(doc)
    pod["metadata"].pop("annotations")
    pod["spec"].pop("volumes")
    pod["spec"]["containers"][0].pop("volumeMounts")
    anti = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {
                    "topologyKey": "kubernetes.io/hostname",
                    "labelSelector": {"matchLabels": {"a": "b"}},
                }
            ]
        }
    }
    pod["spec"]["affinity"] = anti
    result = patched(doc, await webhook.review(doc))
    kubernetes_validate.validate(result, "1.30", strict=True)
    annotations = set(result["metadata"]["annotations"]) - {"hcs.io/traceparent"}
    assert annotations == {"hcs.io/plan", "hcs.io/plan-sig"}
    assert result["spec"]["affinity"]["podAntiAffinity"] == anti["podAntiAffinity"]
    assert "nodeAffinity" in result["spec"]["affinity"]
    assert {v["name"] for v in result["spec"]["volumes"]} == {"hcs-interceptor"}
    assert "env" in result["spec"]["containers"][0]


async def test_the_plans_pledge_is_carried_signed_and_a_note_copied_to_another_pod_is_refused(
    webhook: Webhook, responder: Responder
) -> None:
    import msgspec

    responder.plan = msgspec.structs.replace(responder.plan, pledge="a1b2c3")
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    notes = pod["metadata"]["annotations"]
    assert notes["hcs.io/pledge"] == "a1b2c3"
    assert responder.requests[0].dry_run is False
    # reinvocation: the same pod with its own note and pledge is not planned again
    doc["request"]["object"] = pod
    again = await webhook.review(doc)
    assert again["allowed"] is True and len(responder.requests) == 1
    # the note, its signature and the pledge copied onto a pod of another name
    copy = gpu_review()
    copy["request"]["object"]["metadata"]["name"] = "someone-else"
    copy["request"]["object"]["metadata"].setdefault("annotations", {}).update(
        {k: notes[k] for k in ("hcs.io/plan", "hcs.io/plan-sig", "hcs.io/pledge")}
    )
    refused = await webhook.review(copy)
    assert refused["allowed"] is False
    assert "hcs.io/pledge" in refused["status"]["message"]
    assert len(responder.requests) == 1


@pytest.mark.parametrize("shape", ["hostIPC", "copied spec"])
async def test_a_pod_on_the_hosts_ipc_or_already_holding_the_ledger_volume_keeps_the_emptydir(
    webhook_factory: Callable[..., Any], responder: Responder, shape: str
) -> None:
    doc = gpu_review()
    spec = pod_of(doc)["spec"]
    if shape == "hostIPC":
        spec["hostIPC"] = True  # its /dev/shm is the host's, shared with other pods
    else:
        spec["volumes"].append({"name": "hcs-shm", "emptyDir": {"medium": "Memory"}})
    allowed = [f"{doc['request']['namespace']}/default"]  # host IPC needs the allow-list
    async with webhook_factory(privileged_service_accounts=allowed) as webhook:
        pod = patched(doc, await webhook.review(doc))
    container = pod["spec"]["containers"][0]
    assert env_of(container)["HCS_SHM_PATH"]["value"] == "/var/run/hcs/vram.shm"
    assert {"name": "hcs-shm", "mountPath": "/var/run/hcs"} in container["volumeMounts"]
    assert [v["name"] for v in pod["spec"]["volumes"]].count("hcs-shm") == 1
