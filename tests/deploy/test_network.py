"""Who may reach which port, as the overlays render it: a default deny in
hcs-system, a NetworkPolicy of its own for every part that listens, every
port a part declares opened to exactly the callers it needs; and the
extender's mutual TLS wired end to end (kube-scheduler's configuration, the
Secrets each side mounts, the name the extender admits)."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from tests.deploy.render import OVERLAYS, by_kind, render

WORKLOADS = ("Deployment", "DaemonSet", "StatefulSet")
PARTS = {  # every HCS part that runs in hcs-system, by its pods' app.kubernetes.io/name
    "nats",
    "hcs-agent",
    "hcs-scheduler",
    "hcs-injector",
    "hcs-healer",
    "hcs-mirror",
    "hcs-kube-scheduler",
}
OPEN_TO_ALL = {("hcs-injector", 8443)}  # the API server's call: often host network (see policies)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions In/NotIn/Exists) against labels."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for rule in selector.get("matchExpressions", []):
        key, op, values = rule["key"], rule["operator"], rule.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def workloads(objects: list[dict[str, Any]]) -> list[tuple[str, dict[str, str], set[int]]]:
    """(name, pod labels, declared container ports) of every workload."""
    out = []
    for obj in objects:
        if obj["kind"] not in WORKLOADS:
            continue
        pod = obj["spec"]["template"]
        ports = {
            int(p["containerPort"]) for c in pod["spec"]["containers"] for p in c.get("ports", [])
        }
        out.append((obj["metadata"]["name"], pod["metadata"]["labels"], ports))
    return out


def rules_for(policies: list[dict[str, Any]], labels: dict[str, str]) -> list[dict[str, Any]]:
    """The ingress rules of every policy that selects pods with ``labels``."""
    return [
        rule
        for p in policies
        if selects(p["spec"]["podSelector"], labels)
        for rule in p["spec"].get("ingress", [])
    ]


def opened(rules: list[dict[str, Any]], port: int) -> list[dict[str, Any]]:
    """The rules that open ``port`` (a rule without ports opens them all)."""
    return [r for r in rules if "ports" not in r or any(p["port"] == port for p in r["ports"])]


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_hcs_system_denies_ingress_by_default_and_every_part_has_a_policy(overlay: str) -> None:
    objects = render(overlay)
    policies = list(by_kind(objects, "NetworkPolicy").values())
    deny = [p for p in policies if p["spec"]["podSelector"] == {}]
    assert [d["spec"] for d in deny] == [{"podSelector": {}, "policyTypes": ["Ingress"]}]
    assert all(p["metadata"]["namespace"] == "hcs-system" for p in policies)
    own = [p for p in policies if p["spec"]["podSelector"]]
    found = {labels["app.kubernetes.io/name"] for _, labels, _ in workloads(objects)}
    assert found >= PARTS
    for name, labels, ports in workloads(objects):
        mine = [p for p in own if selects(p["spec"]["podSelector"], labels)]
        assert mine or not ports, f"{name} listens on {sorted(ports)} but no policy selects it"
        assert all("Ingress" in p["spec"]["policyTypes"] for p in mine), name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_declared_port_is_open_to_its_callers_and_only_the_webhook_to_all(
    overlay: str,
) -> None:
    objects = render(overlay)
    policies = list(by_kind(objects, "NetworkPolicy").values())
    for name, labels, ports in workloads(objects):
        rules = rules_for(policies, labels)
        for port in sorted(ports):
            rules_here = opened(rules, port)
            assert rules_here, f"{name}: port {port} is declared but no policy opens it"
            to_all = any(not r.get("from") for r in rules_here)
            assert to_all == ((labels["app.kubernetes.io/name"], port) in OPEN_TO_ALL), (
                name,
                port,
            )


def _sources(objects: list[dict[str, Any]], app: str, port: int) -> list[dict[str, Any]]:
    policies = list(by_kind(objects, "NetworkPolicy").values())
    labels = {"app.kubernetes.io/name": app, "app.kubernetes.io/part-of": "hcs"}
    return [peer for r in opened(rules_for(policies, labels), port) for peer in r.get("from", [])]


def test_the_extender_takes_the_hcs_kube_scheduler_only_and_nats_hcs_and_its_sidecars() -> None:
    objects = render("production")
    assert _sources(objects, "hcs-scheduler", 8888) == [
        {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "hcs-kube-scheduler"}}}
    ]
    nats = _sources(objects, "nats", 4222)
    assert {"podSelector": {"matchLabels": {"app.kubernetes.io/part-of": "hcs"}}} in nats
    sidecars = {"matchExpressions": [{"key": "hcs.io/checkpoints", "operator": "Exists"}]}
    assert {"namespaceSelector": sidecars} in nats and len(nats) == 2
    console = _sources(objects, "hcs-scheduler", 8889)
    assert console == [{"namespaceSelector": {"matchLabels": {"hcs.io/console-access": "true"}}}]
    for app, port in (("hcs-scheduler", 9090), ("hcs-agent", 9090), ("nats", 8222)):
        assert _sources(objects, app, port) == [
            {"namespaceSelector": {"matchLabels": {"hcs.io/metrics-access": "true"}}}
        ], app


def _env(container: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _mounted(pod: dict[str, Any], container: dict[str, Any], path: str) -> str:
    """The Secret mounted at the folder holding ``path`` in ``container``."""
    folder = path.rsplit("/", 1)[0]
    [mount] = [m for m in container["volumeMounts"] if m["mountPath"] == folder]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    name: str = volume["secret"]["secretName"]
    return name


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_kube_scheduler_calls_the_extender_over_mutual_tls_with_the_secrets_each_side_mounts(
    overlay: str,
) -> None:
    objects = render(overlay)
    deployments = by_kind(objects, "Deployment")
    config = yaml.safe_load(
        by_kind(objects, "ConfigMap")["hcs-kube-scheduler-config"]["data"]["scheduler-config.yaml"]
    )
    [extender] = config["extenders"]
    assert extender["urlPrefix"].startswith("https://") and extender["enableHTTPS"] is True
    tls = extender["tlsConfig"]
    assert not tls.get("insecure") and tls["serverName"] in extender["urlPrefix"]
    ks_pod = deployments["hcs-kube-scheduler"]["spec"]["template"]["spec"]
    [ks] = ks_pod["containers"]
    client_secret = {_mounted(ks_pod, ks, tls[k]) for k in ("certFile", "keyFile", "caFile")}
    assert client_secret == {"hcs-kube-scheduler-client-tls"}
    sched_pod = deployments["hcs-scheduler"]["spec"]["template"]["spec"]
    [sched] = sched_pod["containers"]
    env = _env(sched)
    files = ("CERT_FILE", "KEY_FILE", "CLIENT_CA_FILE")
    server_secret = {_mounted(sched_pod, sched, env[f"HCS_SCHEDULER__EXTENDER_{k}"]) for k in files}
    assert server_secret == {"hcs-extender-tls"}
    assert env["HCS_SCHEDULER__EXTENDER_CLIENT_NAMES"] == "hcs-kube-scheduler"
    probes = [sched["readinessProbe"]["httpGet"], sched["livenessProbe"]["httpGet"]]
    assert all(p["scheme"] == "HTTPS" for p in probes)
    token = env["HCS_SCHEDULER__CONSOLE_TOKEN_FILE"]
    assert _mounted(sched_pod, sched, token) == "hcs-console-token"
    if overlay == "production":  # cert-manager: the client certificate names the admitted client
        certificates = by_kind(objects, "Certificate")
        client = certificates["hcs-kube-scheduler-client"]["spec"]
        assert client["secretName"] == "hcs-kube-scheduler-client-tls"
        assert client["commonName"] == "hcs-kube-scheduler" and client["usages"][0] == "client auth"
        server = certificates["hcs-extender"]["spec"]
        assert (
            server["secretName"] == "hcs-extender-tls" and tls["serverName"] in server["dnsNames"]
        )
        assert client["issuerRef"] == server["issuerRef"]  # each verifies the other with ca.crt
    else:  # the dev Job makes both Secrets from one `hcs certs` CA, and the console token
        job = json.dumps(by_kind(objects, "Job")["hcs-webhook-certs"]["spec"]["template"]["spec"])
        assert "--client hcs-kube-scheduler" in job and tls["serverName"] in job
        for secret in ("hcs-extender-tls", "hcs-kube-scheduler-client-tls", "hcs-console-token"):
            assert f"secret generic {secret}" in job, secret
