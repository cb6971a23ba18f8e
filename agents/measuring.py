"""Measured compute: a short FP16 matmul benchmark where PyTorch can reach a device.

``tflops`` is the arithmetic (2·n³ floating-point operations per n×n matmul);
``measure`` runs it through torch.cuda or torch_npu when importable and a
device is present, else returns None and the profile value stands.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from hcs_bus.messages import Compute, DeviceFingerprint
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger

_log = logger("hcs.agent.measuring")
REFERENCE_TFLOPS_FP16 = 312.0  # A100-80G dense FP16: 1 ACU = 1 % of it (DESIGN §3)
SKIP_REASON = "needs PyTorch with a CUDA or NPU device"
# A device is measured only while nobody computes on it: busier than this, or
# holding more than its driver and firmware do (an idle H100 holds 0.5 GiB of
# 80, an idle Ascend 910B 3.1 GiB of 64), it would measure its tenants.
IDLE_UTIL_PCT = 5.0
IDLE_USED_SHARE = 0.1


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
    """What a healthy device of ``device``'s model measures, where known
    (every poll asks: a plain lookup)."""
    profile = db.find(f"{device.vendor}/{device.model}")
    return profile.bench_tflops_fp16 if profile is not None else None


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
    # the healer compares it with the model's fleet median (a slow device)
    telemetry = msgspec.structs.replace(
        device.telemetry, achieved_tflops_fp16=round(measured_tflops, 1)
    )
    return msgspec.structs.replace(device, compute=compute, telemetry=telemetry)


def idle(device: DeviceFingerprint) -> bool:
    """Whether ``device`` can be measured now: no error, nobody computing on it."""
    used_mib = device.vram_total_mib - device.vram_free_mib
    return (
        device.error is None
        and device.telemetry.utilisation_pct < IDLE_UTIL_PCT
        and used_mib <= device.vram_total_mib * IDLE_USED_SHARE
    )


class Measurer:
    """Measures each device (by UUID) once, at the first poll that finds it idle.

    A device busy when the agent starts (an agent restarted under a running
    job) keeps its profile until it is idle; a benchmark run beside a tenant
    would report the tenant's share as the device's speed.
    """

    def __init__(
        self,
        *,
        run: Callable[[int], float | None] | None = None,
        available: Callable[[], bool] | None = None,
    ) -> None:
        self._run = run or measure
        self._available = available or (lambda: backend() is not None)
        self.tflops: dict[str, float] = {}
        self.deferred: set[str] = set()
        self.unavailable = False

    async def update(self, devices: Sequence[DeviceFingerprint]) -> None:
        waiting = [d for d in devices if d.uuid not in self.tflops and d.error is None]
        if self.unavailable or not waiting:
            return
        if not self._available():
            self.unavailable = True
            _log.info("acu_not_measured", reason=SKIP_REASON)
            return
        for device in waiting:
            if not idle(device):
                if device.uuid not in self.deferred:
                    self.deferred.add(device.uuid)
                    _log.info(
                        "acu_measure_deferred",
                        device=device.index,
                        utilisation_pct=device.telemetry.utilisation_pct,
                        used_mib=device.vram_total_mib - device.vram_free_mib,
                    )
                continue
            result = await asyncio.to_thread(self._run, device.index)
            if result is None:  # the backend went away
                self.unavailable = True
                return
            self.tflops[device.uuid] = result
            self.deferred.discard(device.uuid)

    def apply(self, device: DeviceFingerprint, *, bench_tflops: float | None) -> DeviceFingerprint:
        return with_measured(device, self.tflops.get(device.uuid), bench_tflops=bench_tflops)


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
