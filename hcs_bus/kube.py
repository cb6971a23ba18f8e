"""The one Kubernetes adapter (kubernetes-asyncio), handing plain JSON dicts.

Every call of every method is listed in ``API_CALLS`` (group, resource,
verbs), from which the deploy tests derive RBAC rules; a test checks the table
against what the API double saw. Errors are the ``hcs_bus.errors`` Kube*
types. Wire facts (docs/architecture.md#kubernetes-wire-facts): extended resources by JSON Patch on
``nodes/<n>/status``; taints read-modify-write with ``resourceVersion``
(strategic merge replaces the list), retried on 409; node conditions by
strategic merge on ``/status`` (merged by ``type``); Binding with annotations.
Pods and Nodes are followed by one list-then-watch (``_list_and_watch``):
resumed from the last resourceVersion, BOOKMARKs included, a new list after
410 Gone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypedDict

import aiohttp
import msgspec
from kubernetes_asyncio.client import (
    ApiClient,
    CoordinationV1Api,
    CoreV1Api,
    CustomObjectsApi,
    VersionApi,
)
from kubernetes_asyncio.client.exceptions import ApiException

from hcs_bus.errors import KubeConflict, KubeError, KubeInvalid, KubeNotFound, KubeUnavailable
from hcs_bus.kubecalls import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_MERGE_PATCH,
    call,
    configuration_for_url,
    load_configuration,
    status_error,
)
from hcs_bus.settings import KubeSettings
from hcs_bus.telemetry import logger

_log = logger("hcs.kube")

CRD_GROUP = "hcs.io"
CRD_VERSION = "v1alpha1"
TAINT_RETRIES = 5
TAINT_BACKOFF_S = 0.05  # doubled per retry, with jitter
WATCH_TIMEOUT_S = 290  # server-side timeoutSeconds; we reconnect from the last resourceVersion
WATCH_BACKOFF_MAX_S = 10.0


class _WatchEvent(msgspec.Struct):
    """One line of a watch response: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR."""

    type: str
    object: dict[str, Any]


_WATCH_EVENT = msgspec.json.Decoder(_WatchEvent)


# What the pod watch decodes of each Pod: the fields its one user, the
# scheduler's pod watch (``scheduler.ledger.release_loop.watch_pods``), reads:
# the release on a deleted or finished pod, ``PendingPods`` (through
# ``scheduler.replan.rules.pending`` and ``scheduler.plan.pods.pod_info``) and
# the list-and-watch's own bookkeeping (name, namespace, uid,
# resourceVersion). msgspec skips the rest without building it (managedFields,
# volumes, env, probes, status.conditions, containerStatuses: most of a pod's
# JSON). Every field may be null, as the API server sends some (a BOOKMARK's
# ``spec.containers``); an object that is not a Pod as typed here is decoded
# whole (``_decode_event``), so nothing the API server sends stops the watch.
class _WatchedMeta(TypedDict, total=False):
    name: str | None
    namespace: str | None
    uid: str | None
    resourceVersion: str | None
    deletionTimestamp: str | None
    labels: dict[str, str] | None
    annotations: dict[str, str] | None
    ownerReferences: list[dict[str, Any]] | None


class _WatchedContainer(TypedDict, total=False):
    name: str | None
    resources: dict[str, Any] | None


class _WatchedPreferred(TypedDict, total=False):
    preferredDuringSchedulingIgnoredDuringExecution: list[Any] | None


class _WatchedAffinity(TypedDict, total=False):
    nodeAffinity: _WatchedPreferred | None
    podAffinity: _WatchedPreferred | None
    podAntiAffinity: _WatchedPreferred | None


class _WatchedSpread(TypedDict, total=False):
    whenUnsatisfiable: str | None


class _WatchedSpec(TypedDict, total=False):
    nodeName: str | None
    schedulerName: str | None
    schedulingGates: list[dict[str, Any]] | None
    priority: int | None
    containers: list[_WatchedContainer] | None
    initContainers: list[_WatchedContainer] | None
    affinity: _WatchedAffinity | None
    topologySpreadConstraints: list[_WatchedSpread] | None


class _WatchedStatus(TypedDict, total=False):
    phase: str | None


class _WatchedPod(TypedDict, total=False):
    metadata: _WatchedMeta | None
    spec: _WatchedSpec | None
    status: _WatchedStatus | None


class _WatchedPodEvent(msgspec.Struct):
    type: str
    object: _WatchedPod


# "continue" is a keyword: the functional form
_WatchedPodListMeta = TypedDict(
    "_WatchedPodListMeta", {"resourceVersion": str | None, "continue": str | None}, total=False
)


class _WatchedPodList(TypedDict, total=False):
    items: list[_WatchedPod] | None
    metadata: _WatchedPodListMeta | None


_WATCHED_POD_EVENT = msgspec.json.Decoder(_WatchedPodEvent)
_WATCHED_POD_LIST = msgspec.json.Decoder(_WatchedPodList)
# the metadata of a list's objects only (the API server leaves the rest out)
METADATA_LIST = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class _Annotations(msgspec.Struct):
    annotations: dict[str, str] | None = None


class _Annotated(msgspec.Struct):
    metadata: _Annotations = msgspec.field(default_factory=_Annotations)


class _ListMeta(msgspec.Struct):
    continue_: str | None = msgspec.field(default=None, name="continue")


class _AnnotatedList(msgspec.Struct):
    """A list answer decoded no further than each object's annotations:
    msgspec skips the rest without building it."""

    items: list[_Annotated] | None = None
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_ANNOTATED_LIST = msgspec.json.Decoder(_AnnotatedList)


class _SummaryMeta(msgspec.Struct, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    ownerReferences: list[dict[str, Any]] | None = None
    deletionTimestamp: str | None = None


class _SummarySpec(msgspec.Struct, omit_defaults=True):
    nodeName: str | None = None
    schedulerName: str | None = None
    priority: int | None = None


class _SummaryStatus(msgspec.Struct, omit_defaults=True):
    phase: str | None = None


class _PodSummary(msgspec.Struct, omit_defaults=True):
    metadata: _SummaryMeta = msgspec.field(default_factory=_SummaryMeta)
    spec: _SummarySpec = msgspec.field(default_factory=_SummarySpec)
    status: _SummaryStatus = msgspec.field(default_factory=_SummaryStatus)


class _PodSummaryList(msgspec.Struct):
    items: list[_PodSummary] | None = None
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)


_POD_SUMMARY_LIST = msgspec.json.Decoder(_PodSummaryList)


@dataclass(frozen=True)
class ApiCall:
    """One RBAC-relevant request: API group ("" = core), resource[/subresource], verbs."""

    group: str
    resource: str
    verbs: tuple[str, ...]


_COORD = "coordination.k8s.io"
API_CALLS: dict[str, tuple[ApiCall, ...]] = {
    "get_node": (ApiCall("", "nodes", ("get",)),),
    "patch_node_labels": (ApiCall("", "nodes", ("patch",)),),
    "patch_node_capacity": (ApiCall("", "nodes/status", ("patch",)),),
    "update_node_taints": (ApiCall("", "nodes", ("get", "patch")),),
    "patch_node_condition": (ApiCall("", "nodes/status", ("patch",)),),
    "evict_pod": (ApiCall("", "pods/eviction", ("create",)),),
    "bind_pod": (ApiCall("", "pods/binding", ("create",)),),
    "get_pod": (ApiCall("", "pods", ("get",)),),
    "delete_pod": (ApiCall("", "pods", ("delete",)),),
    "create_pod": (ApiCall("", "pods", ("create",)),),
    "list_pods": (ApiCall("", "pods", ("list",)),),
    "list_pod_annotations": (ApiCall("", "pods", ("list",)),),
    "list_pod_summaries": (ApiCall("", "pods", ("list",)),),
    "watch_pods": (ApiCall("", "pods", ("list", "watch")),),
    "patch_pod_annotations": (ApiCall("", "pods", ("patch",)),),
    "patch_pod": (ApiCall("", "pods", ("patch",)),),
    "get_job": (ApiCall("batch", "jobs", ("get",)),),
    "get_deployment": (ApiCall("apps", "deployments", ("get",)),),
    "get_pod_group": (
        ApiCall("scheduling.x-k8s.io", "podgroups", ("get",)),
        ApiCall("scheduling.volcano.sh", "podgroups", ("get",)),
        ApiCall("scheduling.run.ai", "podgroups", ("get",)),
    ),
    "get_version": (),  # /version: readable by every authenticated client
    "patch_pod_condition": (ApiCall("", "pods/status", ("patch",)),),
    "create_event": (ApiCall("", "events", ("create",)),),
    "watch_nodes": (ApiCall("", "nodes", ("list", "watch")),),
    "get_lease": (ApiCall(_COORD, "leases", ("get",)),),
    "create_lease": (ApiCall(_COORD, "leases", ("create",)),),
    "replace_lease": (ApiCall(_COORD, "leases", ("update",)),),
    "list_compute_quotas": (ApiCall(CRD_GROUP, "computequotas", ("list",)),),
    "patch_compute_quota_usage": (ApiCall(CRD_GROUP, "computequotas/status", ("patch",)),),
    "patch_compute_quota_used": (ApiCall(CRD_GROUP, "computequotas/status", ("patch",)),),
    "patch_compute_quota_conditions": (ApiCall(CRD_GROUP, "computequotas/status", ("patch",)),),
    "patch_compute_node_status": (
        ApiCall(CRD_GROUP, "computenodes/status", ("patch",)),
        ApiCall(CRD_GROUP, "computenodes", ("create",)),
    ),
    "close": (),
}


async def connect(settings: KubeSettings) -> Kube | None:
    """A client for the configured cluster, or None (logged once) when there is none."""
    cfg = await load_configuration(settings)
    if cfg is None:
        _log.info("kube_not_configured", mode=settings.mode, note="no cluster configured")
        return None
    _log.info("kube_connected", host=cfg.host, mode=settings.mode)
    return Kube(ApiClient(cfg), timeout_s=settings.request_timeout_s)


async def connect_url(url: str, *, timeout_s: float = 5.0) -> Kube:
    """A client for a plain-HTTP API server without auth (tests, ``kubectl proxy``)."""
    return Kube(ApiClient(configuration_for_url(url)), timeout_s=timeout_s)


class Kube:
    """Plain-dict calls on the few Kubernetes endpoints HCS uses."""

    def __init__(self, api: ApiClient, *, timeout_s: float) -> None:
        self._api = api
        # kubernetes-asyncio opens its session with trust_env=True: every
        # request then looks up proxy variables and ~/.netrc in a worker
        # thread (bench.burst: 7 % of the scheduler's CPU). The API server is
        # reached directly, or through the kubeconfig's own proxy-url.
        session = getattr(api.rest_client, "pool_manager", None)
        if isinstance(session, aiohttp.ClientSession):
            session._trust_env = False
        self._core = CoreV1Api(api)
        self._coord = CoordinationV1Api(api)
        self._custom = CustomObjectsApi(api)
        self._timeout_s = timeout_s

    async def _call(self, what: str, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        return await call(what, fn, *args, timeout_s=self._timeout_s, **kwargs)

    async def close(self) -> None:
        await self._api.close()

    # -- nodes ---------------------------------------------------------------

    async def get_node(self, name: str) -> dict[str, Any]:
        node: dict[str, Any] = await self._call(f"get node {name}", self._core.read_node, name)
        return node

    async def patch_node_labels(self, name: str, labels: dict[str, str | None]) -> dict[str, Any]:
        """Merge-patch labels; a None value removes that label, others stay."""
        _check_strings(labels, what=f"node {name} label")
        body = {"metadata": {"labels": labels}}
        return await self._call(
            f"patch labels of node {name}",
            self._core.patch_node,
            name,
            body,
            _content_type=MERGE_PATCH,
        )

    async def patch_node_capacity(self, name: str, capacity: dict[str, int]) -> dict[str, Any]:
        """Advertise extended resources: JSON Patch ``add`` under status.capacity
        and status.allocatable (``/`` in a resource name escaped as ``~1``)."""
        ops: list[dict[str, Any]] = []
        for resource, amount in capacity.items():
            if isinstance(amount, bool) or not isinstance(amount, int) or amount < 0:
                raise KubeInvalid(f"node {name} capacity {resource}={amount!r}: want an int >= 0")
            pointer = resource.replace("~", "~0").replace("/", "~1")
            for field in ("capacity", "allocatable"):
                ops.append(
                    {"op": "add", "path": f"/status/{field}/{pointer}", "value": str(amount)}
                )
        return await self._call(
            f"patch capacity of node {name}",
            self._core.patch_node_status,
            name,
            ops,
            _content_type=JSON_PATCH,
        )

    async def update_node_taints(
        self, name: str, mutate: Callable[[list[dict[str, Any]]], list[dict[str, Any]]]
    ) -> list[dict[str, Any]]:
        """Read the taints, ``mutate`` a copy, write the whole list guarded by
        ``metadata.resourceVersion``; on 409 read again (up to TAINT_RETRIES)."""
        for attempt in range(TAINT_RETRIES):
            node = await self.get_node(name)
            taints = [dict(t) for t in node.get("spec", {}).get("taints") or []]
            wanted = mutate([dict(t) for t in taints])
            if wanted == taints:
                return taints
            body = {
                "metadata": {"resourceVersion": node["metadata"]["resourceVersion"]},
                "spec": {"taints": wanted},
            }
            try:
                patched = await self._call(
                    f"update taints of node {name}",
                    self._core.patch_node,
                    name,
                    body,
                    _content_type=STRATEGIC_MERGE_PATCH,
                )
            except KubeConflict:
                if attempt == TAINT_RETRIES - 1:
                    raise
                _log.info("kube_taint_conflict", node=name, attempt=attempt + 1)
                await asyncio.sleep(TAINT_BACKOFF_S * 2**attempt * (1 + random.random()))
                continue
            return list(patched.get("spec", {}).get("taints") or [])
        raise AssertionError("unreachable")

    async def patch_node_condition(self, name: str, condition: dict[str, Any]) -> dict[str, Any]:
        """Set one node condition (merged by ``type``) by strategic merge on /status."""
        _check_condition(condition, of=f"node {name}")
        return await self._call(
            f"patch condition {condition['type']} of node {name}",
            self._core.patch_node_status,
            name,
            {"status": {"conditions": [condition]}},
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    # -- pods ----------------------------------------------------------------

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]:
        pod: dict[str, Any] = await self._call(
            f"get pod {namespace}/{name}", self._core.read_namespaced_pod, name, namespace
        )
        return pod

    async def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        """A batch/v1 Job (its parallelism and completions size a gang)."""
        job: dict[str, Any] = await self._call(
            f"get job {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            "batch",
            "v1",
            namespace,
            "jobs",
            name,
        )
        return job

    async def get_deployment(self, namespace: str, name: str) -> dict[str, Any]:
        """An apps/v1 Deployment (the HCS kube-scheduler's image, for the skew check)."""
        found: dict[str, Any] = await self._call(
            f"get deployment {namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            "apps",
            "v1",
            namespace,
            "deployments",
            name,
        )
        return found

    async def get_pod_group(
        self, group: str, version: str, namespace: str, name: str
    ) -> dict[str, Any]:
        """A PodGroup of coscheduling, Volcano or KAI (its minMember sizes a gang)."""
        found: dict[str, Any] = await self._call(
            f"get podgroup {group}/{namespace}/{name}",
            self._custom.get_namespaced_custom_object,
            group,
            version,
            namespace,
            "podgroups",
            name,
        )
        return found

    async def get_version(self) -> str:
        """The API server's version (``gitVersion`` of ``/version``)."""
        info: dict[str, Any] = await self._call("get /version", VersionApi(self._api).get_code)
        return str(info.get("gitVersion") or "")

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        cached: bool = False,
    ) -> list[dict[str, Any]]:
        """``cached``: served from the API server's watch cache
        (``resourceVersion=0``: maybe a moment old, but no quorum read of
        etcd) — for scans that run every few seconds."""
        pods, _ = await self._list_pods(
            namespace=namespace,
            field_selector=field_selector,
            label_selector=label_selector,
            cached=cached,
        )
        return pods

    async def list_pod_annotations(self, namespace: str) -> list[dict[str, Any]]:
        """Each pod of ``namespace`` as ``{"metadata": {"annotations": {...}}}``:
        from the API server's watch cache (``resourceVersion=0``), only the
        pods' metadata sent (``PartialObjectMetadataList``) and only their
        annotations decoded; for scans that read annotations alone, every few
        seconds, in a namespace of thousands of pods (a whole pod is four
        times its metadata, and decoding it builds every field)."""
        pages = self._pages(
            f"list pod annotations in {namespace}",
            f"/api/v1/namespaces/{namespace}/pods",
            _ANNOTATED_LIST,
            cached=True,
            accept=METADATA_LIST,
        )
        return [
            {"metadata": {"annotations": dict(i.metadata.annotations or {})}}
            async for page in pages
            for i in page.items or ()
        ]

    async def list_pod_summaries(self) -> list[dict[str, Any]]:
        """Every pod of the cluster (a quorum read, page by page), each as
        the pod's JSON less all but its name, namespace, uid, labels,
        annotations, owner references and deletion time, its node, scheduler
        and priority, and its phase: what the ledger's reconcile reads of
        tens of thousands of pods, the rest never decoded (a pod's spec and
        status are most of its bytes)."""
        pages = self._pages("list pods", "/api/v1/pods", _POD_SUMMARY_LIST, cached=False)
        return [msgspec.to_builtins(pod) async for page in pages for pod in page.items or ()]

    async def _pages(
        self,
        what: str,
        path: str,
        decoder: msgspec.json.Decoder[Any],
        *,
        cached: bool,
        accept: str = "application/json",
    ) -> AsyncIterator[Any]:
        """Each page of a list (``limit``/``continue``), as ``decoder`` reads it."""
        token: str | None = None
        while True:
            query = [("limit", "500")] + ([("resourceVersion", "0")] if cached else [])
            if token:
                query.append(("continue", token))
            page = await self._call(
                what,
                self._api.call_api,
                path,
                "GET",
                query_params=query,
                header_params={"Accept": accept},
                auth_settings=["BearerToken"],
                decoder=decoder,
            )
            yield page
            token = page.metadata.continue_
            if not token:
                return

    async def _list_pods(
        self,
        *,
        namespace: str | None,
        field_selector: str | None,
        label_selector: str | None = None,
        cached: bool = False,
    ) -> tuple[list[dict[str, Any]], str]:
        """All pages of a pod list, and the list's resourceVersion."""
        query = _selectors(field_selector=field_selector, label_selector=label_selector)
        if cached:
            query["resource_version"] = "0"
        if namespace is None:
            return await self._list_all("list pods", self._core.list_pod_for_all_namespaces, query)
        return await self._list_all(
            f"list pods in {namespace}", self._core.list_namespaced_pod, query, namespace
        )

    async def _list_all(
        self,
        what: str,
        fn: Any,
        query: dict[str, str],
        /,
        *args: Any,
        decoder: msgspec.json.Decoder[Any] | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        """All pages of a list (``limit``/``continue``), and the list's
        resourceVersion. ``decoder`` (a TypedDict list, so pages stay plain
        dicts) reads only the fields it names; a page it cannot type is
        asked for again and decoded whole."""
        items: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            page_args: dict[str, Any] = {"limit": 500, **query}
            if token:
                page_args["_continue"] = token
            try:
                page = await self._call(what, fn, *args, decoder=decoder, **page_args)
            except KubeError as exc:
                if decoder is None or not isinstance(exc.__cause__, msgspec.ValidationError):
                    raise
                page = await self._call(what, fn, *args, **page_args)
            items.extend(page.get("items") or [])
            token = page.get("metadata", {}).get("continue")
            if not token:
                return items, str(page.get("metadata", {}).get("resourceVersion", ""))

    async def evict_pod(
        self, namespace: str, name: str, *, dry_run: bool = False, uid: str | None = None
    ) -> dict[str, Any]:
        """POST a policy/v1 Eviction; KubeTooManyRequests (429) when a PDB refuses.

        ``uid``: evict only that incarnation of the pod (a precondition); a
        same-named replacement answers KubeConflict (409) and is left alone.
        """
        body: dict[str, Any] = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        if dry_run:
            options["dryRun"] = ["All"]
            extra["dry_run"] = "All"
        if uid:
            options["preconditions"] = {"uid": uid}
        if options:
            body["deleteOptions"] = options
        return await self._call(
            f"evict pod {namespace}/{name}",
            self._core.create_namespaced_pod_eviction,
            name,
            namespace,
            body,
            **extra,
        )

    async def delete_pod(
        self, namespace: str, name: str, *, uid: str, resource_version: str | None = None
    ) -> dict[str, Any]:
        """DELETE that incarnation of the pod (``uid``), and only while it is
        still at ``resource_version`` when one is given: KubeConflict (409)
        otherwise, KubeNotFound when it is gone."""
        preconditions = {"uid": uid}
        if resource_version:
            preconditions["resourceVersion"] = resource_version
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "preconditions": preconditions}
        return await self._call(
            f"delete pod {namespace}/{name}",
            self._core.delete_namespaced_pod,
            name,
            namespace,
            body=body,
        )

    async def create_pod(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a pod (admitted like any other); KubeConflict when the name is taken."""
        return await self._call(
            f"create pod {namespace}/{body.get('metadata', {}).get('name', '')}",
            self._core.create_namespaced_pod,
            namespace,
            body,
        )

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> dict[str, Any]:
        """POST a v1 Binding (its annotations land on the pod); 409 if already bound."""
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {
                "name": name,
                "namespace": namespace,
                "uid": uid,
                "annotations": dict(annotations),
            },
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        return await self._call(
            f"bind pod {namespace}/{name} to {node}",
            self._core.create_namespaced_pod_binding,
            name,
            namespace,
            body,
        )

    async def patch_pod_annotations(
        self, namespace: str, name: str, annotations: dict[str, str | None]
    ) -> dict[str, Any]:
        """Merge-patch the pod's annotations; a None value removes that one."""
        _check_strings(annotations, what=f"pod {namespace}/{name} annotation")
        return await self._call(
            f"patch annotations of pod {namespace}/{name}",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            {"metadata": {"annotations": annotations}},
            _content_type=MERGE_PATCH,
        )

    async def patch_pod(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """JSON-patch the pod (``ops``: RFC 6902; a failed ``test`` op is
        ``KubeInvalid``, so a patch can be made to apply only once)."""
        return await self._call(
            f"patch pod {namespace}/{name}",
            self._core.patch_namespaced_pod,
            name,
            namespace,
            ops,
            _content_type=JSON_PATCH,
        )

    async def patch_pod_condition(
        self, namespace: str, name: str, condition: dict[str, Any]
    ) -> dict[str, Any]:
        """Set one pod condition (merged by ``type``) by strategic merge on /status."""
        _check_condition(condition, of=f"pod {namespace}/{name}")
        return await self._call(
            f"patch condition {condition['type']} of pod {namespace}/{name}",
            self._core.patch_namespaced_pod_status,
            name,
            namespace,
            {"status": {"conditions": [condition]}},
            _content_type=STRATEGIC_MERGE_PATCH,
        )

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST a core/v1 Event; KubeConflict when one of that name exists."""
        return await self._call(
            f"create event in {namespace}", self._core.create_namespaced_event, namespace, body
        )

    async def watch_pods(
        self, *, field_selector: str | None = None, synced: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield (ADDED|MODIFIED|DELETED, pod) forever: a list first (as ADDED),
        then a watch resumed from the last resourceVersion. On 410 Gone it lists
        again and yields the difference to what it had seen. ``synced`` is set
        once every pod of the first list has been yielded (and taken). Only
        each pod's metadata, less its managedFields, is remembered between
        lists: a running pod as HCS mutates it (6.5 KB of JSON) held 32 KB as
        Python objects, 320 MB for 10,000 pods, and its identity holds 3 KB.
        So a DELETED found by a new list carries that alone.

        Each pod, listed or watched, is decoded no further than the fields
        the scheduler reads of it (``_WatchedPod``): metadata (name,
        namespace, uid, resourceVersion, deletionTimestamp, labels,
        annotations, ownerReferences), spec (nodeName, schedulerName,
        schedulingGates, priority, each container's name and resources, the
        preferred affinity terms, the spread constraints' whenUnsatisfiable)
        and status.phase; the rest of its JSON is skipped, never built."""
        query = _selectors(field_selector=field_selector, label_selector=None)
        async for event in self._list_and_watch(
            "pods",
            self._core.list_pod_for_all_namespaces,
            query,
            synced=synced,
            keep=_identity,
            pages=_WATCHED_POD_LIST,
            events=_WATCHED_POD_EVENT,
        ):
            yield event

    async def _list_and_watch(
        self,
        what: str,
        fn: Any,
        query: dict[str, str],
        *,
        synced: asyncio.Event | None = None,
        keep: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
        pages: msgspec.json.Decoder[Any] | None = None,
        events: msgspec.json.Decoder[Any] = _WATCH_EVENT,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """List-then-watch of one cluster-wide collection (``fn`` is its list
        call), resumed from the last resourceVersion (BOOKMARKs move it too);
        410 Gone → list again and yield the difference; retryable errors back off.
        ``synced`` is set once the events of the first list have been taken;
        ``keep`` trims what is remembered for that difference (a DELETED it
        yields carries only what was kept). ``pages`` and ``events`` decode
        the list's pages and the watch's lines (as plain dicts: whole by
        default, or only the fields a typed decoder names)."""
        known: dict[tuple[str, str], dict[str, Any]] = {}
        rv: str | None = None
        backoff_s = 0.2
        while True:
            try:
                if rv is None:
                    items, rv = await self._list_all(f"list {what}", fn, query, decoder=pages)
                    for event in resync(known, items):
                        yield event
                    if keep is not None:
                        known = {key: keep(obj) for key, obj in known.items()}
                    if synced is not None:
                        synced.set()
                async for kind, obj in self._watch_from(what, fn, rv, query, decoder=events):
                    rv = obj.get("metadata", {}).get("resourceVersion", rv)
                    backoff_s = 0.2
                    if kind in ("ADDED", "MODIFIED", "DELETED"):
                        _remember(known, kind, keep(obj) if keep is not None else obj)
                        yield kind, obj
            except KubeError as exc:
                if exc.status == 410:
                    _log.info("kube_watch_expired", resource=what, resource_version=rv)
                    rv = None
                    continue
                if not _retryable(exc):
                    raise
                _log.warning("kube_watch_retry", resource=what, error=str(exc), delay_s=backoff_s)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, WATCH_BACKOFF_MAX_S)

    async def _watch_from(
        self,
        what: str,
        fn: Any,
        rv: str,
        query: dict[str, str],
        *,
        decoder: msgspec.json.Decoder[Any] = _WATCH_EVENT,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """One watch request until the server ends it; BOOKMARKs come through too.

        The response is read line by line and each event decoded once
        (msgspec, by ``decoder``: ``_decode_event``). kubernetes-asyncio's
        ``Watch`` decoded every event three times (loads, dumps of the
        object, loads again) and built a new ApiClient, TLS context included,
        per watch: in bench.burst that was a fifth of the scheduler's CPU,
        and a consumer that slow is cut off by the API server ("watcher close
        due to unresponsiveness")."""
        kwargs: dict[str, Any] = {
            "watch": True,
            "resource_version": rv,
            "allow_watch_bookmarks": True,
            "timeout_seconds": WATCH_TIMEOUT_S,
            "_request_timeout": (self._timeout_s, WATCH_TIMEOUT_S + 30),
            "_preload_content": False,
            **query,
        }
        try:
            resp = await fn(**kwargs)
            async with resp:
                if not 200 <= resp.status <= 299:  # unread: the client checks no status here
                    body = (await resp.read()).decode(errors="replace")[:300]
                    raise ApiException(resp.status, f"{resp.reason}: {body}")
                while line := await resp.content.readline():
                    kind, obj = _decode_event(line, decoder)
                    if kind == "ERROR":
                        status = int(obj.get("code") or 0)
                        reason = f"{obj.get('reason')}: {obj.get('message')}"
                        raise status_error(f"watch {what}", ApiException(status, reason))
                    yield kind, obj
        except ApiException as exc:
            raise status_error(f"watch {what}", exc) from exc
        except msgspec.DecodeError as exc:
            raise KubeUnavailable(f"watch {what}: undecodable event: {exc}") from exc
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            raise KubeUnavailable(f"watch {what}: {exc!r}") from exc

    async def watch_nodes(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        synced: asyncio.Event | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        """Yield (ADDED|MODIFIED|DELETED, node) forever, as ``watch_pods`` does:
        a list first (as ADDED), a watch resumed from the last resourceVersion,
        a fresh list with the difference after 410 Gone. ``synced`` is set once
        every Node of the first list has been yielded (and taken). Only each
        Node's metadata, less its managedFields, is remembered between lists
        (a Node's status, images included, is large), so a DELETED found by a
        new list carries that alone."""
        query = _selectors(field_selector=field_selector, label_selector=label_selector)
        async for event in self._list_and_watch(
            "nodes", self._core.list_node, query, synced=synced, keep=_identity
        ):
            yield event

    # -- leases --------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any]:
        lease: dict[str, Any] = await self._call(
            f"get lease {namespace}/{name}", self._coord.read_namespaced_lease, name, namespace
        )
        return lease

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        lease: dict[str, Any] = await self._call(
            f"create lease in {namespace}", self._coord.create_namespaced_lease, namespace, body
        )
        return lease

    async def replace_lease(
        self, namespace: str, name: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """PUT the lease; its metadata.resourceVersion must be current (else KubeConflict)."""
        lease: dict[str, Any] = await self._call(
            f"replace lease {namespace}/{name}",
            self._coord.replace_namespaced_lease,
            name,
            namespace,
            body,
        )
        return lease

    # -- HCS custom resources --------------------------------------------------

    async def list_compute_quotas(self, namespace: str) -> list[dict[str, Any]]:
        page = await self._call(
            f"list computequotas in {namespace}",
            self._custom.list_namespaced_custom_object,
            CRD_GROUP,
            CRD_VERSION,
            namespace,
            "computequotas",
        )
        return list(page.get("items") or [])

    async def patch_compute_quota_usage(
        self, namespace: str, name: str, usage: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch ``status.usage`` of a ComputeQuota (the metering
        service's figures); the rest of its status is left alone."""
        return await self._patch_compute_quota_status(namespace, name, field="usage", value=usage)

    async def patch_compute_quota_used(
        self, namespace: str, name: str, used: dict[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch ``status.used`` of a ComputeQuota (what the ledger holds
        for the namespace: reservations and pledges); the rest is left alone."""
        return await self._patch_compute_quota_status(namespace, name, field="used", value=used)

    async def patch_compute_quota_conditions(
        self, namespace: str, name: str, conditions: list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Merge-patch ``status.conditions`` of a ComputeQuota (the shared
        pool's ``GuaranteeFits``); the rest of its status is left alone."""
        return await self._patch_compute_quota_status(
            namespace, name, field="conditions", value=conditions
        )

    async def _patch_compute_quota_status(
        self, namespace: str, name: str, *, field: str, value: dict[str, Any] | list[dict[str, Any]]
    ) -> dict[str, Any]:
        """Merge-patch one field of a ComputeQuota's status, the others left alone."""
        return await self._call(
            f"patch {field} of computequota {namespace}/{name}",
            self._custom.patch_namespaced_custom_object_status,
            CRD_GROUP,
            CRD_VERSION,
            namespace,
            "computequotas",
            name,
            {"status": {field: value}},
            _content_type=MERGE_PATCH,
        )

    async def patch_compute_node_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the ComputeNode's status subresource, creating the object first
        when it does not exist yet."""
        try:
            return await self._patch_compute_node_status(name, status)
        except KubeNotFound:
            _log.info("kube_computenode_create", name=name)
        body = {
            "apiVersion": f"{CRD_GROUP}/{CRD_VERSION}",
            "kind": "ComputeNode",
            "metadata": {"name": name},
        }
        try:
            await self._call(
                f"create computenode {name}",
                self._custom.create_cluster_custom_object,
                CRD_GROUP,
                CRD_VERSION,
                "computenodes",
                body,
            )
        except KubeConflict:
            pass  # created meanwhile by someone else: patch it
        return await self._patch_compute_node_status(name, status)

    async def _patch_compute_node_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return await self._call(
            f"patch status of computenode {name}",
            self._custom.patch_cluster_custom_object_status,
            CRD_GROUP,
            CRD_VERSION,
            "computenodes",
            name,
            {"status": status},
            _content_type=MERGE_PATCH,
        )


def _check_strings(values: dict[str, str | None], *, what: str) -> None:
    """KubeInvalid unless every key is a string and every value a string or None
    (None: remove that key)."""
    for key, value in values.items():
        if not isinstance(key, str) or not (value is None or isinstance(value, str)):
            raise KubeInvalid(f"{what} {key!r}={value!r}: want str → str | None")


def _check_condition(condition: dict[str, Any], *, of: str) -> None:
    """KubeInvalid unless ``condition`` has a string type and a status Kubernetes takes."""
    if not isinstance(condition.get("type"), str) or condition.get("status") not in (
        "True",
        "False",
        "Unknown",
    ):
        raise KubeInvalid(f"{of} condition {condition!r}: needs type and status")


def _selectors(*, field_selector: str | None, label_selector: str | None) -> dict[str, str]:
    selectors = {"field_selector": field_selector, "label_selector": label_selector}
    return {k: v for k, v in selectors.items() if v}


def _identity(obj: dict[str, Any]) -> dict[str, Any]:
    """What a list-and-watch remembers of an object between lists: its
    metadata without managedFields (who wrote which field: a third of a pod,
    and nothing a consumer of a DELETED reads)."""
    meta = obj.get("metadata") or {}
    return {"metadata": {k: v for k, v in meta.items() if k != "managedFields"}}


def _decode_event(line: bytes, decoder: msgspec.json.Decoder[Any]) -> tuple[str, dict[str, Any]]:
    """One watch line as (type, object), the object a plain dict. A typed
    ``decoder`` builds only the fields it names; an ERROR (whose object is a
    ``Status``, not the kind watched) or an object it cannot type is decoded
    whole, as the untyped decoder does."""
    if decoder is not _WATCH_EVENT:
        try:
            typed = decoder.decode(line)
        except msgspec.ValidationError:
            pass
        else:
            if typed.type != "ERROR":
                return typed.type, typed.object
    event = _WATCH_EVENT.decode(line)
    return event.type, event.object


def _retryable(exc: KubeError) -> bool:
    """Unreachable, overloaded (429) or a server error: try the watch again later."""
    return isinstance(exc, KubeUnavailable) or exc.status == 429 or (exc.status or 500) >= 500


def _key(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod.get("metadata", {})
    return str(meta.get("namespace", "")), str(meta.get("name", ""))


def _remember(known: dict[tuple[str, str], dict[str, Any]], kind: str, pod: dict[str, Any]) -> None:
    if kind == "DELETED":
        known.pop(_key(pod), None)
    else:
        known[_key(pod)] = pod


def resync(
    known: dict[tuple[str, str], dict[str, Any]], pods: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """Events turning ``known`` into ``pods`` (a fresh list); updates ``known``."""
    events: list[tuple[str, dict[str, Any]]] = []
    fresh = {_key(p): p for p in pods}
    for key, old in list(known.items()):
        new = fresh.get(key)
        if new is None or _uid(new) != _uid(old):
            events.append(("DELETED", old))
            del known[key]
    for key, pod in fresh.items():
        seen = known.get(key)
        if seen is None:
            events.append(("ADDED", pod))
        elif _rv(seen) != _rv(pod):
            events.append(("MODIFIED", pod))
        known[key] = pod
    return events


def _uid(pod: dict[str, Any]) -> Any:
    return pod.get("metadata", {}).get("uid")


def _rv(pod: dict[str, Any]) -> Any:
    return pod.get("metadata", {}).get("resourceVersion")


__all__ = ["API_CALLS", "ApiCall", "Kube", "connect", "connect_url"]
