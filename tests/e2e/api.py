"""A small synchronous REST client for the test cluster (fixtures, assertions
and the burst benchmark). The HCS parts themselves use ``hcs_bus.kube``; this
is the test's own eye on the real objects, so it shares nothing with them."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import yaml

T = TypeVar("T")

# kind -> (plural, namespaced)
_KINDS: dict[str, tuple[str, bool]] = {
    "Namespace": ("namespaces", False),
    "Node": ("nodes", False),
    "ServiceAccount": ("serviceaccounts", True),
    "ConfigMap": ("configmaps", True),
    "Secret": ("secrets", True),
    "Service": ("services", True),
    "Pod": ("pods", True),
    "Event": ("events", True),
    "ClusterRole": ("clusterroles", False),
    "ClusterRoleBinding": ("clusterrolebindings", False),
    "Role": ("roles", True),
    "RoleBinding": ("rolebindings", True),
    "CustomResourceDefinition": ("customresourcedefinitions", False),
    "MutatingWebhookConfiguration": ("mutatingwebhookconfigurations", False),
    "ValidatingWebhookConfiguration": ("validatingwebhookconfigurations", False),
    "RuntimeClass": ("runtimeclasses", False),
    "PriorityClass": ("priorityclasses", False),
    "Deployment": ("deployments", True),
    "ReplicaSet": ("replicasets", True),
    "StatefulSet": ("statefulsets", True),
    "Job": ("jobs", True),
    "PodDisruptionBudget": ("poddisruptionbudgets", True),
    "Lease": ("leases", True),
    "ComputeNode": ("computenodes", False),
    "ComputeQuota": ("computequotas", True),
}


class ApiError(RuntimeError):
    def __init__(self, message: str, *, status: int, body: Any) -> None:
        super().__init__(message)
        self.status = status
        self.body = body


def path_of(
    api_version: str, kind: str, *, namespace: str | None = None, name: str | None = None
) -> str:
    plural, namespaced = _KINDS[kind]
    base = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    if namespaced and namespace:
        base += f"/namespaces/{namespace}"
    base += f"/{plural}"
    if name:
        base += f"/{name}"
    return base


class Api:
    """JSON over HTTPS with a client certificate."""

    def __init__(self, server: str, *, ca_file: Path, cert_file: Path, key_file: Path) -> None:
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self._ssl = ssl.create_default_context(cafile=str(ca_file))
        self._ssl.load_cert_chain(str(cert_file), str(key_file))

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout_s: float = 30.0,
    ) -> Any:
        conn = http.client.HTTPSConnection(
            self.host, self.port, context=self._ssl, timeout=timeout_s
        )
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json"}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        finally:
            conn.close()
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = raw.decode(errors="replace")
        if resp.status >= 300:
            message = decoded.get("message") if isinstance(decoded, dict) else decoded
            raise ApiError(
                f"{method} {path}: HTTP {resp.status}: {message}", status=resp.status, body=decoded
            )
        return decoded

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)

    def patch(self, path: str, body: Any, *, kind: str = "merge") -> Any:
        types = {
            "merge": "application/merge-patch+json",
            "json": "application/json-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }
        return self.request("PATCH", path, body, content_type=types[kind])

    def items(self, path: str) -> list[dict[str, Any]]:
        return list(self.get(path).get("items") or [])

    def create(self, obj: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        ns = obj.get("metadata", {}).get("namespace") or namespace
        created: dict[str, Any] = self.post(
            path_of(obj["apiVersion"], obj["kind"], namespace=ns), obj
        )
        return created

    def apply(self, obj: dict[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
        """Create, or replace what exists (keeping its resourceVersion)."""
        try:
            return self.create(obj, namespace=namespace)
        except ApiError as exc:
            if exc.status != 409:
                raise
        meta = obj.get("metadata", {})
        ns = meta.get("namespace") or namespace
        path = path_of(obj["apiVersion"], obj["kind"], namespace=ns, name=meta["name"])
        current = self.get(path)
        body = dict(obj)
        body["metadata"] = {**meta, "resourceVersion": current["metadata"]["resourceVersion"]}
        replaced: dict[str, Any] = self.request("PUT", path, body)
        return replaced

    def apply_yaml(
        self,
        files: Iterable[Path],
        *,
        namespace: str | None = None,
        skip_kinds: Iterable[str] = (),
    ) -> int:
        """Apply every document; namespaced ones without a namespace go to ``namespace``
        (as kustomize's ``namespace:`` does for deploy/base)."""
        skip = set(skip_kinds)
        count = 0
        for file in files:
            for doc in yaml.safe_load_all(file.read_text()):
                if doc and doc.get("kind") not in skip:
                    self.apply(doc, namespace=namespace)
                    count += 1
        return count


def wait_for(
    check: Callable[[], T | None],
    *,
    what: str,
    timeout_s: float,
    explain: Callable[[], str] | None = None,
) -> T:
    """Poll ``check`` until it returns something truthy; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.05
    last: Exception | None = None
    while True:
        try:
            value = check()
            if value:
                return value
        except (ApiError, OSError) as exc:
            last = exc
        if time.monotonic() > deadline:
            detail = explain() if explain else (repr(last) if last else "")
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}. {detail}")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
