"""What the overlays promise an operator: one image tag, a dry-run healer, no
hard dependency on the Prometheus operator, manifests that say which
Kubernetes they need (and the part the end-to-end tier applies valid on 1.26),
a kube-scheduler that matches the cluster and holds its upstream RBAC, an
agent that finds the vendor tools, and a scheduler configuration that is not
its own bottleneck."""

from __future__ import annotations

import tomllib
from typing import Any

import kubernetes_validate
import pytest
import yaml

from hcs_bus.demands import FIELDS
from tests.deploy.render import DEPLOY, OVERLAYS, ROOT, by_kind, render, render_folder

HCS_IMAGES = "ghcr.io/hcs-project/"
OLDEST_SUPPORTED_MINOR = "1.30"
E2E_KUBERNETES = "1.26.0"  # the kube-apiserver of the end-to-end tier


def project_version() -> str:
    version: str = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    return version


def containers(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for obj in objects:
        spec = obj.get("spec") or {}
        if obj["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        pod = (spec.get("template") or {}).get("spec") or {}
        for c in pod.get("initContainers", []) + pod.get("containers", []):
            out.append((f"{obj['kind']}/{obj['metadata']['name']}/{c['name']}", c))
    return out


def env_of(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_hcs_image_in_every_overlay_is_tagged_with_the_project_version(
    overlay: str,
) -> None:
    version = project_version()
    images = [(where, c["image"]) for where, c in containers(render(overlay))]
    ours = [(where, image) for where, image in images if image.startswith(HCS_IMAGES)]
    assert len(ours) >= 5, images  # agent, scheduler, injector, healer, mirror at least
    wrong = [(where, image) for where, image in ours if image.rpartition(":")[2] != version]
    assert wrong == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_overlay_starts_the_healer_in_dry_run(overlay: str) -> None:
    healer = by_kind(render(overlay), "Deployment")["hcs-healer"]
    [container] = healer["spec"]["template"]["spec"]["containers"]
    assert env_of(container)["HCS_HEALER__DRY_RUN"] == "true"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_no_overlay_needs_the_prometheus_operator_unless_monitoring_is_opted_into(
    overlay: str,
) -> None:
    plain = {o["apiVersion"] for o in render(overlay)}
    assert "monitoring.coreos.com/v1" not in plain
    monitored = render(f"{overlay}+monitoring")
    kinds = {o["kind"] for o in monitored if o["apiVersion"] == "monitoring.coreos.com/v1"}
    assert kinds == {"PodMonitor"}  # every part's own metrics port
    assert all(o["metadata"]["namespace"] == "hcs-system" for o in monitored if o["kind"] in kinds)


def test_the_kube_scheduler_image_is_the_oldest_supported_minor_and_says_to_match_the_cluster() -> (
    None
):
    for overlay in OVERLAYS:
        scheduler = by_kind(render(overlay), "Deployment")["hcs-kube-scheduler"]
        [container] = scheduler["spec"]["template"]["spec"]["containers"]
        name, _, tag = container["image"].rpartition(":")
        assert name == "registry.k8s.io/kube-scheduler"
        assert tag.startswith(f"v{OLDEST_SUPPORTED_MINOR}."), tag
    source = (DEPLOY / "base/kube-scheduler/deployment.yaml").read_text()
    assert "must equal the cluster's" in source and "images:" in source


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_hcs_kube_scheduler_holds_what_a_second_kube_scheduler_needs(overlay: str) -> None:
    objects = render(overlay)
    account = {"kind": "ServiceAccount", "name": "hcs-kube-scheduler", "namespace": "hcs-system"}

    def bound(kind: str) -> set[tuple[str | None, str]]:
        return {
            (b["metadata"].get("namespace"), b["roleRef"]["name"])
            for b in objects
            if b["kind"] == kind and account in b["subjects"]
        }

    assert {r for _, r in bound("ClusterRoleBinding")} >= {
        "system:kube-scheduler",
        "system:volume-scheduler",
    }
    roles = bound("RoleBinding")
    assert ("kube-system", "extension-apiserver-authentication-reader") in roles
    lease_role = by_kind(objects, "Role")["hcs-kube-scheduler-lease"]
    assert lease_role["metadata"]["namespace"] == "hcs-system"
    assert ("hcs-system", "hcs-kube-scheduler-lease") in roles
    config = yaml.safe_load(
        by_kind(objects, "ConfigMap")["hcs-kube-scheduler-config"]["data"]["scheduler-config.yaml"]
    )
    election = config["leaderElection"]
    granted = {
        (verb, name)
        for rule in lease_role["rules"]
        for verb in rule["verbs"]
        for name in rule.get("resourceNames", ["*"])
    }
    assert election["resourceNamespace"] == "hcs-system"
    assert {
        ("create", "*"),
        ("get", election["resourceName"]),
        ("update", election["resourceName"]),
    } <= granted
    [container] = by_kind(objects, "Deployment")["hcs-kube-scheduler"]["spec"]["template"]["spec"][
        "containers"
    ]
    assert not any("authentication-skip-lookup" in arg for arg in container["command"])


def test_the_webhook_and_crds_the_e2e_tier_applies_are_valid_on_kubernetes_1_26() -> None:
    webhook = render_folder("webhook")
    assert [o["kind"] for o in webhook] == ["MutatingWebhookConfiguration"]
    files = [
        DEPLOY / "webhook/mutating-webhook-configuration.yaml",
        *sorted((DEPLOY / "base/crds").glob("*.yaml")),
    ]
    raw = [d for path in files for d in yaml.safe_load_all(path.read_text()) if d]
    errors = []
    for obj in raw + webhook:
        try:
            kubernetes_validate.validate(obj, E2E_KUBERNETES, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []
    assert all("matchConditions" not in w for o in webhook for w in o["webhooks"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_overlays_add_what_needs_kubernetes_1_30_through_one_component(overlay: str) -> None:
    objects = render(overlay)
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    assert set(policies) == {
        "hcs-reserved-annotations",
        "hcs-agent-own-node",
        "hcs-checkpoint-namespace",
    }
    assert set(by_kind(objects, "ValidatingAdmissionPolicyBinding")) == set(policies)
    webhook = by_kind(objects, "MutatingWebhookConfiguration")["hcs-pod-mutator"]
    [condition] = webhook["webhooks"][0]["matchConditions"]
    assert "ai.compute/" in condition["expression"] and "hcs.io/" in condition["expression"]
    base = render_folder("base")
    assert not {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"} & {
        o["kind"] for o in base
    }


def test_every_manifest_needing_kubernetes_1_28_or_newer_says_which_version() -> None:
    newer = {
        "ValidatingAdmissionPolicy": "1.30",
        "ValidatingAdmissionPolicyBinding": "1.30",
    }
    for path in sorted(DEPLOY.rglob("*.yaml")):
        text = path.read_text()
        kinds = {d.get("kind") for d in yaml.safe_load_all(text) if isinstance(d, dict)}
        needs = {newer[k] for k in kinds if k in newer}
        if "matchConditions" in text:
            needs.add("1.28")
        if needs:  # the newest it needs is the one it names
            version = max(needs, key=lambda v: tuple(map(int, v.split("."))))
            assert f">= {version}" in text or f"{version}+" in text, (path, version)


def test_the_agent_finds_the_vendor_tools_and_libraries_without_creating_driver_folders() -> None:
    agent = by_kind(render("production"), "DaemonSet")["hcs-agent"]["spec"]["template"]["spec"]
    container = agent["containers"][0]
    env = env_of(container)
    path = env["PATH"].split(":")
    assert path[0] == "/opt/venv/bin" and "/usr/bin" in path  # python and the image's tools
    tools = {
        "hy-smi": "/opt/hyhal/bin",
        "cnmon": "/host/usr/bin",
        "npu-smi": "/host/usr/local/sbin",
        "npu-smi (driver tools)": "/usr/local/Ascend/driver/tools",
        "rocm-smi": "/opt/rocm/bin",
        "neuware tools": "/usr/local/neuware/bin",
    }
    for tool, folder in tools.items():
        assert folder in path, tool
    libraries = env["LD_LIBRARY_PATH"].split(":")
    for folder in (
        "/usr/local/Ascend/driver/lib64",
        "/usr/local/Ascend/driver/lib64/common",
        "/usr/local/Ascend/driver/lib64/driver",
        "/opt/hyhal/lib",
        "/usr/local/neuware/lib64",
        "/opt/rocm/lib",
    ):
        assert folder in libraries, folder
    volumes = {v["name"]: v["hostPath"] for v in agent["volumes"] if "hostPath" in v}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    for folder in [*tools.values(), *libraries]:
        [(at, mount)] = [
            (at, m) for at, m in mounts.items() if folder == at or folder.startswith(at + "/")
        ]
        host = volumes[mount["name"]]
        assert mount.get("readOnly") is True, folder
        assert host["type"] in ("", "Directory"), (folder, host)
        assert host["path"] + folder[len(at) :] == folder.removeprefix("/host"), folder
    assert not [v for v in volumes.values() if v.get("type") in ("FileOrCreate", "File")]
    for name in ("nvidia-driver", "ascend-driver", "hygon-hyhal", "cambricon-neuware", "rocm"):
        assert volumes[name]["type"] == "", name


def test_the_kube_scheduler_configuration_lets_the_extender_see_every_node_and_key() -> None:
    doc = next(
        d
        for d in yaml.safe_load_all((DEPLOY / "scheduler/kube-scheduler-config.yaml").read_text())
        if d and d.get("kind") == "ConfigMap"
    )
    config = yaml.safe_load(doc["data"]["scheduler-config.yaml"])
    connection = config["clientConnection"]
    assert connection["qps"] >= 500 and connection["burst"] >= connection["qps"]
    [profile] = config["profiles"]
    assert profile["percentageOfNodesToScore"] == 100
    [extender] = config["extenders"]
    assert extender["nodeCacheCapable"] is True and extender["bindVerb"]
    managed = {r["name"]: r for r in extender["managedResources"]}
    assert set(managed) == set(FIELDS)
    assert all(r["ignoredByScheduler"] is True for r in managed.values())
