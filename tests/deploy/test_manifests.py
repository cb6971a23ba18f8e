"""The rendered overlays are valid Kubernetes: built-in kinds against the
Kubernetes 1.30 OpenAPI schemas, our CRD-typed objects against our CRDs,
other CRD-typed objects structurally, and every reference resolves."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from hcs_bus import permissions
from hcs_bus.natsserver import binary
from scheduler.report.computenode_loop import node_status
from tests.deploy.render import DEPLOY, OVERLAYS, ROOT, by_kind, missing_part_kustomizations, render
from tests.deploy.test_mirroring import fingerprint, verdict

K8S_VERSION = "1.30.0"
THIRD_PARTY = {"monitoring.coreos.com/v1", "cert-manager.io/v1"}
MADE_AT_RUNTIME = {  # Secrets a Job or cert-manager makes (or the operator: the console token)
    "hcs-nats-auth",
    "hcs-nats-service-seeds",
    "hcs-webhook-tls",
    "hcs-extender-tls",
    "hcs-kube-scheduler-client-tls",
    "hcs-console-token",
}


def crd_schema(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    for crd in by_kind(objects, "CustomResourceDefinition").values():
        if crd["spec"]["names"]["kind"] == kind:
            schema: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            return schema
    raise KeyError(kind)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_built_in_object_is_valid_for_kubernetes_1_30(overlay: str) -> None:
    errors = []
    for obj in render(overlay):
        if obj["apiVersion"] in THIRD_PARTY:
            continue
        try:
            kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{obj['kind']}/{obj['metadata']['name']}: {exc.message}")
    assert errors == []


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_third_party_objects_have_their_required_fields(overlay: str) -> None:
    objects = render(f"{overlay}+monitoring")
    for monitor in by_kind(objects, "ServiceMonitor").values():
        assert monitor["spec"]["selector"]["matchLabels"] and monitor["spec"]["endpoints"]
        assert all(e["port"] for e in monitor["spec"]["endpoints"])
    workloads = [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet")]
    monitors = by_kind(objects, "PodMonitor")
    assert set(monitors) == {
        "hcs-agent",
        "hcs-healer",
        "hcs-mirror",
        "hcs-scheduler",
        "hcs-injector",
    }
    for monitor in monitors.values():
        wanted = monitor["spec"]["selector"]["matchLabels"]
        [pods] = [
            w["spec"]["template"]
            for w in workloads
            if wanted.items() <= w["spec"]["template"]["metadata"]["labels"].items()
        ]
        ports = {
            p["name"]: p["containerPort"]
            for c in pods["spec"]["containers"]
            for p in c.get("ports", [])
        }
        env = {
            e["name"]: e.get("value") for c in pods["spec"]["containers"] for e in c.get("env", [])
        }
        port = monitor["spec"]["podMetricsEndpoints"][0]["port"]
        assert str(ports[port]) == env["HCS_TELEMETRY__METRICS_PORT"]
    for cert in by_kind(objects, "Certificate").values():
        assert cert["spec"]["secretName"] and cert["spec"]["issuerRef"]["name"] in by_kind(
            objects, "Issuer"
        )
    kinds = {o["kind"] for o in objects}
    assert ("Certificate" in kinds) == (overlay == "production")


def test_production_lets_cert_manager_inject_the_ca_and_dev_runs_the_certs_job() -> None:
    prod = by_kind(render("production"), "MutatingWebhookConfiguration")["hcs-pod-mutator"]
    assert prod["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        "hcs-system/hcs-webhook"
    )
    dev = render("dev")
    webhook = by_kind(dev, "MutatingWebhookConfiguration")["hcs-pod-mutator"]
    assert "cert-manager.io/inject-ca-from" not in webhook["metadata"].get("annotations", {})
    job = by_kind(dev, "Job")["hcs-webhook-certs"]
    script = json.dumps(job["spec"]["template"]["spec"])
    assert "hcs certs --out /work --dns hcs-webhook.hcs-system.svc" in script
    assert "caBundle" in script and "hcs-webhook-tls" in script


def test_a_mirrored_status_and_a_quota_match_our_crd_schemas() -> None:
    objects = render("production")
    status = node_status(fingerprint(), verdict=verdict("gpu-node-a", "degraded", device_index=0))
    node = {
        "apiVersion": "hcs.io/v1alpha1",
        "kind": "ComputeNode",
        "metadata": {"name": "gpu-node-a"},
        "status": status,
    }
    jsonschema.validate(node, crd_schema(objects, "ComputeNode"))
    quota = {
        "apiVersion": "hcs.io/v1alpha1",
        "kind": "ComputeQuota",
        "metadata": {"name": "q", "namespace": "ml"},
        "spec": {"hard": {"vram": "640Gi", "acu": 800}},
    }
    schema = crd_schema(objects, "ComputeQuota")
    jsonschema.validate(quota, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**quota, "spec": {"hard": {"vram": "lots"}}}, schema)


def test_kubectl_get_computenodes_shows_vendor_model_devices_vram_acu_health() -> None:
    crd = by_kind(render("production"), "CustomResourceDefinition")["computenodes.hcs.io"]
    version = crd["spec"]["versions"][0]
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns[:6] == ["Vendor", "Model", "Devices", "VRAM", "ACU", "Health"]
    assert crd["spec"]["scope"] == "Cluster" and version["subresources"] == {"status": {}}
    status = node_status(fingerprint())
    for column in version["additionalPrinterColumns"][:6]:
        assert column["jsonPath"].removeprefix(".status.") in status


def _pod_specs(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for obj in objects:
        spec = obj.get("spec", {})
        if obj["kind"] == "CronJob":
            spec = spec["jobTemplate"]["spec"]
        if "template" in spec and obj["kind"] != "CustomResourceDefinition":
            out.append((f"{obj['kind']}/{obj['metadata']['name']}", spec["template"]["spec"]))
    return out


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_referenced_config_map_secret_and_account_exists(overlay: str) -> None:
    objects = render(overlay)
    config_maps, secrets = by_kind(objects, "ConfigMap"), by_kind(objects, "Secret")
    accounts = by_kind(objects, "ServiceAccount")
    for where, spec in _pod_specs(objects):
        assert spec.get("serviceAccountName", "default") in {*accounts, "default"}, where
        for volume in spec.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, where
            if "secret" in volume:
                name = volume["secret"]["secretName"]
                assert name in secrets or name in MADE_AT_RUNTIME, where
        for container in spec.get("containers", []) + spec.get("initContainers", []):
            image = container["image"]
            assert not image.startswith("hcs-") and ":" in image, f"{where}: image {image}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_service_selects_pods_and_the_webhook_and_extender_services_exist(
    overlay: str,
) -> None:
    objects = render(overlay)
    templates = [
        o["spec"]["template"]["metadata"]["labels"]
        for o in objects
        if o["kind"] in ("Deployment", "StatefulSet", "DaemonSet")
    ]
    services = by_kind(objects, "Service")
    for name, service in services.items():
        selector = service["spec"]["selector"]
        assert any(selector.items() <= labels.items() for labels in templates), name
    webhook = by_kind(objects, "MutatingWebhookConfiguration")["hcs-pod-mutator"]
    assert webhook["webhooks"][0]["clientConfig"]["service"]["name"] in services
    config = yaml.safe_load(
        by_kind(objects, "ConfigMap")["hcs-kube-scheduler-config"]["data"]["scheduler-config.yaml"]
    )
    host = re.match(r"https?://([^.:/]+)", config["extenders"][0]["urlPrefix"])
    assert host and host.group(1) in services


def test_the_grafana_dashboard_only_plots_metrics_the_code_exports() -> None:
    dashboard = json.loads((DEPLOY / "base/grafana/hcs-dashboard.json").read_text())
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    used = {re.sub(r"_(total|bucket|count|sum)$", "", m) for m in re.findall(r"hcs_[a-z_]+", exprs)}
    source = " ".join(
        p.read_text()
        for d in ("agents", "scheduler", "injector", "healer", "hcs_bus")
        for p in (ROOT / d).rglob("*.py")
    )
    exported = set(
        re.findall(r'(?:create_[a-z_]+|observe_counter|TallyCounter)\(\s*"(hcs_[a-z_]+)"', source)
    )
    assert used and used <= exported, f"not exported: {sorted(used - exported)}"
    config_map = by_kind(render("production"), "ConfigMap")["hcs-grafana-dashboard"]
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"


def test_the_nats_config_with_rendered_users_is_accepted_by_nats_server(tmp_path: Path) -> None:
    maps = by_kind(render("production"), "ConfigMap")
    conf = next(m for n, m in maps.items() if n.startswith("hcs-nats-config"))["data"]["nats.conf"]
    (tmp_path / "nats.conf").write_text(conf)
    (tmp_path / "auth").mkdir()
    names = (*permissions.SERVICES, "gpu-node-a")
    creds = {
        n: permissions.Credential(nkey=permissions.public_key(permissions.new_user_seed()))
        for n in names
    }
    auth = permissions.render_nats_conf(permissions.nats_authorization(["gpu-node-a"], creds))
    (tmp_path / "auth" / "auth.conf").write_text(auth)
    result = subprocess.run(
        [binary(), "-t", "-c", str(tmp_path / "nats.conf")],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "SERVER_NAME": "hcs-nats-0"},
    )
    assert result.returncode == 0, result.stderr


def test_nats_runs_three_servers_apart_with_jetstream_storage_and_lame_duck() -> None:
    nats = by_kind(render("production"), "StatefulSet")["hcs-nats"]
    spec = nats["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert nats["spec"]["replicas"] == 3 and nats["spec"]["volumeClaimTemplates"]
    anti = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz?js-enabled-only=true"
    assert "ldm" in " ".join(container["lifecycle"]["preStop"]["exec"]["command"])
    assert "hcs-nats" in by_kind(render("production"), "PodDisruptionBudget")


def test_the_agent_gets_host_access_but_only_the_capabilities_it_needs() -> None:
    agent = by_kind(render("production"), "DaemonSet")["hcs-agent"]["spec"]["template"]["spec"]
    container = agent["containers"][0]
    context = container["securityContext"]
    assert context["privileged"] is False and agent["hostPID"] is True
    assert set(context["capabilities"]["add"]) >= {"BPF", "PERFMON", "SYS_ADMIN"}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert {
        "/dev",
        "/sys",
        "/sys/kernel/btf",
        "/sys/fs/bpf",
        "/sys/kernel/tracing",
        "/sys/kernel/debug",
        "/dev/kmsg",
    } <= mounts
    env = {e["name"]: e.get("valueFrom") for e in container["env"]}
    assert env["HCS_AGENT__NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    init = {c["name"]: c for c in agent["initContainers"]}
    assert "libhcs_interceptor.so" in " ".join(init["install-interceptor"]["command"])
    paths = {v["hostPath"]["path"] for v in agent["volumes"] if "hostPath" in v}
    assert "/usr/local/hcs/lib" in paths
    for name in ("install-interceptor", "register-nkey"):
        assert not init[name]["securityContext"].get("capabilities", {}).get("add")


def test_the_parts_folders_are_kustomizations() -> None:
    """deploy/webhook/ and deploy/scheduler/ need a kustomization.yaml listing
    their files so deploy/base can include them (kustomize refuses loose files
    outside a kustomization's folder)."""
    assert missing_part_kustomizations() == []
