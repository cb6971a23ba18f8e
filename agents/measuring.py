"""Measured compute: each idle device's FP16 throughput, beside its profile.

The benchmark itself (``agents.benchmark``) runs in a child process of the
agent, one per round of devices, so that its device context and PyTorch's
cache leave with it; where PyTorch reaches no device the child says so once,
and the profile values stand.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

import msgspec

import agents
from agents.benchmark import SKIP_REASON
from hcs_bus.errors import HcsError
from hcs_bus.messages import Compute, DeviceFingerprint
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger

_log = logger("hcs.agent.measuring")
REFERENCE_TFLOPS_FP16 = 312.0  # A100-80G dense FP16, 100 ACU (docs/architecture.md#compute-units)
# A device is measured only while nobody computes on it: busier than this, or
# holding more than its driver and firmware do (an idle H100 holds 0.5 GiB of
# 80, an idle Ascend 910B 3.1 GiB of 64), it would measure its tenants.
IDLE_UTIL_PCT = 5.0
IDLE_USED_SHARE = 0.1
MAX_TRIES = 3  # a device whose benchmark fails this often keeps its profile
# Measured again, a device in service must hold no more than it did at rest
# when last measured, give or take this: a tenant's context alone is more
# (about 0.5 GiB on an H100), and its slice was promised all the rest.
REST_MARGIN_MIB = 128
_ROOT = Path(agents.__file__).resolve().parent.parent  # where ``agents`` imports from


class MeasureFailed(HcsError):
    """The benchmark child timed out, crashed or answered nonsense; ``measured``
    holds what it finished before that (by device index)."""

    def __init__(self, message: str, *, measured: dict[int, float] | None = None) -> None:
        super().__init__(message)
        self.measured = measured or {}


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
    return (
        device.error is None
        and device.telemetry.utilisation_pct < IDLE_UTIL_PCT
        and _used_mib(device) <= device.vram_total_mib * IDLE_USED_SHARE
    )


def _used_mib(device: DeviceFingerprint) -> int:
    return device.vram_total_mib - device.vram_free_mib


def _answers(out: bytes) -> tuple[dict[int, float], str | None]:
    """The child's answer lines: measured TFLOPS by device index, and its reason
    where it found no backend. Other lines (a vendor library's banner on
    stdout) are not answers and are passed over."""
    measured: dict[int, float] = {}
    for line in out.decode(errors="replace").splitlines():
        try:
            answer = json.loads(line) if line.startswith('{"index"') else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            continue
        if answer.get("index") is None:
            return measured, str(answer.get("reason") or SKIP_REASON)
        if not isinstance(answer.get("tflops"), (int, float)) or answer["tflops"] <= 0:
            raise MeasureFailed(f"benchmark answered {line[:200]!r}", measured=measured)
        measured[int(answer["index"])] = float(answer["tflops"])
    return measured, None


async def measure_in_child(
    indices: Sequence[int], *, timeout_s: float, n: int = 8192, iterations: int = 20
) -> dict[int, float] | None:
    """Each device's TFLOPS, measured by ``python -m agents.benchmark`` in a
    child process that is gone when this returns; None where PyTorch reaches
    no device. Raises MeasureFailed on a timeout, a crash or a bad answer. A
    child still running when this is cancelled is killed, and one whose agent
    dies is killed by the kernel."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(_ROOT), env.get("PYTHONPATH")]))
    # CUDA's indices as NVML's: in PCI order (fastest first otherwise), over
    # every device NVML sees (it ignores CUDA_VISIBLE_DEVICES)
    env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    env.pop("CUDA_VISIBLE_DEVICES", None)
    args = [*(str(i) for i in indices), "--n", str(n), "--iterations", str(iterations)]
    args += ["--parent", str(os.getpid())]  # killed by the kernel if the agent dies
    try:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "agents.benchmark",
            *args,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
        )
    except OSError as exc:  # no memory or pids left to fork: the agent goes on
        raise MeasureFailed(f"benchmark of devices {list(indices)} not started: {exc}") from exc
    try:
        out, err = await asyncio.wait_for(child.communicate(), timeout_s)
    except TimeoutError:
        raise MeasureFailed(
            f"benchmark of devices {list(indices)} still running after {timeout_s:g} s; killed"
        ) from None
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    if child.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines() or ["(no output)"]
        try:
            measured = _answers(out)[0]
        except MeasureFailed as exc:
            measured = exc.measured
        raise MeasureFailed(
            f"benchmark of devices {list(indices)} exited with {child.returncode}: {lines[-1]}",
            measured=measured,
        )
    measured, no_backend = _answers(out)
    return None if no_backend else measured


Run = Callable[[Sequence[int]], Awaitable[dict[int, float] | None]]


class Measurer:
    """Measures each device (by UUID) at the first poll that finds it idle,
    and again each ``every_s`` (0: once), so a device that slows down in
    service shows it in its achieved throughput (the healer's slow-device
    signal) instead of keeping the figure it had when the agent started.

    A device busy when a round is due (an agent restarted under a running
    job) keeps its last figure, or its profile, until it is idle; a benchmark
    run beside a tenant would report the tenant's share as the device's
    speed. Measured again, it must also hold no more than it held when last
    measured, give or take ``REST_MARGIN_MIB``: a tenant idle for the moment
    still holds its context, and the benchmark's own memory would come out of
    the slices. The idle devices of a poll are measured by one child process; a
    device whose benchmark fails ``MAX_TRIES`` times in a round keeps its last
    figure until the next round.
    """

    def __init__(
        self,
        *,
        timeout_s: float = 120.0,
        every_s: float = 0.0,
        run: Run | None = None,
        available: Callable[[], bool] | None = None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self._run: Run = run or (lambda indices: measure_in_child(indices, timeout_s=timeout_s))
        self._available = available or (lambda: importlib.util.find_spec("torch") is not None)
        self._every_s = every_s
        self._clock = clock or (lambda: asyncio.get_running_loop().time())
        self.tflops: dict[str, float] = {}
        self.deferred: set[str] = set()
        self.failures: dict[str, int] = {}
        self.rounds: dict[str, float] = {}  # when each device's last round ended
        self.rest_mib: dict[str, int] = {}  # the least each held when measured
        self.unavailable = False

    def _waiting(self, device: DeviceFingerprint, *, now: float) -> bool:
        """Whether ``device``'s round is open, opening a due one."""
        if device.error is not None:
            return False
        ended = self.rounds.get(device.uuid)
        if ended is None:
            return True
        if self._every_s <= 0 or now - ended < self._every_s:
            return False
        del self.rounds[device.uuid]
        self.failures.pop(device.uuid, None)
        return True

    async def update(self, devices: Sequence[DeviceFingerprint]) -> None:
        now = self._clock()
        waiting = [d for d in devices if self._waiting(d, now=now)]
        if self.unavailable or not waiting:
            return
        if not self._available():
            self.unavailable = True
            _log.info("acu_not_measured", reason=SKIP_REASON)
            return
        ready = []
        for device in waiting:
            if idle(device) and self._at_rest(device):
                ready.append(device)
                self.deferred.discard(device.uuid)
            elif device.uuid not in self.deferred:
                self.deferred.add(device.uuid)
                _log.info(
                    "acu_measure_deferred",
                    device=device.index,
                    utilisation_pct=device.telemetry.utilisation_pct,
                    used_mib=_used_mib(device),
                )
        if ready:
            await self._measure(ready, now=now)

    def _at_rest(self, device: DeviceFingerprint) -> bool:
        rest = self.rest_mib.get(device.uuid)
        return rest is None or _used_mib(device) <= rest + REST_MARGIN_MIB

    async def _measure(self, ready: Sequence[DeviceFingerprint], *, now: float) -> None:
        try:
            measured = await self._run([d.index for d in ready])
            failed = ""
        except MeasureFailed as exc:
            measured, failed = exc.measured, str(exc)
        if measured is None:  # PyTorch is there but reaches no device
            self.unavailable = True
            _log.info("acu_not_measured", reason=SKIP_REASON)
            return
        for device in ready:
            if device.index in measured:
                previous = self.tflops.get(device.uuid)
                self.tflops[device.uuid] = measured[device.index]
                self.rounds[device.uuid] = now
                self.failures.pop(device.uuid, None)
                used = _used_mib(device)
                self.rest_mib[device.uuid] = min(self.rest_mib.get(device.uuid, used), used)
                _log.info(
                    "acu_measured",
                    device=device.index,
                    uuid=device.uuid,
                    tflops_fp16=round(measured[device.index], 1),
                    previous=round(previous, 1) if previous is not None else None,
                )
            else:
                tries = self.failures[device.uuid] = self.failures.get(device.uuid, 0) + 1
                if tries >= MAX_TRIES:
                    self.rounds[device.uuid] = now
                _log.warning(
                    "acu_measure_failed",
                    device=device.index,
                    uuid=device.uuid,
                    tries=tries,
                    gives_up=tries >= MAX_TRIES,
                    error=failed or "the benchmark gave no figure for it",
                )

    def apply(self, device: DeviceFingerprint, *, bench_tflops: float | None) -> DeviceFingerprint:
        return with_measured(device, self.tflops.get(device.uuid), bench_tflops=bench_tflops)
