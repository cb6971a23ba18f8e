"""Measured compute: a short FP16 matmul benchmark where PyTorch can reach a device.

``tflops`` is the arithmetic (2·n³ floating-point operations per n×n matmul);
``measure`` runs it through torch.cuda or torch_npu when importable and a
device is present, else returns None and the profile value stands.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from typing import Any

import msgspec

from hcs_bus.messages import Compute, DeviceFingerprint
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger

_log = logger("hcs.agent.measuring")
REFERENCE_TFLOPS_FP16 = 312.0  # A100-80G dense FP16: 1 ACU = 1 % of it (DESIGN §3)
SKIP_REASON = "needs PyTorch with a CUDA or NPU device"


def tflops(*, n: int, iterations: int, elapsed_s: float) -> float:
    """Dense TFLOPS of ``iterations`` n×n×n matmuls in ``elapsed_s`` seconds."""
    if n <= 0 or iterations <= 0:
        raise ValueError(f"n and iterations must be positive, got n={n} iterations={iterations}")
    if elapsed_s <= 0:
        raise ValueError(f"elapsed_s must be positive, got {elapsed_s}")
    return 2.0 * n**3 * iterations / elapsed_s / 1e12


def acu_of(tflops_fp16: float) -> float:
    return tflops_fp16 / REFERENCE_TFLOPS_FP16 * 100.0


def bench_of(db: ProfileDB, device: DeviceFingerprint) -> float | None:
    """What a healthy device of ``device``'s model measures, where known."""
    try:
        return db.get(f"{device.vendor}/{device.model}").bench_tflops_fp16
    except KeyError:
        return None


def with_measured(
    device: DeviceFingerprint, measured_tflops: float | None, *, bench_tflops: float | None
) -> DeviceFingerprint:
    """``device`` with its measured throughput beside the profile.

    No benchmark reaches a datasheet peak (an H100 gives about 77 % of it), so
    ``acu_of(measured)`` would put measured devices on a lower scale than
    profiled ones. The measured ACU is instead the profile's ACU scaled by how
    this device compares with a healthy one of its model (``bench_tflops``,
    from the profile database); without that figure it stays unset and the
    profile stands, and the raw TFLOPS is still reported.
    """
    if measured_tflops is None:
        return device
    acu = None
    if bench_tflops:
        acu = round(device.compute.acu_profile * measured_tflops / bench_tflops, 2)
    compute = Compute(
        acu_profile=device.compute.acu_profile,
        tflops_fp16_profile=device.compute.tflops_fp16_profile,
        acu_measured=acu,
        tflops_fp16_measured=round(measured_tflops, 2),
    )
    return msgspec.structs.replace(device, compute=compute)


def backend() -> tuple[Any, str] | None:
    """(torch, device type) where a device is usable, else None."""
    if importlib.util.find_spec("torch") is None:
        return None
    torch = importlib.import_module("torch")
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        return torch, "cuda"
    if importlib.util.find_spec("torch_npu") is not None:
        importlib.import_module("torch_npu")
        if torch.npu.is_available():  # type: ignore[attr-defined]
            return torch, "npu"
    return None


def measure(index: int, *, n: int = 8192, iterations: int = 20) -> float | None:
    """Achieved dense FP16 TFLOPS on device ``index`` (blocking: run in a thread)."""
    found = backend()
    if found is None:
        return None
    torch, kind = found
    device = torch.device(f"{kind}:{index}")
    a = torch.randn(n, n, dtype=torch.float16, device=device)
    b = torch.randn(n, n, dtype=torch.float16, device=device)
    sync = torch.cuda.synchronize if kind == "cuda" else torch.npu.synchronize
    for _ in range(3):
        torch.matmul(a, b)
    sync(device)
    started = time.perf_counter()
    for _ in range(iterations):
        torch.matmul(a, b)
    sync(device)
    result = tflops(n=n, iterations=iterations, elapsed_s=time.perf_counter() - started)
    _log.info("acu_measured", device=index, backend=kind, n=n, tflops_fp16=round(result, 1))
    return result
