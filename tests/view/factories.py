"""Small builders of bus messages for tests."""

from __future__ import annotations

from hcs_bus.messages import (
    Compute,
    DeviceFingerprint,
    DeviceSlice,
    HealthEvent,
    NodeFingerprint,
    PodRef,
    Reservation,
)


def device(
    index: int, *, model: str = "A100-80G", vendor: str = "nvidia", vram_mib: int = 81920
) -> DeviceFingerprint:
    return DeviceFingerprint(
        index=index,
        uuid=f"GPU-{model}-{index}",
        vendor=vendor,
        model=model,
        vram_total_mib=vram_mib,
        vram_free_mib=vram_mib,
        compute=Compute(acu_profile=100.0, tflops_fp16_profile=312.0),
    )


def fingerprint(
    node: str,
    *,
    seq: int = 1,
    boot: str = "b1",
    devices: int = 8,
    time_s: float = 1.0,
    **kw: object,
) -> NodeFingerprint:
    return NodeFingerprint(
        node=node,
        agent_version="test",
        boot_id=boot,
        seq=seq,
        time_s=time_s,
        devices=tuple(device(i, **kw) for i in range(devices)),  # type: ignore[arg-type]
    )


def verdict(
    node: str, device_index: int | None, v: str, *, score: int | None = None
) -> HealthEvent:
    return HealthEvent(
        node=node,
        kind="verdict",
        severity="fatal" if v == "failed" else "warning",
        source="healer",
        time_s=1.0,
        device=device_index,
        verdict=v,  # type: ignore[arg-type]
        health_score=score,
    )


def reservation(ns: str, name: str, slices: list[tuple[int, int, bool]]) -> Reservation:
    return Reservation(
        pod=PodRef(namespace=ns, name=name, uid=f"uid-{name}"),
        devices=tuple(
            DeviceSlice(index=i, uuid=f"GPU-{i}", vram_mib=m, whole=w) for i, m, w in slices
        ),
        state="bound",
        time_s=1.0,
    )
