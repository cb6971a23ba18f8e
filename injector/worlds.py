"""The env that tells a gang's ranks their job and its world size (pure):
JSONPatch operations for every container of a gang member.

======================  =====================================================
``HCS_JOB_NAME``        the job's name
``HCS_JOB_RUN``         its run key ``<namespace>/<job>/<run>`` (the gang's)
``HCS_JOB_MIN_SIZE``    the fewest ranks it runs with (its size when fixed)
``HCS_JOB_MAX_SIZE``    the most ranks it runs with (its size when fixed)
``PET_NNODES``          torchrun's ``--nnodes``: ``<min>:<max>`` for an elastic
                        gang, ``<size>`` for a fixed one
``PET_RDZV_ID``         torchrun's ``--rdzv-id``: the run key with ``_``
                        between its parts (no ``/``: the etcd backend makes
                        key paths of it)
``PET_MAX_RESTARTS``    torchrun's ``--max-restarts``, elastic gangs only:
                        ``ELASTIC_MAX_RESTARTS``
======================  =====================================================

torchrun takes ``PET_<ARGUMENT>`` from the env as each argument's default, so
a flag on its command line still wins. An elastic gang needs restarts: when
HCS takes its highest ranks back, the surviving workers' collectives fail and
each agent spends one restart to meet again with fewer ranks (a rank joining
spends none); torchrun's default, 0, would end the job at its first shrink.
A fixed gang keeps torchrun's default: HCS restarts it whole.

A name the container already sets in ``env`` is left as the user set it. A
value from ``envFrom`` is not seen here, and Kubernetes lets ``env`` win over
it: set such a variable in ``env`` to keep it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from hcs_bus.jobs import JobIdentity
from injector import sidecars
from injector.patches import pointer

ELASTIC_MAX_RESTARTS: Final = 100
_UNSAFE = re.compile(r"[^A-Za-z0-9.-]")


def rendezvous_id(identity: JobIdentity) -> str:
    """The run key as a torchrun rendezvous id: ``<namespace>_<job>_<run>``
    (Kubernetes names and UIDs hold no ``_``; other characters become ``-``)."""
    parts = (identity.namespace, identity.name, identity.run)
    return "_".join(_UNSAFE.sub("-", part) for part in parts if part)


def variables(identity: JobIdentity, *, least: int, most: int) -> dict[str, str]:
    """The env a rank of ``identity``'s gang gets, by name: the gang runs with
    ``least`` to ``most`` ranks (equal for a fixed gang)."""
    elastic = least < most
    out = {
        "HCS_JOB_NAME": identity.name,
        "HCS_JOB_RUN": identity.run_key,
        "HCS_JOB_MIN_SIZE": str(least),
        "HCS_JOB_MAX_SIZE": str(most),
        "PET_NNODES": f"{least}:{most}" if elastic else str(most),
        "PET_RDZV_ID": rendezvous_id(identity),
    }
    if elastic:
        out["PET_MAX_RESTARTS"] = str(ELASTIC_MAX_RESTARTS)
    return out


def env_ops(
    pod: Mapping[str, Any],
    *,
    identity: JobIdentity,
    least: int,
    most: int,
    made: Sequence[Mapping[str, Any]] = (),
) -> list[dict[str, Any]]:
    """The operations that give every container and init container of
    ``pod`` (HCS's checkpoint sidecar aside) the gang's env. ``made``: the
    operations already built on the same incoming pod, which come first:
    an ``env`` they add is appended to, and a name they set is kept."""
    wanted = variables(identity, least=least, most=most)
    spec = pod.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    ops: list[dict[str, Any]] = []
    for field in ("containers", "initContainers"):
        found = spec.get(field)
        for index, container in enumerate(found if isinstance(found, list) else ()):
            if not isinstance(container, Mapping) or container.get("name") == sidecars.NAME:
                continue
            base = pointer("spec", field, index, "env")
            have, names = _env_after(container.get("env"), base=base, made=made)
            missing = [{"name": k, "value": v} for k, v in wanted.items() if k not in names]
            if not missing:
                continue
            if have:
                ops.extend({"op": "add", "path": f"{base}/-", "value": v} for v in missing)
            else:
                ops.append({"op": "add", "path": base, "value": missing})
    return ops


def _env_after(env: Any, *, base: str, made: Iterable[Mapping[str, Any]]) -> tuple[bool, set[str]]:
    """Whether the container has an ``env`` list once ``made`` is applied,
    and the names it then sets."""
    have = isinstance(env, list)
    names = {str(e.get("name")) for e in env if isinstance(e, Mapping)} if have else set()
    for op in made:
        if op.get("op") != "add":
            continue
        value = op.get("value")
        if op.get("path") == base and isinstance(value, list):
            have = True
            names |= {str(e.get("name")) for e in value if isinstance(e, Mapping)}
        elif op.get("path") == f"{base}/-" and isinstance(value, Mapping):
            names.add(str(value.get("name")))
    return have, names
