"""The checkpoint sidecar a pod asks for (pure): JSONPatch operations.

A pod that sets ``hcs.io/checkpoint-dir: <path>`` (a path inside a volume
mounted in one of its containers) gets ``healer.checkpointing`` beside it:

* a native sidecar (an init container with ``restartPolicy: Always``,
  Kubernetes >= 1.28) or, with ``injector.native_sidecars: false``, a plain
  extra container; image ``injector.checkpoint_image``;
* the volume that holds the path, mounted at the same mount path (writable:
  the sidecar leaves the healer's checkpoint request there for the trainer);
* the NATS seed of its namespace's user ``sidecar:<ns>`` from Secret
  ``hcs-checkpoint-nats`` (key ``seed.nk``) in the pod's own namespace, which
  the ``hcs-nats-auth`` Job writes into Namespaces labelled
  ``hcs.io/checkpoints`` only;
* ``--namespace``, ``--job`` and ``--run`` from the pod's job
  (``hcs_bus.jobs``), so its reports land under ``<ns>.<job>.<run>``.

A pod that asks for a checkpoint directory but belongs to no job, names a
path no container mounts, or has a job or run that cannot be a key token is
refused (``SidecarError``, a ``DemandError``). Whether the namespace carries
the label the webhook cannot see (the AdmissionReview holds no Namespace):
the ValidatingAdmissionPolicy ``hcs-checkpoint-namespace``
(deploy/components/kubernetes-1.30) refuses such a pod naming the label.
Run again on a pod that has the sidecar (reinvocation), nothing is added.
"""

from __future__ import annotations

import posixpath
from collections.abc import Mapping, Sequence
from typing import Any, Final

from hcs_bus import jobs, subjects, vocabulary
from hcs_bus.demands import DemandError, annotations_of
from hcs_bus.settings import InjectorSettings
from injector.patches import Patch, pointer

NAME: Final = "hcs-checkpoint"  # the sidecar container
SEED_VOLUME: Final = "hcs-checkpoint-nats"
SEED_DIR: Final = "/var/run/hcs/checkpoint-nats"
_LISTS: Final = ("/spec/volumes", "/spec/initContainers", "/spec/containers")


class SidecarError(DemandError):
    """The pod asks for a checkpoint sidecar it cannot have (the reason names why)."""


def inject(
    pod: Mapping[str, Any], *, namespace: str, settings: InjectorSettings
) -> list[dict[str, Any]]:
    """The operations that add the checkpoint sidecar ``pod`` asks for (none
    when it asks for none, or has it already)."""
    wanted = annotations_of(pod).get(vocabulary.CHECKPOINT_DIR)
    if wanted is None:
        return []
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        raise SidecarError("the pod has no spec")
    if _has_sidecar(spec):
        return []
    directory = _directory(wanted)
    identity = jobs.read(pod, namespace=namespace or None)
    if identity is None:
        raise SidecarError(
            f"{vocabulary.CHECKPOINT_DIR} is set but the pod belongs to no job: "
            f"name it with {vocabulary.JOB} (or run it from a Job)"
        )
    _check_keys(identity, annotations_of(pod).get(vocabulary.RESUME_RUN))
    mount = _mount_of(spec, directory)
    patch = Patch()
    volumes = spec.get("volumes")
    if not _has_volume(volumes, SEED_VOLUME):
        patch.append_all("/spec/volumes", volumes, [_seed_volume()])
    container = _container(identity, directory=directory, mount=mount, settings=settings)
    field = "initContainers" if settings.native_sidecars else "containers"
    patch.append_all(pointer("spec", field), spec.get(field), [container])
    return patch.ops


def after(ops: Sequence[dict[str, Any]], more: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``ops`` then ``more``, both built on the same incoming pod: an op of
    ``more`` that adds a whole list ``ops`` has already added appends to it."""
    made = {op["path"] for op in ops if op.get("op") == "add" and op["path"] in _LISTS}
    out = list(ops)
    for op in more:
        if op.get("op") == "add" and op["path"] in made and isinstance(op["value"], list):
            out.extend({"op": "add", "path": op["path"] + "/-", "value": v} for v in op["value"])
        else:
            out.append(op)
    return out


def _directory(wanted: str) -> str:
    text = wanted.strip()
    if not text.startswith("/") or ".." in text.split("/"):
        raise SidecarError(
            f"{vocabulary.CHECKPOINT_DIR}: {wanted!r} is not an absolute path "
            "(without '..') inside a volume the pod mounts"
        )
    return posixpath.normpath(text)


def _check_keys(identity: jobs.JobIdentity, resume_run: str | None) -> None:
    """``SidecarError`` unless the job's checkpoint keys can be written."""
    try:
        subjects.ckpt_key(identity.namespace, identity.name, identity.run)
        if resume_run is not None:
            subjects.ckpt_key(identity.namespace, identity.name, resume_run.strip())
    except subjects.SubjectError as exc:
        raise SidecarError(f"the job's checkpoints cannot be keyed: {exc}") from exc


def _mount_of(spec: Mapping[str, Any], directory: str) -> dict[str, Any]:
    """The deepest volume mount of a container (or init container) that holds ``directory``."""
    best: dict[str, Any] | None = None
    for field in ("containers", "initContainers"):
        for container in spec.get(field) or []:
            for mount in (container or {}).get("volumeMounts") or []:
                path = posixpath.normpath(str(mount.get("mountPath") or "/"))
                inside = directory == path or directory.startswith(path.rstrip("/") + "/")
                if inside and (best is None or len(path) > len(best["mountPath"])):
                    best = {**mount, "mountPath": path}
    if best is None:
        raise SidecarError(
            f"{vocabulary.CHECKPOINT_DIR}: no container mounts a volume that holds "
            f"{directory!r} (the sidecar reads the checkpoints from that volume)"
        )
    return best


def _container(
    identity: jobs.JobIdentity,
    *,
    directory: str,
    mount: Mapping[str, Any],
    settings: InjectorSettings,
) -> dict[str, Any]:
    shared = {"name": mount["name"], "mountPath": mount["mountPath"]}
    for key in ("subPath", "subPathExpr"):
        if mount.get(key):
            shared[key] = mount[key]
    container: dict[str, Any] = {
        "name": NAME,
        "image": settings.checkpoint_image,
        "command": ["python", "-m", "healer.checkpointing"],
        "args": [
            *("--dir", directory),
            *("--namespace", identity.namespace),
            *("--job", identity.name),
            *("--run", identity.run),
        ],
        "env": [
            {"name": "HCS_BUS__URL", "value": settings.checkpoint_bus_url},
            {
                "name": "HCS_BUS__NKEY_SEED_FILE",
                "value": f"{SEED_DIR}/{vocabulary.CHECKPOINT_SEED_KEY}",
            },
        ],
        "volumeMounts": [shared, {"name": SEED_VOLUME, "mountPath": SEED_DIR, "readOnly": True}],
        "resources": {"requests": {"cpu": "10m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if settings.native_sidecars:
        container["restartPolicy"] = "Always"
    return container


def _seed_volume() -> dict[str, Any]:
    key = vocabulary.CHECKPOINT_SEED_KEY
    return {
        "name": SEED_VOLUME,
        "secret": {
            "secretName": vocabulary.CHECKPOINT_SECRET,
            "items": [{"key": key, "path": key}],
        },
    }


def _has_sidecar(spec: Mapping[str, Any]) -> bool:
    return any(
        isinstance(c, Mapping) and c.get("name") == NAME
        for field in ("initContainers", "containers")
        for c in spec.get(field) or []
    )


def _has_volume(volumes: Any, name: str) -> bool:
    return isinstance(volumes, list) and any(
        isinstance(v, Mapping) and v.get("name") == name for v in volumes
    )
