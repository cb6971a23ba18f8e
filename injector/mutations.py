"""Build the JSONPatch that turns a vendor-neutral pod into a runnable vendor pod.

Pure (no I/O): pod dict + plan note + runtime profiles in, operations and
warnings out. Idempotent: run again on the patched pod (API server
reinvocation) it adds nothing that is already there.

Patched: the plan annotations; a required node affinity to the planned class,
ANDed into every existing nodeSelectorTerm; schedulerName; runtimeClassName;
per container that asks for ``ai.compute/*``: device/quota/collective env from
``hcs.io/*`` annotations (downward API), static vendor env, LD_LIBRARY_PATH
and LD_PRELOAD appended to the user's, driver and interceptor mounts, the
vendor's device nodes where its profile delivers them by hostPath; and the
opt-in rebinding (image, code copy init container, engine command).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from hcs_bus import vocabulary
from hcs_bus.demands import ContainerRef, Demand, DemandError, containers
from injector import rebinds as rebinding
from injector.patches import Patch, escape, pointer
from injector.plans import PlanNote
from injector.rebinds import Choice, Rebinding, Rebound
from injector.runtimes import Interceptor, Runtimes, VendorRuntime

VENDOR_LABEL = vocabulary.VENDOR_LABEL
MODEL_LABEL = vocabulary.MODEL_LABEL
DEVICES_ANNOTATION = vocabulary.DEVICES
INTERCEPTOR_VOLUME = "hcs-interceptor"
SHM_VOLUME = "hcs-shm"
MERGED = ("LD_LIBRARY_PATH", "LD_PRELOAD")
_REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"


class MutationError(DemandError):
    """The pod cannot take the vendor runtime (e.g. a path HCS needs is taken)."""


class Context(NamedTuple):
    runtimes: Runtimes
    rebinding: Rebinding
    scheduler_name: str
    interceptor_host_path: str


class Mutation(NamedTuple):
    ops: list[dict[str, Any]]
    warnings: list[str]


def mutate(
    pod: Mapping[str, Any],
    *,
    demand: Demand,
    note: PlanNote,
    plan_annotations: Mapping[str, str],
    choice: Choice | None,
    ctx: Context,
) -> Mutation:
    try:
        runtime = ctx.runtimes.vendor(note.vendor)
    except KeyError as exc:
        raise MutationError(f"plan chose vendor {note.vendor!r}: {exc.args[0]}") from exc
    patch, warnings = Patch(), list[str]()
    spec = pod["spec"]
    _annotate(patch, pod.get("metadata") or {}, plan_annotations)
    _affinity(patch, spec, note)
    _spec_field(patch, spec, "schedulerName", ctx.scheduler_name, warnings)
    if runtime.runtime_class:
        _spec_field(patch, spec, "runtimeClassName", runtime.runtime_class, warnings)
    found = dict(((ref.field, ref.index), c) for ref, c in containers(pod))
    rebound = _rebinds(spec, found, demand=demand, note=note, choice=choice, config=ctx.rebinding)
    ledger = _ledger(spec, demand, ctx.runtimes.interceptor)
    volumes = _volumes(runtime, ctx, ledger) + [r.volume for r in rebound.values() if r.volume]
    _add_volumes(patch, spec, volumes)
    for ref in demand.targets:
        container = found[(ref.field, ref.index)]
        base = pointer("spec", ref.field, ref.index)
        _env(patch, base, container, _wanted_env(runtime, ctx.runtimes, ledger), warnings)
        code = rebound.get(ref)
        mounts = _mounts(runtime, ctx.runtimes.interceptor, ledger)
        if code is not None and code.mount is not None:
            mounts.append(code.mount)
        _add_mounts(patch, base, container, mounts, ref=ref)
        if code is not None:
            _apply_rebound(patch, base, container, code)
    inits = [r.init for r in rebound.values() if r.init]
    patch.append_all(pointer("spec", "initContainers"), spec.get("initContainers"), inits)
    return Mutation(patch.ops, warnings)


def _annotate(patch: Patch, metadata: Mapping[str, Any], values: Mapping[str, str]) -> None:
    annotations = metadata.get("annotations")
    if not isinstance(annotations, dict):
        patch.add("/metadata/annotations", dict(values))
        return
    for key, value in values.items():
        patch.set_key("/metadata/annotations", annotations, key, value)


def _affinity(patch: Patch, spec: Mapping[str, Any], note: PlanNote) -> None:
    exprs = [
        {"key": VENDOR_LABEL, "operator": "In", "values": [note.vendor]},
        {"key": MODEL_LABEL, "operator": "In", "values": [note.model]},
    ]
    term = {"nodeSelectorTerms": [{"matchExpressions": exprs}]}
    affinity = spec.get("affinity")
    if not isinstance(affinity, dict):
        patch.add("/spec/affinity", {"nodeAffinity": {_REQUIRED: term}})
        return
    node = affinity.get("nodeAffinity")
    if not isinstance(node, dict):
        patch.add("/spec/affinity/nodeAffinity", {_REQUIRED: term})
        return
    required = node.get(_REQUIRED)
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not terms:
        patch.add(f"/spec/affinity/nodeAffinity/{_REQUIRED}", term)
        return
    for index, selector in enumerate(terms):
        base = f"/spec/affinity/nodeAffinity/{_REQUIRED}/nodeSelectorTerms/{index}"
        have = selector.get("matchExpressions") if isinstance(selector, dict) else None
        missing = [e for e in exprs if not isinstance(have, list) or e not in have]
        patch.append_all(f"{base}/matchExpressions", have, missing)


def _spec_field(
    patch: Patch, spec: Mapping[str, Any], field: str, value: str, warnings: list[str]
) -> None:
    current = spec.get(field)
    if current == value:
        return
    if current and not (field == "schedulerName" and current == "default-scheduler"):
        warnings.append(f"hcs: {field} {current!r} replaced by {value!r}")
    patch.add(pointer("spec", field), value)


def _rebinds(
    spec: Mapping[str, Any],
    found: Mapping[tuple[str, int], Mapping[str, Any]],
    *,
    demand: Demand,
    note: PlanNote,
    choice: Choice | None,
    config: Rebinding,
) -> dict[ContainerRef, Rebound]:
    if choice is None:
        return {}
    init_names = {str(c.get("name")) for c in spec.get("initContainers") or []}
    out = {}
    for ref in demand.targets:
        if ref.field != "containers":
            continue  # init containers keep their images: they prepare, the main one runs
        try:
            out[ref] = rebinding.rebind(
                ref,
                found[(ref.field, ref.index)],
                choice=choice,
                vendor=note.vendor,
                devices=note.devices,
                config=config,
                init_names=init_names,
            )
        except KeyError as exc:
            raise MutationError(f"no rebinding build for vendor {note.vendor}: {exc}") from exc
    return out


def _ledger(spec: Mapping[str, Any], demand: Demand, interceptor: Interceptor) -> str | None:
    """Where the interceptor's accounting file goes: the pod's own /dev/shm
    (``ipc_shm_path``, returned) when one container asks and the pod keeps
    its own IPC namespace, since every volume is work for the kubelet as
    long as the pod lives; else None: a memory emptyDir shared by the asking
    containers (their /dev/shm may differ) and apart from the host's. A pod
    that already holds the emptyDir (reinvocation, a copied spec) keeps it."""
    if interceptor.ipc_shm_path is None or spec.get("hostIPC") or len(demand.targets) != 1:
        return None
    if any(isinstance(v, dict) and v.get("name") == SHM_VOLUME for v in spec.get("volumes") or []):
        return None
    return interceptor.ipc_shm_path


def _volumes(runtime: VendorRuntime, ctx: Context, ledger: str | None) -> list[dict[str, Any]]:
    volumes = [
        {"name": m.name, "hostPath": {"path": m.host_path, "type": m.type}} for m in runtime.mounts
    ]
    volumes += [
        {"name": n.name, "hostPath": {"path": n.path, "type": n.type}}
        for n in runtime.devices.nodes
    ]
    volumes.append(
        {
            "name": INTERCEPTOR_VOLUME,
            "hostPath": {"path": ctx.interceptor_host_path, "type": "Directory"},
        }
    )
    if ledger is None:
        limit = ctx.runtimes.interceptor.shm_size_limit
        volumes.append({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": limit}})
    return volumes


def _add_volumes(patch: Patch, spec: Mapping[str, Any], volumes: list[dict[str, Any]]) -> None:
    existing = spec.get("volumes")
    have = {v.get("name"): v for v in existing or [] if isinstance(v, dict)}
    missing = []
    for volume in volumes:
        current = have.get(volume["name"])
        if current is None:
            missing.append(volume)
        elif not _same_source(current, volume):
            raise MutationError(f"volume name {volume['name']!r} is reserved for HCS")
    patch.append_all("/spec/volumes", existing, missing)


def _same_source(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> bool:
    if "hostPath" in wanted:
        return (current.get("hostPath") or {}).get("path") == wanted["hostPath"]["path"]
    return "emptyDir" in current


def _mounts(
    runtime: VendorRuntime, interceptor: Interceptor, ledger: str | None
) -> list[dict[str, Any]]:
    mounts = [{"name": m.name, "mountPath": m.mount_path, "readOnly": True} for m in runtime.mounts]
    # device nodes: opened read-write (a read-only bind does not stop that, but
    # says the wrong thing); the device cgroup decides access
    mounts += [{"name": n.name, "mountPath": n.path} for n in runtime.devices.nodes]
    mounts.append(
        {"name": INTERCEPTOR_VOLUME, "mountPath": interceptor.mount_path, "readOnly": True}
    )
    if ledger is None:
        mounts.append({"name": SHM_VOLUME, "mountPath": interceptor.shm_dir})
    return mounts


def _add_mounts(
    patch: Patch,
    base: str,
    container: Mapping[str, Any],
    mounts: list[dict[str, Any]],
    *,
    ref: ContainerRef,
) -> None:
    existing = container.get("volumeMounts")
    at = {m.get("mountPath"): m.get("name") for m in existing or [] if isinstance(m, dict)}
    missing = []
    for mount in mounts:
        holder = at.get(mount["mountPath"])
        if holder is None:
            missing.append(mount)
        elif holder != mount["name"]:
            raise MutationError(
                f"container {ref.name}: {mount['mountPath']} is already mounted from "
                f"volume {holder!r}; HCS mounts {mount['name']} there"
            )
    patch.append_all(f"{base}/volumeMounts", existing, missing)


def _field_env(name: str, path: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": path}}}


def _annotation_env(name: str, annotation: str) -> dict[str, Any]:
    return _field_env(name, f"metadata.annotations['{annotation}']")


def _wanted_env(
    runtime: VendorRuntime, runtimes: Runtimes, ledger: str | None
) -> list[dict[str, Any]]:
    interceptor = runtimes.interceptor
    env = [_annotation_env(name, DEVICES_ANNOTATION) for name in runtime.visible_devices_env]
    env += [_annotation_env(n, a) for n, a in runtimes.common_annotation_env.items()]
    env += [_annotation_env(n, a) for n, a in runtime.annotation_env.items()]
    env += [{"name": n, "value": v} for n, v in runtime.env.items()]
    env.append({"name": "HCS_SHM_PATH", "value": ledger or interceptor.shm_path})
    env.append(_field_env("HCS_NODE_NAME", "spec.nodeName"))
    env.append({"name": "LD_LIBRARY_PATH", "value": ":".join(runtime.library_paths)})
    env.append({"name": "LD_PRELOAD", "value": interceptor.library_path})
    return [e for e in env if e.get("value") != ""]


def _env(
    patch: Patch,
    base: str,
    container: Mapping[str, Any],
    wanted: list[dict[str, Any]],
    warnings: list[str],
) -> None:
    existing = container.get("env")
    if not isinstance(existing, list):
        patch.add(f"{base}/env", wanted)
        return
    index = {e.get("name"): i for i, e in enumerate(existing) if isinstance(e, dict)}
    for var in wanted:
        name = var["name"]
        i = index.get(name)
        if i is None:
            patch.add(f"{base}/env/-", var)
        elif name in MERGED:
            _merge(patch, base, existing[i], var, i=i)
        elif existing[i] != var:
            patch.replace(f"{base}/env/{i}", var)
            warnings.append(f"hcs: container {container.get('name')}: env {name} is set by HCS")


def _merge(
    patch: Patch, base: str, user: Mapping[str, Any], ours: dict[str, Any], *, i: int
) -> None:
    """Keep the user's value and append ours (``$(VAR)`` when the user's is a valueFrom)."""
    name, value = ours["name"], ours["value"]
    if "valueFrom" in user:
        kept = f"HCS_USER_{name}"
        patch.replace(f"{base}/env/{i}", {"name": kept, "valueFrom": user["valueFrom"]})
        patch.add(f"{base}/env/-", {"name": name, "value": f"$({kept}):{value}"})
        return
    current = str(user.get("value") or "")
    parts = [p for p in current.split(":") if p]
    extra = [p for p in value.split(":") if p not in parts]
    if extra:
        merged = ":".join([*parts, *extra]) if current else value
        patch.replace(f"{base}/env/{i}", {"name": name, "value": merged})


def _apply_rebound(patch: Patch, base: str, container: Mapping[str, Any], code: Rebound) -> None:
    for field, value in (("image", code.image), ("command", code.command), ("args", code.args)):
        if value is not None and container.get(field) != value:
            patch.add(f"{base}/{escape(field)}", value)
