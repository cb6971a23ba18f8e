"""What the scheduler reads from a pod: its ``ai.compute/*`` requests, its
policy annotations, its job, its priority and the ``hcs.io/plan`` annotation
the injector writes. Pure: decodes API JSON, no I/O.

The ``hcs.io/plan`` annotation (written by the injector, read at filter and
bind) is a JSON object, decoded strictly::

    {"vendor": "nvidia", "model": "A100-80G", "devices": 2,
     "vram_mib_per_device": 81920, "whole_device": true, "acu_per_device": 100.0}

``acu_per_device`` is optional (0 when absent).
"""

from __future__ import annotations

from typing import Any

import msgspec

from hcs_bus.messages import Plan, PodRef, Policy, Requests
from hcs_bus.units import QuantityError, parse_quantity, quantity_mib

RESOURCE_PREFIX = "ai.compute/"
PLAN_ANNOTATION = "hcs.io/plan"
JOB_KEY = "hcs.io/job"
DEVICES_ANNOTATION = "hcs.io/devices"
VRAM_QUOTA_ANNOTATION = "hcs.io/vram-quota"
RESUME_ANNOTATION = "hcs.io/resume-from"
POLICY_ANNOTATIONS = {
    "vendors": "hcs.io/vendors",
    "models": "hcs.io/models",
    "substitution": "hcs.io/substitution",
    "topology": "hcs.io/topology",
}


class BadPod(ValueError):
    """A pod whose HCS requests or annotations cannot be understood."""


class PlanAnnotation(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``hcs.io/plan`` annotation: what the injector decided at admission."""

    vendor: str
    model: str
    devices: int
    vram_mib_per_device: int
    whole_device: bool
    acu_per_device: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.vendor}/{self.model}"


_PLAN_DECODER = msgspec.json.Decoder(PlanAnnotation)
_PLAN_ENCODER = msgspec.json.Encoder()


def encode_plan_annotation(plan: Plan) -> str:
    value = PlanAnnotation(
        vendor=plan.vendor,
        model=plan.model,
        devices=plan.devices,
        vram_mib_per_device=plan.vram_mib_per_device,
        whole_device=plan.whole_device,
        acu_per_device=plan.acu_per_device,
    )
    return _PLAN_ENCODER.encode(value).decode()


# ---------------------------------------------------------------- the pod --


class _Meta(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    namespace: str = "default"
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class _Resources(msgspec.Struct, frozen=True, kw_only=True):
    requests: dict[str, str | int | float] | None = None
    limits: dict[str, str | int | float] | None = None


class _Container(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    resources: _Resources | None = None


class _Spec(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    containers: list[_Container] = []
    priority: int | None = None
    node_name: str | None = None


class PodObject(msgspec.Struct, frozen=True, kw_only=True):
    """The part of a core/v1 Pod we read (decoded leniently: it is the API's)."""

    metadata: _Meta = _Meta()
    spec: _Spec = _Spec()


class PodInfo(msgspec.Struct, frozen=True, kw_only=True):
    """A pod reduced to what placing needs."""

    ref: PodRef
    requests: Requests | None
    policy: Policy
    annotation: PlanAnnotation | None
    priority: int
    job: str | None

    @property
    def wants_devices(self) -> bool:
        return self.annotation is not None or self.requests is not None


def pod_info(pod: PodObject) -> PodInfo:
    """Read a pod; ``BadPod`` names the field that is wrong."""
    meta = pod.metadata
    annotations = meta.annotations or {}
    labels = meta.labels or {}
    job = labels.get(JOB_KEY) or annotations.get(JOB_KEY)
    return PodInfo(
        ref=PodRef(namespace=meta.namespace, name=meta.name, uid=meta.uid),
        requests=requests_of(pod),
        policy=policy_of(annotations, job=job),
        annotation=plan_annotation(annotations),
        priority=pod.spec.priority or 0,
        job=job,
    )


def pod_info_from_dict(pod: dict[str, Any]) -> PodInfo:
    try:
        return pod_info(msgspec.convert(pod, PodObject, strict=False))
    except msgspec.ValidationError as exc:
        raise BadPod(f"pod is not a core/v1 Pod: {exc}") from exc


def plan_annotation(annotations: dict[str, str]) -> PlanAnnotation | None:
    text = annotations.get(PLAN_ANNOTATION)
    if text is None:
        return None
    try:
        value = _PLAN_DECODER.decode(text)
    except msgspec.MsgspecError as exc:
        raise BadPod(f"annotation {PLAN_ANNOTATION} is invalid: {exc}") from exc
    if value.devices < 1 or value.vram_mib_per_device < 0:
        raise BadPod(f"annotation {PLAN_ANNOTATION}: devices must be >= 1, VRAM >= 0")
    return value


_FLOAT_RESOURCES = {
    "acu": "acu",
    "tflops-fp16": "tflops_fp16",
    "tflops-bf16": "tflops_bf16",
    "tflops-fp32": "tflops_fp32",
}


def requests_of(pod: PodObject) -> Requests | None:
    """Sum of every container's ``ai.compute/*`` requests (limits when no
    request is given); None when the pod asks for none."""
    totals: dict[str, float] = {}
    for container in pod.spec.containers:
        res = container.resources
        if res is None:
            continue
        amounts = {**(res.limits or {}), **(res.requests or {})}
        for name, value in amounts.items():
            if name.startswith(RESOURCE_PREFIX):
                short = name[len(RESOURCE_PREFIX) :]
                totals[short] = totals.get(short, 0.0) + _amount(short, value)
    if not totals:
        return None
    unknown = set(totals) - {"vram", "devices", *_FLOAT_RESOURCES}
    if unknown:
        names = ", ".join(sorted(RESOURCE_PREFIX + u for u in unknown))
        raise BadPod(f"unknown HCS resource {names}")
    devices = totals.get("devices")
    if devices is not None and devices != int(devices):
        raise BadPod(f"resource {RESOURCE_PREFIX}devices: {devices:g} is not a whole number")
    extra = {field: totals.get(short, 0.0) for short, field in _FLOAT_RESOURCES.items()}
    return Requests(
        vram_mib=int(totals.get("vram", 0)),
        devices=int(devices) if devices is not None else None,
        **extra,
    )


def _amount(short: str, value: str | int | float) -> float:
    try:
        if short == "vram":
            return float(quantity_mib(value))
        return float(parse_quantity(value))
    except QuantityError as exc:
        raise BadPod(f"resource {RESOURCE_PREFIX}{short}: {exc}") from exc


def policy_of(annotations: dict[str, str], *, job: str | None) -> Policy:
    raw: dict[str, Any] = {"job": job}
    for field, key in POLICY_ANNOTATIONS.items():
        value = annotations.get(key)
        if value is None:
            continue
        if field in ("vendors", "models"):
            raw[field] = tuple(v.strip() for v in value.split(",") if v.strip())
        else:
            raw[field] = value.strip()
    try:
        return msgspec.convert(raw, Policy)
    except msgspec.ValidationError as exc:
        raise BadPod(f"policy annotations: {exc}") from exc
