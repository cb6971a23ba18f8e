"""Healer fixtures: small rule windows, event builders, the API double."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from hcs_bus.messages import (
    AllocationEvent,
    Compute,
    DeviceFingerprint,
    DeviceSlice,
    HealthEvent,
    NodeFingerprint,
    PodRef,
    Telemetry,
)
from healer import healing, rules
from tests.apiserver import apiserver, kube  # noqa: F401  (fixtures)


@pytest.fixture
def healer_logs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[dict[str, Any]]]:
    """The log events of ``healer.healing``, as dicts, info level included."""
    saved = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with capture_logs() as entries:
            # a fresh proxy: the cached module logger would bypass the capture
            monkeypatch.setattr(healing, "_log", structlog.get_logger("hcs.healer"))
            yield entries
    finally:
        structlog.configure(**saved)


@pytest.fixture
def small_rules() -> rules.Rules:
    return rules.load(degraded_window_s=10.0, recovery_window_s=30.0)


def health(
    node: str = "n1",
    *,
    kind: str = "xid",
    code: int | None = None,
    device: int | None = 0,
    severity: str = "critical",
    source: str = "probe",
) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind=kind,
        severity=severity,
        source=source,  # type: ignore[arg-type]
        time_s=1.0,
        device=device,
        code=code,
    )


def device(
    index: int, *, model: str = "H200", telemetry: Telemetry | None = None, error: str | None = None
) -> DeviceFingerprint:
    return DeviceFingerprint(
        index=index,
        uuid=f"GPU-{index}",
        vendor="nvidia",
        model=model,
        vram_total_mib=141_000,
        vram_free_mib=141_000,
        compute=Compute(acu_profile=317.0, tflops_fp16_profile=989.0),
        telemetry=telemetry or Telemetry(),
        error=error,
    )


def fingerprint(node: str, *, devices: int = 4, seq: int = 1, **kw: object) -> NodeFingerprint:
    return NodeFingerprint(
        node=node,
        agent_version="t",
        boot_id="b",
        seq=seq,
        time_s=float(seq),
        devices=tuple(device(i, **kw) for i in range(devices)),
    )  # type: ignore[arg-type]


def bound(
    node: str, pod: str, devices: tuple[int, ...], *, job: str | None = None, namespace: str = "ml"
) -> AllocationEvent:
    return AllocationEvent(
        node=node,
        pod=PodRef(namespace=namespace, name=pod, uid=f"uid-{pod}"),
        state="bound",
        time_s=1.0,
        devices=tuple(DeviceSlice(index=i, uuid=f"GPU-{i}", vram_mib=1000) for i in devices),
        job=job,
    )
