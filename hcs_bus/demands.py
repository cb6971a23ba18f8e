"""What a pod asks for: its ``ai.compute/*`` requests and limits and its
``hcs.io/*`` policy, read the same way by the injector (at admission) and the
scheduler (at filter and bind). Pure: plain API JSON in, values out.

Refused here, naming the key, is what the API server or the kubelet would
refuse later (Kubernetes keeps ``ai.compute/*`` as extended resources): a
request without a limit or different from it (the API server defaults a
missing request from the limit before admission, never the reverse), an
amount that is not a whole number (extended resources are integers: VRAM in
bytes as pods write it, ACU, devices, TFLOPS), negative or beyond int64, an
unknown ``ai.compute/`` key, and in an init container a key that nodes do not
advertise (the kubelet drops unadvertised extended resources only from
regular containers, so it would refuse the pod with ``OutOf<key>``).

The pod's demand is, per key, the larger of the sum over regular containers
and the largest init container (init containers run one at a time before
the others), as Kubernetes computes effective requests; VRAM is summed in
bytes and rounded up to whole MiB once, for the pod. ``Demand.amounts``
keeps it in the node's unit, for the capacity check after the plan.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, NamedTuple

from hcs_bus import jobs, vocabulary
from hcs_bus.errors import DemandError
from hcs_bus.messages import Policy, Requests
from hcs_bus.units import QuantityError, bytes_to_mib, parse_quantity

COMPUTE: Final = "ai.compute/"
FIELDS: Final = {
    "ai.compute/vram": "vram_mib",
    "ai.compute/tflops-fp16": "tflops_fp16",
    "ai.compute/tflops-bf16": "tflops_bf16",
    "ai.compute/tflops-fp32": "tflops_fp32",
    "ai.compute/acu": "acu",
    "ai.compute/devices": "devices",
}
# The keys node agents advertise in Node status (the kubelet compares requests
# of these with allocatable); the others only the HCS extender handles.
ADVERTISED: Final = ("ai.compute/vram", "ai.compute/acu", "ai.compute/devices")
UNITS: Final = {
    "ai.compute/vram": "bytes",
    "ai.compute/tflops-fp16": "TFLOPS",
    "ai.compute/tflops-bf16": "TFLOPS",
    "ai.compute/tflops-fp32": "TFLOPS",
    "ai.compute/acu": "ACU",
    "ai.compute/devices": "devices",
}
SUBSTITUTIONS: Final = ("allow", "ask", "deny")
TOPOLOGIES: Final = ("high-bandwidth", "any")
MAX_AMOUNT: Final = Decimal(2**63 - 1)  # Kubernetes keeps resource amounts in an int64


@dataclass(frozen=True)
class ContainerRef:
    field: str  # "containers" or "initContainers"
    index: int
    name: str


class Asked(NamedTuple):
    """The containers that ask, the pod's requests, and its amounts per key in
    the node's unit (VRAM in bytes)."""

    targets: tuple[ContainerRef, ...]
    requests: Requests
    amounts: Mapping[str, Decimal]


class Demand(NamedTuple):
    targets: tuple[ContainerRef, ...]
    requests: Requests
    policy: Policy
    # the pod's effective request per key in the node's unit (VRAM in bytes)
    amounts: Mapping[str, Decimal] = {}


# ------------------------------------------------------------------ pods --


def containers(pod: Mapping[str, Any]) -> list[tuple[ContainerRef, dict[str, Any]]]:
    """Every init and regular container with its reference; DemandError if malformed."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise DemandError("pod has no spec")
    found: list[tuple[ContainerRef, dict[str, Any]]] = []
    for field in ("initContainers", "containers"):
        items = spec.get(field) or []
        if not isinstance(items, list):
            raise DemandError(f"spec.{field} is not a list")
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise DemandError(f"spec.{field}[{index}] is not an object")
            found.append((ContainerRef(field, index, str(item.get("name", ""))), item))
    if not spec.get("containers"):
        raise DemandError("spec.containers is empty")
    return found


def read(pod: Mapping[str, Any]) -> Demand | None:
    """The pod's demand, or None when no container asks for ``ai.compute/*``."""
    asked = read_requests(containers(pod))
    if asked is None:
        return None
    policy = read_policy(
        annotations_of(pod), labels=labels_of(pod), owner_references=owner_references_of(pod)
    )
    return Demand(asked.targets, asked.requests, policy, asked.amounts)


def read_requests(found: Iterable[tuple[ContainerRef, Mapping[str, Any]]]) -> Asked | None:
    """The requests of these containers, or None when none asks for ``ai.compute/*``."""
    asking: list[tuple[ContainerRef, dict[str, Decimal]]] = []
    for ref, container in found:
        amounts = _container_amounts(ref, container)
        if amounts:
            asking.append((ref, amounts))
    if not asking:
        return None
    amounts = _pod_amounts(asking)
    return Asked(tuple(ref for ref, _ in asking), requests_of(amounts), amounts)


def _container_amounts(ref: ContainerRef, container: Mapping[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise DemandError(f"{_where(ref)}: resources is not an object")
    limits = _compute_part(ref, resources, "limits")
    requests = _compute_part(ref, resources, "requests")
    for key in sorted(set(requests) - set(limits)):
        raise DemandError(
            f"{_where(ref)}: {key} is requested ({show(requests[key])}) without a limit; "
            "extended resources need a limit equal to the request"
        )
    for key in sorted(set(limits) & set(requests)):
        if limits[key] != requests[key]:
            raise DemandError(
                f"{_where(ref)}: {key} request {show(requests[key])} and limit {show(limits[key])} "
                "differ; extended resources need requests equal to limits"
            )
    amounts = {**requests, **limits}
    if ref.field == "initContainers":
        for key in sorted(set(amounts) - set(ADVERTISED)):
            raise DemandError(
                f"{_where(ref)}: an init container cannot request {key}: nodes do not "
                f"advertise it, and the kubelet ignores unadvertised extended resources "
                f"only in regular containers, so it would refuse the pod (OutOf{key}); "
                "request it in a regular container"
            )
    return amounts


def _compute_part(ref: ContainerRef, resources: Mapping[str, Any], part: str) -> dict[str, Decimal]:
    section = resources.get(part) or {}
    if not isinstance(section, dict):
        raise DemandError(f"{_where(ref)}: resources.{part} is not an object")
    amounts = {}
    for key, value in section.items():
        if not key.startswith(COMPUTE):
            continue
        if key not in FIELDS:
            raise DemandError(f"{_where(ref)}: unknown resource {key}{_suggest(key)}")
        amounts[key] = _amount(ref, key, value)
    return amounts


def _amount(ref: ContainerRef, key: str, value: Any) -> Decimal:
    try:
        ok_type = isinstance(value, str | int | float) and not isinstance(value, bool)
        amount = parse_quantity(value) if ok_type else None
    except QuantityError:
        amount = None
    if amount is None or not amount.is_finite() or amount < 0:
        raise DemandError(f"{_where(ref)}: {key}: {value!r} is not a valid quantity")
    if amount > MAX_AMOUNT:
        raise DemandError(f"{_where(ref)}: {key}: {value!r} is too large (at most {MAX_AMOUNT})")
    if amount != amount.to_integral_value():
        raise DemandError(
            f"{_where(ref)}: {key}: {value!r} must be a whole number of {UNITS[key]} "
            f"(= {show(amount)}); Kubernetes counts extended resources in integers"
        )
    return amount


def _pod_amounts(asking: list[tuple[ContainerRef, dict[str, Decimal]]]) -> dict[str, Decimal]:
    regular: dict[str, Decimal] = {}
    init: dict[str, Decimal] = {}
    for ref, amounts in asking:
        for key, amount in amounts.items():
            if ref.field == "containers":
                regular[key] = regular.get(key, Decimal(0)) + amount
            else:
                init[key] = max(init.get(key, Decimal(0)), amount)
    return {
        key: max(regular.get(key, Decimal(0)), init.get(key, Decimal(0)))
        for key in sorted(set(regular) | set(init))
    }


def requests_of(total: Mapping[str, Decimal]) -> Requests:
    """Amounts per key (node units) as ``Requests`` (VRAM rounded up to MiB)."""
    values: dict[str, Any] = {}
    for key, amount in total.items():
        field = FIELDS[key]
        if field == "vram_mib":
            values[field] = bytes_to_mib(amount)
        elif field == "devices":
            values[field] = int(amount)
        else:
            values[field] = float(amount)
    return Requests(**values)


# ---------------------------------------------------------------- policy --


def read_policy(
    annotations: Mapping[str, str],
    *,
    labels: Mapping[str, str] | None = None,
    owner_references: Sequence[Mapping[str, Any]] = (),
) -> Policy:
    """The ``hcs.io/*`` policy. The job is the pod's job as ``hcs_bus.jobs``
    reads it from these labels, annotations and owner references (``hcs.io/job``
    first); ``JobError`` (a ``DemandError``) when the pod's job sizes disagree."""
    policy, _ = read_policy_and_job(annotations, labels=labels, owner_references=owner_references)
    return policy


def read_policy_and_job(
    annotations: Mapping[str, str],
    *,
    labels: Mapping[str, str] | None = None,
    owner_references: Sequence[Mapping[str, Any]] = (),
) -> tuple[Policy, jobs.JobIdentity | None]:
    """``read_policy``, and the job it names as ``hcs_bus.jobs`` read it
    (None for a pod of no job): its run and sizes without a second read."""
    substitution = annotations.get(vocabulary.SUBSTITUTION, "deny").strip()
    if substitution not in SUBSTITUTIONS:
        raise DemandError(
            f"{vocabulary.SUBSTITUTION}: {substitution!r} is not one of {SUBSTITUTIONS}"
        )
    topology = annotations.get(vocabulary.TOPOLOGY, "any").strip()
    if topology not in TOPOLOGIES:
        raise DemandError(f"{vocabulary.TOPOLOGY}: {topology!r} is not one of {TOPOLOGIES}")
    metadata = {
        "labels": labels or {},
        "annotations": annotations,
        "ownerReferences": list(owner_references),
    }
    identity = jobs.read({"metadata": metadata})
    policy = Policy(
        vendors=split_list(annotations.get(vocabulary.VENDORS, "")),
        models=split_list(annotations.get(vocabulary.MODELS, "")),
        substitution=substitution,  # type: ignore[arg-type]
        job=identity.name if identity is not None else None,
        topology=topology,  # type: ignore[arg-type]
    )
    return policy, identity


def split_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    """``metadata.annotations``; DemandError unless it maps strings to strings."""
    return _string_map(pod, "annotations")


def labels_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return _string_map(pod, "labels")


def owner_references_of(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """``metadata.ownerReferences`` (entries that are not objects left out)."""
    metadata = pod.get("metadata") or {}
    found = metadata.get("ownerReferences") if isinstance(metadata, dict) else None
    return [ref for ref in found if isinstance(ref, dict)] if isinstance(found, list) else []


def _string_map(pod: Mapping[str, Any], part: str) -> dict[str, str]:
    metadata = pod.get("metadata") or {}
    found = metadata.get(part) if isinstance(metadata, dict) else None
    if found is None:
        return {}
    if not isinstance(found, dict) or not all(isinstance(v, str) for v in found.values()):
        raise DemandError(f"metadata.{part} must map strings to strings")
    return found


# ----------------------------------------------------------------- words --


def show(amount: Decimal) -> str:
    """An amount as Kubernetes users write it: no exponent, no trailing zeros."""
    return f"{amount.normalize():f}"


def _where(ref: ContainerRef) -> str:
    return f"spec.{ref.field}[{ref.index}] ({ref.name or 'unnamed'})"


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(FIELDS), n=1)
    known = ", ".join(FIELDS)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{hint} (known: {known})"
