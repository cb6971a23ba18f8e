"""What a pod asks for: its ``ai.compute/*`` requests and ``hcs.io/*`` policy.

Per container, limits and requests must agree (Kubernetes requires it for
extended resources; a key in only one of them counts once). The pod's demand
is, per field, the larger of the sum over regular containers and the largest
init container (init containers run one at a time before the others), as
Kubernetes computes effective requests. Every container that asks receives
the pod's devices.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final, NamedTuple

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
SUBSTITUTIONS: Final = ("allow", "ask", "deny")
MAX_AMOUNT: Final = Decimal(2**63 - 1)  # Kubernetes keeps resource amounts in an int64
TOPOLOGIES: Final = ("high-bandwidth", "any")


class PodError(ValueError):
    """The pod is unreadable or asks for something wrong; the message says what."""


@dataclass(frozen=True)
class ContainerRef:
    field: str  # "containers" or "initContainers"
    index: int
    name: str


class Demand(NamedTuple):
    targets: tuple[ContainerRef, ...]
    requests: Requests
    policy: Policy


def containers(pod: Mapping[str, Any]) -> list[tuple[ContainerRef, dict[str, Any]]]:
    """Every init and regular container with its reference; PodError if malformed."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise PodError("pod has no spec")
    found = []
    for field in ("initContainers", "containers"):
        items = spec.get(field) or []
        if not isinstance(items, list):
            raise PodError(f"spec.{field} is not a list")
        for index, item in enumerate(items):
            if not isinstance(item, dict):
                raise PodError(f"spec.{field}[{index}] is not an object")
            found.append((ContainerRef(field, index, str(item.get("name", ""))), item))
    if not spec.get("containers"):
        raise PodError("spec.containers is empty")
    return found


def read(pod: Mapping[str, Any]) -> Demand | None:
    """The pod's demand, or None when no container asks for ``ai.compute/*``."""
    asked: list[tuple[ContainerRef, dict[str, Decimal]]] = []
    for ref, container in containers(pod):
        amounts = _container_amounts(ref, container)
        if amounts:
            asked.append((ref, amounts))
    if not asked:
        return None
    requests = _pod_requests(asked)
    policy = read_policy(_annotations(pod))
    return Demand(tuple(ref for ref, _ in asked), requests, policy)


def _container_amounts(ref: ContainerRef, container: dict[str, Any]) -> dict[str, Decimal]:
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise PodError(f"{_where(ref)}: resources is not an object")
    limits = _compute_part(ref, resources, "limits")
    requests = _compute_part(ref, resources, "requests")
    for key in sorted(set(limits) & set(requests)):
        if limits[key] != requests[key]:
            raise PodError(
                f"{_where(ref)}: {key} request and limit differ; "
                "extended resources need requests equal to limits"
            )
    return {**requests, **limits}


def _compute_part(ref: ContainerRef, resources: dict[str, Any], part: str) -> dict[str, Decimal]:
    section = resources.get(part) or {}
    if not isinstance(section, dict):
        raise PodError(f"{_where(ref)}: resources.{part} is not an object")
    amounts = {}
    for key, value in section.items():
        if not key.startswith(COMPUTE):
            continue
        if key not in FIELDS:
            raise PodError(f"{_where(ref)}: unknown resource {key}{_suggest(key)}")
        amounts[key] = _amount(ref, key, value)
    return amounts


def _amount(ref: ContainerRef, key: str, value: Any) -> Decimal:
    try:
        amount = parse_quantity(value) if isinstance(value, str | int | float) else None
    except QuantityError:
        amount = None
    if amount is None or amount < 0 or not amount.is_finite():
        raise PodError(f"{_where(ref)}: {key}: {value!r} is not a valid quantity")
    if amount > MAX_AMOUNT:
        raise PodError(f"{_where(ref)}: {key}: {value!r} is too large (at most {MAX_AMOUNT})")
    if key == "ai.compute/devices" and amount != amount.to_integral_value():
        raise PodError(f"{_where(ref)}: {key}: {value!r} must be a whole number of devices")
    return amount


def _pod_requests(asked: list[tuple[ContainerRef, dict[str, Decimal]]]) -> Requests:
    regular: dict[str, Decimal] = {}
    init: dict[str, Decimal] = {}
    for ref, amounts in asked:
        for key, amount in amounts.items():
            if ref.field == "containers":
                regular[key] = regular.get(key, Decimal(0)) + amount
            else:
                init[key] = max(init.get(key, Decimal(0)), amount)
    total = {
        key: max(regular.get(key, Decimal(0)), init.get(key, Decimal(0)))
        for key in set(regular) | set(init)
    }
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


def read_policy(annotations: Mapping[str, str]) -> Policy:
    substitution = annotations.get("hcs.io/substitution", "deny")
    if substitution not in SUBSTITUTIONS:
        raise PodError(f"hcs.io/substitution: {substitution!r} is not one of {SUBSTITUTIONS}")
    topology = annotations.get("hcs.io/topology", "any")
    if topology not in TOPOLOGIES:
        raise PodError(f"hcs.io/topology: {topology!r} is not one of {TOPOLOGIES}")
    job = annotations.get("hcs.io/job") or None
    return Policy(
        vendors=split_list(annotations.get("hcs.io/vendors", "")),
        models=split_list(annotations.get("hcs.io/models", "")),
        substitution=substitution,  # type: ignore[arg-type]
        job=job,
        topology=topology,  # type: ignore[arg-type]
    )


def split_list(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def _annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    if annotations is None:
        return {}
    if not isinstance(annotations, dict) or not all(
        isinstance(v, str) for v in annotations.values()
    ):
        raise PodError("metadata.annotations must map strings to strings")
    return annotations


def annotations_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return _annotations(pod)


def _where(ref: ContainerRef) -> str:
    return f"spec.{ref.field}[{ref.index}] ({ref.name or 'unnamed'})"


def _suggest(key: str) -> str:
    close = difflib.get_close_matches(key, list(FIELDS), n=1)
    known = ", ".join(FIELDS)
    hint = f"; did you mean {close[0]}?" if close else ""
    return f"{hint} (known: {known})"
