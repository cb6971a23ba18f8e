"""Synthetic fingerprints shared by the benchmarks."""

from __future__ import annotations

from hcs_bus.messages import Compute, DeviceFingerprint, NodeFingerprint
from hcs_bus.profiles import Profile


def node_fingerprint(
    name: str,
    *,
    vendor: str = "nvidia",
    model: str = "A100-80G",
    vram_mib: int = 81920,
    acu: float = 100.0,
    tflops_fp16: float = 312.0,
    devices: int = 8,
    labels: dict[str, str] | None = None,
) -> NodeFingerprint:
    """A node of ``devices`` identical, idle devices (seq 1, boot ``b``)."""
    return NodeFingerprint(
        node=name,
        agent_version="bench",
        boot_id="b",
        seq=1,
        time_s=1.0,
        devices=tuple(
            DeviceFingerprint(
                index=i,
                uuid=f"GPU-{name}-{i}",
                vendor=vendor,
                model=model,
                vram_total_mib=vram_mib,
                vram_free_mib=vram_mib,
                compute=Compute(acu_profile=acu, tflops_fp16_profile=tflops_fp16),
                pci_bus_id=f"0000:{i:02x}:00.0",
            )
            for i in range(devices)
        ),
        labels=labels or {},
    )


def of_profile(
    name: str, profile: Profile, *, labels: dict[str, str] | None = None
) -> NodeFingerprint:
    return node_fingerprint(
        name,
        vendor=profile.vendor,
        model=profile.model,
        vram_mib=profile.vram_mib,
        acu=profile.acu,
        tflops_fp16=profile.tflops_fp16 or 0.0,
        labels=labels,
    )
