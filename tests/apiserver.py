"""An in-repo double of kube-apiserver for exactly the endpoints ``hcs_bus.kube``
uses, behaving as the real one does for them (docs/architecture.md#testing):

- every write bumps one global ``resourceVersion``; a write carrying a stale
  ``metadata.resourceVersion`` (PUT, or a patch that sets it) → 409 Conflict;
- PATCH by content type: JSON Patch (RFC 6902; a failing op → 422), merge
  patch (RFC 7386) and strategic merge (lists with a patchMergeKey —
  ``status.conditions`` by ``type`` — are merged, others such as
  ``spec.taints`` replaced); CRDs refuse strategic merge (415); the main
  resource ignores ``status`` and ``/status`` ignores the rest;
- ``pods/{n}/binding`` sets ``spec.nodeName`` and merges the Binding's
  annotations (409 when already bound or the UID differs), answering 201 Status;
- ``pods/{n}/eviction`` consults the namespace's PodDisruptionBudgets and
  answers 429 (shape of k8s/eviction-429-status.json) or deletes the pod
  (201 Status; ``dryRun=All`` writes nothing);
- pod annotations by merge patch and pod conditions on ``/status`` (merged by
  ``type``) as for nodes; Events created by name (409 AlreadyExists twice);
- pod and node lists with field/label selectors and ``limit``/``continue``;
  pod and node watches stream JSON lines from a ``resourceVersion`` (ERROR 410
  once compacted; BOOKMARKs with ``allowWatchBookmarks`` when asked for).

``requests`` logs every call as (method, path, verb, group, resource) with
RBAC verbs, so tests can compare against ``hcs_bus.kube.API_CALLS``.
"""

from __future__ import annotations

import asyncio
import copy
import socket
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiohttp import web

from hcs_bus.kube import Kube, connect_url
from tests.kube.handlers import Key, Request, dispatch
from tests.kube.semantics import KINDS, Obj, Problem, now

# -- the server --------------------------------------------------------------------


class ApiServer:
    """State (``nodes``, ``pods``, ``pdbs``, ``leases``, ``quotas``, ``computenodes``,
    ``events``)
    plus the ``requests`` log; ``url`` once started."""

    def __init__(self) -> None:
        self.nodes: dict[str, Obj] = {}
        self.pods: dict[tuple[str, str], Obj] = {}
        self.pdbs: dict[tuple[str, str], Obj] = {}
        self.leases: dict[tuple[str, str], Obj] = {}
        self.quotas: dict[tuple[str, str], Obj] = {}
        self.computenodes: dict[str, Obj] = {}
        self.events: dict[tuple[str, str], Obj] = {}
        self.jobs: dict[tuple[str, str], Obj] = {}
        self.deployments: dict[tuple[str, str], Obj] = {}
        self.podgroups: dict[tuple[str, str], Obj] = {}  # of any scheduler's API group
        self.version: Obj = {"major": "1", "minor": "26", "gitVersion": "v1.26.0"}
        self.requests: list[Request] = []
        self.rv = 1000
        self.url = ""
        self.history: list[tuple[int, str, Obj, Obj | None]] = []  # rv, type, obj, before
        self.floor = 0
        self.watchers: set[asyncio.Queue[tuple[int, str, Obj, Obj | None] | None]] = set()
        self.watch_open = asyncio.Event()
        self.watch_open.set()
        self._hooks: list[list[Any]] = []  # [verb, resource, times, action]
        self._runner: web.AppRunner | None = None

    # -- lifecycle --

    async def start(self) -> ApiServer:
        app = web.Application(client_max_size=8 * 2**20)
        app[SERVER] = self
        app.router.add_route("*", "/{tail:.*}", _handle)
        self._runner = web.AppRunner(app, handler_cancellation=True)
        await self._runner.setup()
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def stop(self) -> None:
        self.close_watches()
        self.watch_open.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- seeding and direct changes (these emit watch events like API writes) --

    def add_node(
        self,
        name: str,
        *,
        labels: dict[str, str] | None = None,
        taints: list[Obj] | None = None,
        capacity: dict[str, str] | None = None,
        conditions: list[Obj] | None = None,
    ) -> Obj:
        resources = {"cpu": "16", "memory": "131072Mi", "pods": "110", **(capacity or {})}
        node: Obj = {
            "metadata": {
                "name": name,
                "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            },
            "spec": {"taints": list(taints)} if taints else {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "conditions": conditions
                or [{"type": "Ready", "status": "True", "reason": "KubeletReady"}],
                "addresses": [{"type": "Hostname", "address": name}],
            },
        }
        return self.store("nodes", name, node)

    def add_pod(
        self,
        namespace: str,
        name: str,
        *,
        node: str | None = None,
        labels: dict[str, str] | None = None,
        annotations: dict[str, str] | None = None,
        phase: str = "Running",
        ready: bool = True,
        resources: Obj | None = None,
        scheduler_name: str = "default-scheduler",
        uid: str | None = None,
    ) -> Obj:
        spec: Obj = {
            "schedulerName": scheduler_name,
            "containers": [{"name": "main", "image": "busybox", "resources": resources or {}}],
        }
        if node:
            spec["nodeName"] = node
        ready_status = "True" if ready and phase == "Running" else "False"
        pod: Obj = {
            "metadata": {"name": name, "namespace": namespace, "labels": dict(labels or {})},
            "spec": spec,
            "status": {"phase": phase, "conditions": [{"type": "Ready", "status": ready_status}]},
        }
        if annotations:
            pod["metadata"]["annotations"] = dict(annotations)
        if uid:
            pod["metadata"]["uid"] = uid
        return self.store("pods", (namespace, name), pod)

    def update_node(self, name: str, mutate: Callable[[Obj], None]) -> Obj:
        node = copy.deepcopy(self.nodes[name])
        mutate(node)
        return self.store("nodes", name, node)

    def delete_node(self, name: str) -> Obj:
        return self._delete("nodes", name)

    def update_pod(self, namespace: str, name: str, mutate: Callable[[Obj], None]) -> Obj:
        pod = copy.deepcopy(self.pods[(namespace, name)])
        mutate(pod)
        return self.store("pods", (namespace, name), pod)

    def delete_pod(self, namespace: str, name: str) -> Obj:
        return self._delete("pods", (namespace, name))

    def _delete(self, resource: str, key: Key) -> Obj:
        obj = copy.deepcopy(self.table(resource).pop(key))
        self.rv += 1
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self._emit("DELETED", obj, before=obj)
        return obj

    def add_pdb(
        self,
        namespace: str,
        name: str,
        *,
        match_labels: dict[str, str],
        min_available: int | str | None = None,
        max_unavailable: int | str | None = None,
    ) -> Obj:
        spec: Obj = {"selector": {"matchLabels": dict(match_labels)}}
        if min_available is not None:
            spec["minAvailable"] = min_available
        if max_unavailable is not None:
            spec["maxUnavailable"] = max_unavailable
        pdb = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
        return self.store("poddisruptionbudgets", (namespace, name), pdb)

    def set_pdb(self, namespace: str, name: str, **spec: Any) -> Obj:
        """Change a budget's spec fields (e.g. ``minAvailable=1``)."""
        pdb = copy.deepcopy(self.pdbs[(namespace, name)])
        pdb["spec"].update(spec)
        return self.store("poddisruptionbudgets", (namespace, name), pdb)

    def add_quota(self, namespace: str, name: str, spec: Obj) -> Obj:
        quota = {"metadata": {"name": name, "namespace": namespace}, "spec": spec}
        return self.store("computequotas", (namespace, name), quota)

    # -- fault injection and outages --

    def before(
        self, verb: str, resource: str, action: Callable[[], None], *, times: int = 1
    ) -> None:
        """Run ``action`` before the next ``times`` requests (verb, resource) are served."""
        self._hooks.append([verb, resource, times, action])

    def fail(self, verb: str, resource: str, *, code: int, times: int = 1) -> None:
        """Answer the next ``times`` requests (verb, resource) with a ``code`` Status."""
        reasons = {409: "Conflict", 429: "TooManyRequests", 500: "InternalError"}
        reasons |= {503: "ServiceUnavailable", 504: "Timeout", 403: "Forbidden"}

        def refuse() -> None:
            raise Problem(code, reasons.get(code, "Unknown"), f"injected {code}")

        self._hooks.append([verb, resource, times, refuse])

    def compact(self) -> None:
        """Forget watch history: a watch from an older resourceVersion gets 410 Gone."""
        self.history.clear()
        self.floor = self.rv

    @asynccontextmanager
    async def watch_outage(self) -> AsyncIterator[None]:
        """Drop open watches and hold new ones; on exit compact history and let them in."""
        self.watch_open.clear()
        self.close_watches()
        try:
            yield
        finally:
            self.compact()
            self.watch_open.set()

    def seen(self) -> set[tuple[str, str, str]]:
        """(group, resource, verb) of every request so far."""
        return {(r.group, r.resource, r.verb) for r in self.requests}

    # -- storage --

    def table(self, resource: str) -> dict[Any, Obj]:
        tables: dict[str, dict[Any, Obj]] = {
            "nodes": self.nodes,
            "pods": self.pods,
            "poddisruptionbudgets": self.pdbs,
            "leases": self.leases,
            "computequotas": self.quotas,
            "computenodes": self.computenodes,
            "events": self.events,
            "jobs": self.jobs,
            "deployments": self.deployments,
            "podgroups": self.podgroups,
        }
        return tables[resource]

    def store(self, resource: str, key: Key, obj: Obj) -> Obj:
        """Write ``obj``: fill identity, bump resourceVersion, emit a pod or node watch event."""
        table = self.table(resource)
        before = table.get(key)
        obj = copy.deepcopy(obj)
        api_version, kind = KINDS[resource]
        obj["apiVersion"], obj["kind"] = api_version, kind
        meta = obj.setdefault("metadata", {})
        old_meta = (before or {}).get("metadata", {})
        meta["uid"] = old_meta.get("uid") or meta.get("uid") or str(uuid.uuid4())
        meta["creationTimestamp"] = old_meta.get("creationTimestamp") or now()
        self.rv += 1
        meta["resourceVersion"] = str(self.rv)
        table[key] = obj
        if resource in WATCHED:
            self._emit("MODIFIED" if before else "ADDED", obj, before=before)
        return copy.deepcopy(obj)

    def _emit(self, kind: str, obj: Obj, *, before: Obj | None) -> None:
        event = (self.rv, kind, copy.deepcopy(obj), before)
        self.history.append(event)
        for queue in self.watchers:
            queue.put_nowait(event)

    def bookmark(self) -> None:
        """Send a BOOKMARK at the current resourceVersion to every open watch
        that allowed them (as the watch cache does about once a minute)."""
        for queue in self.watchers:
            queue.put_nowait((self.rv, "BOOKMARK", {}, None))

    async def until_watched(self, count: int = 1, *, timeout_s: float = 5.0) -> None:
        """Wait until ``count`` watch streams are open."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while len(self.watchers) < count:
            assert loop.time() < deadline, f"{len(self.watchers)} watches open, want {count}"
            await asyncio.sleep(0.01)

    def close_watches(self) -> None:
        """End every open watch stream, as the server does at timeoutSeconds."""
        for queue in self.watchers:
            queue.put_nowait(None)

    def run_hooks(self, verb: str, resource: str) -> None:
        for hook in list(self._hooks):
            if hook[0] == verb and hook[1] == resource and hook[2] > 0:
                hook[2] -= 1
                if hook[2] == 0:
                    self._hooks.remove(hook)
                hook[3]()


SERVER = web.AppKey("server", ApiServer)
WATCHED = ("pods", "nodes")  # the collections whose writes reach watches


async def _handle(request: web.Request) -> web.StreamResponse:
    return await dispatch(request.app[SERVER], request)


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture
async def apiserver() -> AsyncIterator[ApiServer]:
    """A fresh API double on a free 127.0.0.1 port."""
    server = await ApiServer().start()
    yield server
    await server.stop()


@pytest.fixture
async def kube(apiserver: ApiServer) -> AsyncIterator[Kube]:
    """An ``hcs_bus.kube.Kube`` connected to the ``apiserver`` double."""
    client = await connect_url(apiserver.url)
    yield client
    await client.close()
