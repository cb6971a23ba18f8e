"""RBAC is exactly what the code calls: for each service account, the Kube
methods its code calls (an AST scan for attribute calls named like a ``Kube``
method) mapped through ``hcs_bus.kube.API_CALLS`` must equal the rules of the
Roles and ClusterRoles bound to it — a new call without a rule fails, and so
does a rule nobody uses."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from hcs_bus.kube import API_CALLS
from tests.deploy.render import OVERLAYS, ROOT, by_kind, render

Triple = tuple[str, str, str]

# The code that runs under each service account.
CODE: dict[str, tuple[str, ...]] = {
    "hcs-agent": ("agents", "hcs_bus/permissions.py"),
    "hcs-scheduler": ("scheduler",),
    "hcs-injector": ("injector",),
    "hcs-healer": ("healer", "hcs_bus/leases.py"),
    "hcs-mirror": (
        "scheduler/report/computenode_loop.py",
        "scheduler/report/usage_service.py",
        "hcs_bus/leases.py",
    ),
}
EXCLUDED = {
    "hcs-scheduler": ("scheduler/report/computenode_loop.py", "scheduler/report/usage_service.py")
}


def _files(paths: tuple[str, ...], *, exclude: tuple[str, ...] = ()) -> list[Path]:
    out: list[Path] = []
    for rel in paths:
        path = ROOT / rel
        out += sorted(path.rglob("*.py")) if path.is_dir() else [path]
    return [f for f in out if str(f.relative_to(ROOT)) not in exclude]


def kube_methods_called(files: list[Path]) -> set[str]:
    called: set[str] = set()
    for file in files:
        for node in ast.walk(ast.parse(file.read_text(), filename=str(file))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in API_CALLS
            ):
                called.add(node.func.attr)
    return called


def expected_rules(account: str) -> set[Triple]:
    files = _files(CODE[account], exclude=EXCLUDED.get(account, ()))
    return {
        (call.group, call.resource, verb)
        for method in kube_methods_called(files)
        for call in API_CALLS[method]
        for verb in call.verbs
    }


def _triples(rules: list[dict[str, Any]]) -> set[Triple]:
    return {
        (group, resource, verb)
        for rule in rules or []
        for group in rule.get("apiGroups", [])
        for resource in rule.get("resources", [])
        for verb in rule.get("verbs", [])
    }


def granted_rules(objects: list[dict[str, Any]], account: str) -> set[Triple]:
    roles = {("ClusterRole", n): o for n, o in by_kind(objects, "ClusterRole").items()}
    roles |= {("Role", n): o for n, o in by_kind(objects, "Role").items()}
    granted: set[Triple] = set()
    for kind in ("ClusterRoleBinding", "RoleBinding"):
        for binding in by_kind(objects, kind).values():
            if not any(
                s.get("kind") == "ServiceAccount" and s["name"] == account
                for s in binding.get("subjects", [])
            ):
                continue
            ref = binding["roleRef"]
            granted |= _triples(roles[(ref["kind"], ref["name"])].get("rules", []))
    return granted


@pytest.mark.parametrize("overlay", OVERLAYS)
@pytest.mark.parametrize("account", sorted(CODE))
def test_each_service_account_holds_exactly_the_rules_its_code_calls(
    overlay: str, account: str
) -> None:
    objects = render(overlay)
    assert account in by_kind(objects, "ServiceAccount"), f"no ServiceAccount {account}"
    assert granted_rules(objects, account) == expected_rules(account)


def test_the_scan_sees_the_calls_that_matter() -> None:
    healer = kube_methods_called(_files(CODE["hcs-healer"]))
    assert {"evict_pod", "update_node_taints", "replace_lease"} <= healer
    assert "patch_compute_node_status" in kube_methods_called(
        _files(("scheduler/report/computenode_loop.py",))
    )


def test_every_kube_method_has_an_api_call_row() -> None:
    from hcs_bus.kube import Kube

    public = {n for n in vars(Kube) if not n.startswith("_")}
    assert public <= set(API_CALLS), f"no API_CALLS row for {sorted(public - set(API_CALLS))}"


def test_every_deployment_runs_as_its_own_service_account() -> None:
    objects = render("production")
    for kind in ("Deployment", "DaemonSet", "StatefulSet"):
        for name, obj in by_kind(objects, kind).items():
            account = obj["spec"]["template"]["spec"].get("serviceAccountName")
            if name != "hcs-nats":
                assert account == name, f"{kind} {name} runs as {account}"
