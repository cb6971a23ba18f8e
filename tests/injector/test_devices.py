"""Device nodes reach the container the way the vendor's profile says: by the
RuntimeClass's runtime from the visible-devices env, or mounted from the host
(every node of the vendor) with the env narrowing to the bound devices."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from hcs_bus.errors import ConfigError
from hcs_bus.messages import Plan
from injector import runtimes
from tests.injector.conftest import Responder, Webhook, gpu_review, patched, pod_of

DEVICES_REF = "metadata.annotations['hcs.io/devices']"
RUNTIMES = (runtimes.DATA / "runtimes.yaml").read_text()


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e for e in container.get("env", [])}


def plan(vendor: str, model: str) -> Plan:
    return Plan(ok=True, vendor=vendor, model=model, devices=2, vram_mib_per_device=16384)


async def test_a_hygon_pod_gets_every_kfd_node_and_hip_visible_devices_from_the_binding(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = plan("hygon", "K100-AI")
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    kubernetes_validate.validate(pod, "1.30", strict=True)
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "hygon"
    volumes = {v["name"]: v.get("hostPath") for v in spec["volumes"]}
    assert volumes["hcs-dev-kfd"] == {"path": "/dev/kfd", "type": "CharDevice"}
    assert volumes["hcs-dev-mkfd"] == {"path": "/dev/mkfd", "type": "CharDevice"}
    assert volumes["hcs-dev-dri"] == {"path": "/dev/dri", "type": "Directory"}
    container = spec["containers"][0]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for path in ("/dev/kfd", "/dev/mkfd", "/dev/dri"):
        assert path in mounts and not mounts[path].get("readOnly"), path
    env = env_of(container)
    assert env["HIP_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == DEVICES_REF
    assert not (container.get("securityContext") or {}).get("privileged")  # no escalation


async def test_a_cambricon_pod_gets_its_devices_from_the_runtime_not_from_mounts(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = plan("cambricon", "MLU370-X8")
    doc = gpu_review()
    pod = patched(doc, await webhook.review(doc))
    spec = pod["spec"]
    assert spec["runtimeClassName"] == "cambricon"
    env = env_of(spec["containers"][0])
    assert env["CAMBRICON_VISIBLE_DEVICES"]["valueFrom"]["fieldRef"]["fieldPath"] == DEVICES_REF
    assert "MLU_VISIBLE_DEVICES" not in env  # host indices are wrong inside: numbered from 0
    device_paths = [
        v["hostPath"]["path"]
        for v in spec["volumes"]
        if v.get("hostPath", {}).get("path", "").startswith("/dev/")
    ]
    assert device_paths == []


async def test_device_mounts_are_added_once_on_reinvocation(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = plan("hygon", "K100-AI")
    doc = gpu_review()
    doc["request"]["object"] = patched(doc, await webhook.review(doc))
    again = await webhook.review(doc)
    assert again["allowed"] is True and "patch" not in again


async def test_a_user_volume_taking_a_device_volume_name_is_refused(
    webhook: Webhook, responder: Responder
) -> None:
    responder.plan = plan("hygon", "K100-AI")
    doc = gpu_review()
    pod_of(doc)["spec"]["volumes"].append(
        {"name": "hcs-dev-kfd", "hostPath": {"path": "/dev/null"}}
    )
    response = await webhook.review(doc)
    assert response["allowed"] is False
    assert "hcs-dev-kfd" in response["status"]["message"]


@pytest.mark.parametrize(
    ("old", "new", "said"),
    [
        (
            "    visible_devices_env: [MTHREADS_VISIBLE_DEVICES]\n    devices: {via: runtime}\n",
            "    visible_devices_env: [MTHREADS_VISIBLE_DEVICES]\n",
            "devices",
        ),
        (
            "    runtime_class: mthreads             # mt-container-toolkit's RuntimeClass",
            "    runtime_class: null",
            "vendors.mthreads.devices: via runtime needs the runtime_class",
        ),
        (
            "      via: host-path\n",
            "      via: host-mount\n",
            "host-mount",
        ),
        (
            "{name: hcs-dev-kfd, path: /dev/kfd}",
            "{name: hcs-dev-kfd, path: /etc/passwd}",
            "'/etc/passwd' is not under /dev/",
        ),
        (
            "{name: hcs-dev-kfd, path: /dev/kfd}",
            "{name: kfd, path: /dev/kfd}",
            "name 'kfd' must be a DNS label hcs-",
        ),
        (
            "{name: hcs-dev-dri, path: /dev/dri, type: Directory}",
            "{name: hcs-dev-dri, path: /dev/dri, type: DirectoryOrCreate}",
            "DirectoryOrCreate",
        ),
    ],
    ids=["missing", "runtime-without-class", "unknown-way", "not-a-device", "name", "create"],
)
def test_a_device_section_that_cannot_work_is_refused_at_load(
    old: str, new: str, said: str
) -> None:
    assert old in RUNTIMES
    with pytest.raises(ConfigError) as caught:
        runtimes.parse(RUNTIMES.replace(old, new, 1))
    assert said in str(caught.value)


def test_host_path_devices_without_nodes_are_refused() -> None:
    text = RUNTIMES.replace(
        "    visible_devices_env: [CAMBRICON_VISIBLE_DEVICES]\n    devices: {via: runtime}",
        "    visible_devices_env: [CAMBRICON_VISIBLE_DEVICES]\n    devices: {via: host-path}",
    )
    with pytest.raises(ConfigError, match="via host-path needs the device nodes"):
        runtimes.parse(text)
