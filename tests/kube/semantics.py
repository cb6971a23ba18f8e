"""Pure semantics of kube-apiserver used by the API double (tests/apiserver.py):
Status bodies, the three PATCH flavours, label/field selectors and the
PodDisruptionBudget arithmetic of the disruption controller."""

from __future__ import annotations

import copy
import datetime as dt
import math
import re
from collections.abc import Callable
from typing import Any

import jsonpatch
import jsonpointer

Obj = dict[str, Any]

KINDS = {
    "nodes": ("v1", "Node"),
    "pods": ("v1", "Pod"),
    "leases": ("coordination.k8s.io/v1", "Lease"),
    "poddisruptionbudgets": ("policy/v1", "PodDisruptionBudget"),
    "computequotas": ("hcs.io/v1alpha1", "ComputeQuota"),
    "computenodes": ("hcs.io/v1alpha1", "ComputeNode"),
    "events": ("v1", "Event"),
    "jobs": ("batch/v1", "Job"),
    "deployments": ("apps/v1", "Deployment"),
    "podgroups": ("scheduling.x-k8s.io/v1alpha1", "PodGroup"),
}
MERGE_KEYS = {
    ("status", "conditions"): "type",
    ("status", "addresses"): "type",
    ("metadata", "ownerReferences"): "uid",
    ("status", "volumesAttached"): "name",
}
QUANTITY = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[kMGTPE]i?|Ki|m|u|n)?$")
POD_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "metadata.namespace": ("metadata", "namespace"),
    "spec.nodeName": ("spec", "nodeName"),
    "spec.schedulerName": ("spec", "schedulerName"),
    "spec.serviceAccountName": ("spec", "serviceAccountName"),
    "status.phase": ("status", "phase"),
    "status.nominatedNodeName": ("status", "nominatedNodeName"),
}
NODE_FIELDS = {
    "metadata.name": ("metadata", "name"),
    "spec.unschedulable": ("spec", "unschedulable"),
}
FIELDS = {"pods": POD_FIELDS, "nodes": NODE_FIELDS}  # field selectors per listable resource


class Problem(Exception):
    """Answer with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, *, details: Obj | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: Obj | None = None) -> Obj:
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body.update(message=message, reason=reason, code=code)
    if details:
        body["details"] = details
    return body


def success_body(code: int) -> Obj:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": code}


def qualified(resource: str, group: str) -> str:
    return f"{resource}.{group}" if group else resource


def conflict(resource: str, group: str, name: str) -> Problem:
    return Problem(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": the object '
        "has been modified; please apply your changes to the latest version and try again",
        details={"name": name, "group": group, "kind": resource},
    )


def not_found(resource: str, group: str, name: str) -> Problem:
    return Problem(
        404,
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        details={"name": name, "group": group, "kind": resource},
    )


# -- patches -------------------------------------------------------------------


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: maps merge, null deletes, anything else (lists too) replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge(target: Any, patch: Any, path: tuple[str, ...] = ()) -> Any:
    """Strategic merge for the Node/Pod fields we serve: lists with a
    patchMergeKey merge by it, other lists (``spec.taints``) are replaced."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key == "$patch":
            continue
        if key.startswith("$"):
            raise Problem(400, "BadRequest", f"unknown patch directive {key!r}")
        sub = (*path, key)
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and sub in MERGE_KEYS:
            result[key] = _merge_list(result.get(key) or [], value, key=MERGE_KEYS[sub], path=sub)
        else:
            result[key] = strategic_merge(result.get(key), value, sub)
    return result


def _merge_list(current: list[Any], patch: list[Any], *, key: str, path: tuple[str, ...]) -> list:
    """Merge list items by ``key``, then order them as apimachinery's
    ``normalizeElementOrder`` does: patch items in patch order, interleaved
    with the server-only items by their order on the server."""
    merged = [copy.deepcopy(item) for item in current]
    for item in patch:
        if not isinstance(item, dict) or key not in item:
            raise Problem(
                422, "Invalid", f"{'.'.join(path)}: element does not contain merge key {key!r}"
            )
        at = next((i for i, old in enumerate(merged) if old.get(key) == item[key]), None)
        if item.get("$patch") == "delete":
            if at is not None:
                del merged[at]
        elif at is None:
            merged.append(strategic_merge({}, item, path))
        else:
            merged[at] = strategic_merge(merged[at], item, path)
    order = [item[key] for item in patch if item.get("$patch") != "delete"]
    patched = sorted((m for m in merged if m[key] in order), key=lambda m: order.index(m[key]))
    server_only = [m for m in merged if m[key] not in order]
    return _merge_sorted(server_only, patched, server=[c.get(key) for c in current], key=key)


def _merge_sorted(left: list[Obj], right: list[Obj], *, server: list[Any], key: str) -> list[Obj]:
    """apimachinery's ``mergeSortedSlice``: insert server-only items (left) into the
    patch items (right) where the server order says they come first."""
    out: list[Obj] = []
    i = j = 0
    while i < len(left) or j < len(right):
        if j >= len(right):
            out.append(left[i])
            i += 1
        elif i < len(left) and _before(left[i][key], right[j][key], server):
            out.append(left[i])
            i += 1
        else:
            out.append(right[j])
            j += 1
    return out


def _before(left: Any, right: Any, server: list[Any]) -> bool:
    return left in server and right in server and server.index(left) < server.index(right)


def json_patch(target: Obj, ops: Any) -> Obj:
    if not isinstance(ops, list):
        raise Problem(400, "BadRequest", "a JSON patch must be a list of operations")
    try:
        result: Obj = jsonpatch.JsonPatch(ops).apply(target)
    except jsonpatch.InvalidJsonPatch as exc:
        raise Problem(400, "BadRequest", f"invalid JSON patch: {exc}") from exc
    except (jsonpatch.JsonPatchException, jsonpointer.JsonPointerException) as exc:
        raise Problem(422, "Invalid", f"the JSON patch could not be applied: {exc}") from exc
    return result


def apply_patch(content_type: str, target: Obj, body: Any, *, crd: bool) -> Obj:
    if content_type == "application/json-patch+json":
        return json_patch(target, body)
    if content_type == "application/merge-patch+json":
        return merge_patch(target, body)  # type: ignore[no-any-return]
    if content_type == "application/strategic-merge-patch+json" and not crd:
        return strategic_merge(target, body)  # type: ignore[no-any-return]
    raise Problem(
        415,
        "UnsupportedMediaType",
        f"the body of the request was in an unknown format ({content_type!r}) - accepted media "
        "types include: application/json-patch+json, application/merge-patch+json"
        + ("" if crd else ", application/strategic-merge-patch+json"),
    )


# -- selectors and disruption budgets --------------------------------------------


def _split_terms(selector: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(selector):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if ch == "," and depth == 0:
            terms.append(selector[start:i].strip())
            start = i + 1
    terms.append(selector[start:].strip())
    return [t for t in terms if t]


Term = tuple[str, str, frozenset[str]]  # key, operator, values


def _parse_label_term(term: str) -> Term:
    if m := re.fullmatch(r"([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)", term):
        return m[1], m[2], frozenset(v.strip() for v in m[3].split(","))
    if m := re.fullmatch(r"([\w./-]+)\s*(==|=|!=)\s*([\w.-]*)", term):
        return m[1], "notin" if m[2] == "!=" else "in", frozenset([m[3]])
    if m := re.fullmatch(r"(!?)([\w./-]+)", term):
        return m[2], "absent" if m[1] else "present", frozenset()
    raise Problem(400, "BadRequest", f"unable to parse requirement: {term!r}")


def _label_term_holds(term: Term, labels: dict[str, str]) -> bool:
    key, op, values = term
    if op == "present":
        return key in labels
    if op == "absent":
        return key not in labels
    return (labels.get(key) in values) == (op == "in")


def label_matcher(selector: str | None) -> Callable[[dict[str, str]], bool]:
    """``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k``, ``k in (a,b)``, ``k notin (a,b)``."""
    terms = [_parse_label_term(t) for t in _split_terms(selector or "")]
    return lambda labels: all(_label_term_holds(t, labels) for t in terms)


def field_matcher(
    selector: str | None, *, fields: dict[str, tuple[str, str]] = POD_FIELDS
) -> Callable[[Obj], bool]:
    """Field selectors: ``spec.nodeName=x``, ``status.phase!=Succeeded`` (pods),
    ``metadata.name=n`` (nodes), ... — only the ``fields`` the server supports."""
    terms: list[tuple[str, str, bool, str]] = []
    for term in _split_terms(selector or ""):
        m = re.fullmatch(r"([\w.]+)\s*(==|=|!=)\s*(.*)", term)
        if not m or m[1] not in fields:
            raise Problem(400, "BadRequest", f'field label not supported: "{term}"')
        terms.append((*fields[m[1]], m[2] == "!=", m[3]))

    def matches(obj: Obj) -> bool:
        return all(
            (_field_text(obj.get(section, {}).get(field)) == value) != negate
            for section, field, negate, value in terms
        )

    return matches


def _field_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value or "")


def selector_matches(selector: Obj | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector (policy/v1: an empty selector matches every pod)."""
    selector = selector or {}
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def pod_healthy(pod: Obj) -> bool:
    if pod["metadata"].get("deletionTimestamp") or pod["status"].get("phase") != "Running":
        return False
    conditions = pod["status"].get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _scaled(value: int | str, expected: int) -> int:
    if isinstance(value, str) and value.endswith("%"):
        return math.ceil(expected * int(value[:-1]) / 100)
    return int(value)


def budget(pdb: Obj, pods: list[Obj]) -> tuple[int, int, int]:
    """(desiredHealthy, currentHealthy, disruptionsAllowed) as the disruption controller
    computes them, the expected count being the matching pods."""
    spec = pdb.get("spec", {})
    expected = len(pods)
    healthy = sum(pod_healthy(p) for p in pods)
    if spec.get("minAvailable") is not None:
        desired = _scaled(spec["minAvailable"], expected)
    elif spec.get("maxUnavailable") is not None:
        desired = max(0, expected - _scaled(spec["maxUnavailable"], expected))
    else:
        desired = expected
    return desired, healthy, max(0, healthy - desired)
