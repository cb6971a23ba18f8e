"""Request handling of the API double: path → (group, resource, verb), and
the handler for each endpoint ``hcs_bus.kube`` uses."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from aiohttp import web

from tests.kube.semantics import (
    FIELDS,
    KINDS,
    QUANTITY,
    Obj,
    Problem,
    apply_patch,
    budget,
    conflict,
    field_matcher,
    label_matcher,
    not_found,
    now,
    pod_healthy,
    qualified,
    selector_matches,
    status_body,
    success_body,
)

if TYPE_CHECKING:
    from tests.apiserver import ApiServer

CORE, COORD, HCS, BATCH, APPS = "", "coordination.k8s.io", "hcs.io", "batch", "apps"
PODGROUP_APIS = ("scheduling.x-k8s.io", "scheduling.volcano.sh", "scheduling.run.ai")
Key = Any  # name (cluster-scoped) or (namespace, name)


class _Line(NamedTuple):
    method: str
    path: str
    verb: str  # RBAC verb: get list watch create update patch delete
    group: str
    resource: str  # "pods", "pods/eviction", "computenodes/status", ...


class Request(_Line):
    """A logged request: the 5-tuple (method, path, verb, group, resource), plus
    ``content_type`` and ``body`` (decoded JSON) of a write as attributes."""

    content_type: str = ""
    body: Any = None
    query: dict[str, str] = {}  # replaced per instance in ``of``

    @classmethod
    def of(
        cls, line: _Line, *, content_type: str, body: Any, query: dict[str, str] | None = None
    ) -> Request:
        request = cls(*line)
        request.content_type, request.body = content_type, body
        request.query = dict(query or {})
        return request


class Info(NamedTuple):
    group: str
    namespace: str | None
    resource: str
    name: str | None
    sub: str | None


# -- request handling ----------------------------------------------------------------


def _parse(path: str) -> Info:
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, rest = "", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise Problem(404, "NotFound", f"the server could not find the requested resource {path}")
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise Problem(404, "NotFound", f"the server could not find the requested resource {path}")
    return Info(group, namespace, rest[0], *[*rest[1:], None, None][:2])


def _verb(method: str, info: Info, query: Any) -> str:
    if method == "GET":
        if info.name:
            return "get"
        return "watch" if query.get("watch", "").lower() in ("true", "1", "t") else "list"
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
    return verbs.get(method, method.lower())


async def dispatch(server: ApiServer, request: web.Request) -> web.StreamResponse:
    """Log the request, run injected hooks, route it; a Problem becomes a Status answer."""
    if request.path.rstrip("/") == "/version":  # a non-resource URL anyone may read: not logged
        return web.json_response(server.version)
    try:
        info = _parse(request.path)
        verb = _verb(request.method, info, request.query)
        resource = f"{info.resource}/{info.sub}" if info.sub else info.resource
        writes = request.method in ("POST", "PUT", "PATCH")
        has_options = request.method == "DELETE" and bool(await request.read())
        body = await _body(request) if writes or has_options else None
        line = _Line(request.method, request.path, verb, info.group, resource)
        content_type = request.content_type if body is not None else ""
        server.requests.append(
            Request.of(line, content_type=content_type, body=body, query=dict(request.query))
        )
        server.run_hooks(verb, resource)
        handler = ROUTES.get((info.group, resource, verb))
        if handler is None:
            raise Problem(404, "NotFound", f"no route for {verb} {resource} in the API double")
        return await handler(server, request, info)
    except Problem as exc:
        body = status_body(exc.code, exc.reason, exc.message, exc.details)
        return web.json_response(body, status=exc.code)


async def _body(request: web.Request) -> Any:
    try:
        return json.loads(await request.read())
    except ValueError as exc:
        raise Problem(400, "BadRequest", f"the request body is not JSON: {exc}") from exc


def _key(info: Info, name: str | None = None) -> Key:
    name = name or info.name
    return name if info.namespace is None else (info.namespace, name)


def _get_stored(server: ApiServer, info: Info, name: str | None = None) -> Obj:
    obj = server.table(info.resource).get(_key(info, name))
    if obj is None:
        raise not_found(info.resource, info.group, name or info.name or "")
    return copy.deepcopy(obj)


async def _get(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    return web.json_response(_get_stored(server, info))


async def _patch(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """PATCH a node or a pod, their status, or a ComputeNode's status."""
    current = _get_stored(server, info)
    body = await _body(request)
    content_type = request.content_type
    patched = apply_patch(content_type, copy.deepcopy(current), body, crd=info.group == HCS)
    if not isinstance(patched, dict) or not isinstance(patched.get("metadata"), dict):
        raise Problem(422, "Invalid", "the patched object is not an object with metadata")
    current_rv = current["metadata"]["resourceVersion"]
    if _sets_rv(content_type, body) and patched["metadata"].get("resourceVersion") != current_rv:
        raise conflict(info.resource, info.group, info.name or "")
    if info.sub == "status":  # the status subresource changes status only
        patched = {**current, "status": patched.get("status", {})}
    elif "status" in current:  # the main resource ignores status
        patched["status"] = current["status"]
    if info.resource == "nodes":
        _validate_node(patched)
    return web.json_response(server.store(info.resource, _key(info), patched))


def _sets_rv(content_type: str, body: Any) -> bool:
    """Whether the patch sets metadata.resourceVersion (a precondition)."""
    if content_type == "application/json-patch+json":
        return any(op.get("path") == "/metadata/resourceVersion" for op in body)
    return isinstance(body, dict) and "resourceVersion" in (body.get("metadata") or {})


def _validate_node(node: Obj) -> None:
    for field in ("capacity", "allocatable"):
        resources = node.get("status", {}).get(field) or {}
        for name, value in resources.items():
            if isinstance(value, bool) or not isinstance(value, int | str):
                raise Problem(422, "Invalid", f"status.{field}[{name}]: not a quantity: {value!r}")
            if not QUANTITY.match(str(value)):
                raise Problem(
                    422,
                    "Invalid",
                    f"status.{field}[{name}]: quantities must match "
                    f"the regular expression: {value!r}",
                )
            resources[name] = str(value)
    for taint in node.get("spec", {}).get("taints") or []:
        if not taint.get("key") or taint.get("effect") not in (
            "NoSchedule",
            "PreferNoSchedule",
            "NoExecute",
        ):
            raise Problem(422, "Invalid", f"spec.taints: invalid taint {taint!r}")
    for key, value in (node["metadata"].get("labels") or {}).items():
        if not isinstance(value, str):
            raise Problem(422, "Invalid", f"metadata.labels[{key}]: must be a string")


def _list_body(server: ApiServer, resource: str, items: list[Obj], cont: str = "") -> Obj:
    api_version, kind = KINDS[resource]
    if api_version == "v1":  # core typed lists carry no kind/apiVersion on items
        items = [{k: v for k, v in i.items() if k not in ("kind", "apiVersion")} for i in items]
    meta = {"resourceVersion": str(server.rv)} | ({"continue": cont} if cont else {})
    return {"apiVersion": api_version, "kind": f"{kind}List", "metadata": meta, "items": items}


def _matcher(info: Info, query: Any) -> Callable[[Obj | None], bool]:
    """Objects of ``info.resource`` in its namespace (if any) that the selectors match."""
    by_field = field_matcher(query.get("fieldSelector"), fields=FIELDS[info.resource])
    by_label = label_matcher(query.get("labelSelector"))
    kind = KINDS[info.resource][1]

    def match(obj: Obj | None) -> bool:
        return (
            obj is not None
            and obj.get("kind") == kind
            and info.namespace in (None, obj["metadata"].get("namespace"))
            and by_field(obj)
            and by_label(obj["metadata"].get("labels") or {})
        )

    return match


async def _list(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """List pods or nodes, paged by ``limit``/``continue``."""
    match = _matcher(info, request.query)
    found = [copy.deepcopy(o) for _, o in sorted(server.table(info.resource).items()) if match(o)]
    start = int(request.query.get("continue") or 0)
    limit = int(request.query.get("limit") or 0) or len(found) or 1
    page = found[start : start + limit]
    more = str(start + limit) if start + limit < len(found) else ""
    return web.json_response(_list_body(server, info.resource, page, more))


async def _list_quotas(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    items = [
        copy.deepcopy(q) for (ns, _), q in sorted(server.quotas.items()) if ns == info.namespace
    ]
    return web.json_response(_list_body(server, "computequotas", items))


# -- writes: binding, eviction, leases, ComputeNodes --------------------------------------


async def _bind(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """pods/{name}/binding: set spec.nodeName, merge the Binding's annotations; 201 Status."""
    body = await _body(request)
    if not isinstance(body, dict) or body.get("kind") not in (None, "Binding"):
        raise Problem(400, "BadRequest", "the body is not a v1 Binding")
    meta, target = body.get("metadata") or {}, body.get("target") or {}
    if meta.get("name") not in (None, info.name):
        raise Problem(400, "BadRequest", "name in URL does not match name in Binding object")
    if not target.get("name") or target.get("kind") not in (None, "", "Node"):
        raise Problem(422, "Invalid", f"Binding.target: must name a Node: {target!r}")
    pod = _get_stored(server, info)
    name, node = info.name or "", pod["spec"].get("nodeName")
    if meta.get("uid") and meta["uid"] != pod["metadata"]["uid"]:
        raise Problem(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on pods/binding "{name}": '
            f"Precondition failed: UID in precondition: {meta['uid']}, "
            f"UID in object meta: {pod['metadata']['uid']}",
        )
    if node:
        raise Problem(
            409,
            "Conflict",
            f'Operation cannot be fulfilled on pods/binding "{name}": '
            f'pod {name} is already assigned to node "{node}"',
        )
    pod["spec"]["nodeName"] = target["name"]
    if meta.get("annotations"):
        pod["metadata"]["annotations"] = {
            **(pod["metadata"].get("annotations") or {}),
            **meta["annotations"],
        }
    pod["status"]["conditions"] = [
        c for c in pod["status"].get("conditions") or [] if c.get("type") != "PodScheduled"
    ] + [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}]
    server.store("pods", _key(info), pod)
    return web.json_response(success_body(201), status=201)


async def _evict(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """pods/{name}/eviction: refuse with 429 when a PDB allows no disruption, else delete."""
    body = await _body(request)
    if (
        not isinstance(body, dict)
        or body.get("kind") != "Eviction"
        or body.get("apiVersion") not in ("policy/v1", "policy/v1beta1")
    ):
        raise Problem(400, "BadRequest", "the body is not a policy/v1 Eviction")
    if (body.get("metadata") or {}).get("name") not in (None, info.name):
        raise Problem(400, "BadRequest", "name in URL does not match name in Eviction object")
    pod = _get_stored(server, info)
    options = body.get("deleteOptions") or {}
    dry_run = request.query.get("dryRun") == "All" or options.get("dryRun") == ["All"]
    wanted = (options.get("preconditions") or {}).get("uid")
    if wanted and wanted != pod["metadata"]["uid"]:
        raise Problem(
            409,
            "Conflict",
            f"Precondition failed: UID in precondition: {wanted}, "
            f"UID in object meta: {pod['metadata']['uid']}",
        )
    phase = pod["status"].get("phase")
    if phase not in ("Succeeded", "Failed", "Pending") and not pod["metadata"].get(
        "deletionTimestamp"
    ):
        _check_budgets(server, pod)
    if not dry_run:
        server.delete_pod(pod["metadata"]["namespace"], pod["metadata"]["name"])
    return web.json_response(success_body(201), status=201)


def _check_budgets(server: ApiServer, pod: Obj) -> None:
    namespace, labels = pod["metadata"]["namespace"], pod["metadata"].get("labels") or {}
    pdbs = [
        pdb
        for (ns, _), pdb in sorted(server.pdbs.items())
        if ns == namespace and selector_matches(pdb["spec"].get("selector"), labels)
    ]
    if len(pdbs) > 1:
        raise Problem(
            500,
            "InternalError",
            "This pod has more than one PodDisruptionBudget, "
            "which the eviction subresource does not support.",
        )
    if not pdbs:
        return
    pdb = pdbs[0]
    covered = [
        p
        for (ns, _), p in server.pods.items()
        if ns == namespace
        and not p["metadata"].get("deletionTimestamp")
        and selector_matches(pdb["spec"].get("selector"), p["metadata"].get("labels") or {})
    ]
    desired, healthy, allowed = budget(pdb, covered)
    if not pod_healthy(pod) and healthy >= desired:
        return  # unhealthyPodEvictionPolicy IfHealthyBudget
    if allowed <= 0:
        message = (
            f"The disruption budget {pdb['metadata']['name']} needs {desired} healthy "
            f"pods and has {healthy} currently"
        )
        raise Problem(
            429,
            "TooManyRequests",
            "Cannot evict pod as it would violate the pod's disruption budget.",
            details={"causes": [{"reason": "DisruptionBudget", "message": message}]},
        )


def _check_new(info: Info, body: Any, kind: str) -> Obj:
    """Validation every create does: body kind, name, namespace, no resourceVersion."""
    if not isinstance(body, dict) or body.get("kind") not in (None, kind):
        raise Problem(400, "BadRequest", f"the body is not a {kind}")
    meta = body.setdefault("metadata", {})
    if not meta.get("name"):
        raise Problem(422, "Invalid", f"{kind} metadata.name: Required value: name is required")
    if (
        info.namespace is not None
        and meta.setdefault("namespace", info.namespace) != info.namespace
    ):
        raise Problem(
            400,
            "BadRequest",
            "the namespace of the provided object does not match the namespace sent on the request",
        )
    if meta.get("resourceVersion"):
        raise Problem(
            500, "InternalError", "resourceVersion should not be set on objects to be created"
        )
    return body


async def _create(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """POST a Lease, an Event or a ComputeNode (its status is dropped: status subresource)."""
    kind = KINDS[info.resource][1]
    body = _check_new(info, await _body(request), kind)
    name = body["metadata"]["name"]
    if _key(info, name) in server.table(info.resource):
        raise Problem(
            409,
            "AlreadyExists",
            f'{qualified(info.resource, info.group)} "{name}" already exists',
            details={"name": name, "group": info.group, "kind": info.resource},
        )
    if info.group == HCS:
        body.pop("status", None)
    body["metadata"].pop("uid", None)
    return web.json_response(server.store(info.resource, _key(info, name), body), status=201)


async def _create_pod(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """POST a pod: Pending and unbound whatever status it carries; 409 when the name is taken."""
    body = _check_new(info, await _body(request), "Pod")
    name = body["metadata"]["name"]
    if _key(info, name) in server.pods:
        raise Problem(
            409,
            "AlreadyExists",
            f'pods "{name}" already exists',
            details={"name": name, "group": "", "kind": "pods"},
        )
    body["metadata"].pop("uid", None)
    body["status"] = {"phase": "Pending"}
    return web.json_response(server.store("pods", _key(info, name), body), status=201)


async def _delete_pod(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """DELETE a pod at once (as for an unbound one), honouring uid and
    resourceVersion preconditions (409 when either differs)."""
    options = await _body(request) if await request.read() else {}
    pod = _get_stored(server, info)
    meta = pod["metadata"]
    for field, have in (("uid", meta["uid"]), ("resourceVersion", meta["resourceVersion"])):
        wanted = (options.get("preconditions") or {}).get(field)
        if wanted and wanted != have:
            raise Problem(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on pods "{info.name}": Precondition failed: '
                f"{field} in precondition: {wanted}, {field} in object meta: {have}",
            )
    return web.json_response(server.delete_pod(meta["namespace"], meta["name"]))


async def _update(server: ApiServer, request: web.Request, info: Info) -> web.Response:
    """PUT a Lease: a stale metadata.resourceVersion → 409; none → unconditional."""
    current = _get_stored(server, info)
    body = await _body(request)
    if not isinstance(body, dict) or body.get("kind") not in (None, "Lease"):
        raise Problem(400, "BadRequest", "the body is not a Lease")
    meta = body.setdefault("metadata", {})
    if meta.get("name") != info.name:
        raise Problem(
            400,
            "BadRequest",
            f"the name of the object ({meta.get('name')}) does "
            f"not match the name on the URL ({info.name})",
        )
    rv = meta.get("resourceVersion")
    if rv and rv != current["metadata"]["resourceVersion"]:
        raise conflict(info.resource, info.group, info.name or "")
    meta.update(uid=current["metadata"]["uid"], namespace=info.namespace)
    return web.json_response(server.store(info.resource, _key(info), body))


# -- watch ----------------------------------------------------------------------------------


async def _watch(server: ApiServer, request: web.Request, info: Info) -> web.StreamResponse:
    """?watch=true on pods or nodes: JSON lines of {"type", "object"} from
    ``resourceVersion`` on; with ``allowWatchBookmarks`` also the BOOKMARKs
    that ``ApiServer.bookmark`` sends (an object carrying only the kind and
    the current resourceVersion, as the real watch cache sends them)."""
    await server.watch_open.wait()
    query = request.query
    match = _matcher(info, query)
    bookmarks = query.get("allowWatchBookmarks", "").lower() in ("true", "1", "t")
    api_version, kind = KINDS[info.resource]

    since = query.get("resourceVersion") or ""
    if since and not since.isdigit():
        raise Problem(400, "BadRequest", f"invalid resourceVersion {since!r}")
    expired = since not in ("", "0") and int(since) < server.floor
    backlog: list[tuple[int, str, Obj, Obj | None]]
    if since in ("", "0"):
        backlog = [(server.rv, "ADDED", o, None) for o in server.table(info.resource).values()]
    else:
        backlog = [e for e in server.history if e[0] > int(since)]
    queue: asyncio.Queue[tuple[int, str, Obj, Obj | None] | None] = asyncio.Queue()
    server.watchers.add(queue)
    try:
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if expired:
            status = status_body(
                410, "Expired", f"too old resource version: {since} ({server.floor})"
            )
            await resp.write(json.dumps({"type": "ERROR", "object": status}).encode() + b"\n")
            return resp
        for event in backlog:
            await _send(resp, event, match)
        mark = {"apiVersion": api_version, "kind": kind} if bookmarks else None
        await _stream(resp, queue, match, float(query.get("timeoutSeconds") or 1800), mark)
        return resp
    finally:
        server.watchers.discard(queue)


async def _stream(
    resp: web.StreamResponse,
    queue: asyncio.Queue[Any],
    match: Any,
    timeout_s: float,
    mark: Obj | None = None,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while (remaining := deadline - loop.time()) > 0:
        try:
            event = await asyncio.wait_for(queue.get(), remaining)
        except TimeoutError:
            return
        if event is None:
            return
        if event[1] == "BOOKMARK":
            if mark is not None:
                obj = {**mark, "metadata": {"resourceVersion": str(event[0])}}
                await resp.write(json.dumps({"type": "BOOKMARK", "object": obj}).encode() + b"\n")
            continue
        await _send(resp, event, match)


async def _send(
    resp: web.StreamResponse, event: tuple[int, str, Obj, Obj | None], match: Any
) -> None:
    """Write one event as the watch cache does: an object leaving the selector is DELETED."""
    _, kind, obj, before = event
    now, was = match(obj), match(before)
    if kind == "DELETED":
        kind = "DELETED" if now else ""
    elif now and not was:
        kind = "ADDED"
    elif was and not now:
        kind = "DELETED"
    elif not now:
        kind = ""
    if kind:
        await resp.write(json.dumps({"type": kind, "object": obj}).encode() + b"\n")


ROUTES: dict[tuple[str, str, str], Callable[..., Any]] = {
    (CORE, "nodes", "get"): _get,
    (CORE, "nodes", "patch"): _patch,
    (CORE, "nodes/status", "patch"): _patch,
    (CORE, "nodes", "list"): _list,
    (CORE, "nodes", "watch"): _watch,
    (CORE, "pods", "get"): _get,
    (CORE, "pods", "list"): _list,
    (CORE, "pods", "watch"): _watch,
    (CORE, "pods", "patch"): _patch,
    (CORE, "pods/status", "patch"): _patch,
    (CORE, "pods", "create"): _create_pod,
    (CORE, "pods", "delete"): _delete_pod,
    (CORE, "events", "create"): _create,
    (COORD, "leases", "get"): _get,
    (HCS, "computequotas", "list"): _list_quotas,
    (HCS, "computequotas/status", "patch"): _patch,
    (HCS, "computenodes", "get"): _get,
    (HCS, "computenodes/status", "patch"): _patch,
    (CORE, "pods/binding", "create"): _bind,
    (CORE, "pods/eviction", "create"): _evict,
    (COORD, "leases", "create"): _create,
    (COORD, "leases", "update"): _update,
    (HCS, "computenodes", "create"): _create,
    (BATCH, "jobs", "get"): _get,
    (APPS, "deployments", "get"): _get,
    **{(g, "podgroups", "get"): _get for g in PODGROUP_APIS},
}
