"""NVML on a real GPU, and the node agent over it (skipped where libnvidia-ml
cannot be loaded)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from agents import benchmark, nvml
from agents.backstopping import nvml_processes
from agents.parsing import nvml_readings
from agents.running import run_node
from hcs_bus import subjects
from hcs_bus.messages import NodeFingerprint
from hcs_bus.settings import AgentSettings, KubeSettings, Settings
from tests.agents.test_publishing import collect, until

pytestmark = pytest.mark.skipif(not nvml.available(), reason=nvml.SKIP_REASON)


def test_every_gpu_nvml_sees_becomes_a_fingerprint_with_a_profile(db) -> None:
    readings = nvml.read_all()
    parsed = nvml_readings.convert(readings, db=db)
    assert parsed.errors == () and len(parsed.devices) == len(readings) >= 1
    first = parsed.devices[0]
    assert first.uuid.startswith("GPU-") and first.vram_total_mib > 1024
    assert first.pci_bus_id.count(":") == 2 and first.compute_capability
    assert first.compute.acu_profile > 0, f"no profile for {readings[0]['name']!r}"


async def test_the_node_agent_publishes_this_gpu_with_its_measured_compute(bus, db) -> None:
    """The agent's own path on a real GPU: NVML detection, the FP16 measurement
    where PyTorch is present, and a fingerprint on the real bus."""
    got: list = []
    sub = await collect(bus, subjects.fp("gpu-node"), got)
    used_before = used_mib(0)
    settings = Settings(
        kube=KubeSettings(mode="none"),
        agent=AgentSettings(node_name="gpu-node", report_interval_s=0.5),
    )
    task = asyncio.get_running_loop().create_task(run_node(bus, settings=settings, db=db))
    try:
        await until(lambda: bool(got), timeout_s=90.0)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await sub.unsubscribe()
    fp: NodeFingerprint = got[0][1]
    assert not fp.simulated and len(fp.devices) == len(nvml.read_all())
    device = fp.devices[0]
    profile = db.get(f"{device.vendor}/{device.model}")
    compute = device.compute
    assert compute.acu_profile == round(profile.acu, 2)
    if benchmark.backend() is None:  # NVML without PyTorch: the profile alone
        assert compute.tflops_fp16_measured is None and compute.acu == compute.acu_profile
        return
    assert compute.tflops_fp16_measured is not None and compute.tflops_fp16_measured > 1.0
    achieved = device.telemetry.achieved_tflops_fp16  # what the healer compares
    assert achieved == pytest.approx(compute.tflops_fp16_measured, abs=0.06)
    if profile.bench_tflops_fp16 is None:
        assert compute.acu_measured is None and compute.acu == compute.acu_profile
    else:
        scaled = compute.acu_profile * compute.tflops_fp16_measured / profile.bench_tflops_fp16
        assert compute.acu_measured == pytest.approx(scaled, abs=0.01)
        assert 0.75 < compute.acu_measured / compute.acu_profile < 1.2, compute
    # the benchmark ran in a child that took its context and cache with it: the
    # agent (this process) holds nothing on the GPU, which has its memory back
    assert os.getpid() not in {p.pid for p in nvml_processes()}
    await until(lambda: used_mib(0) < used_before + 256, timeout_s=10.0)


def used_mib(index: int) -> int:
    reading = nvml.read_all()[index]
    return (reading["memory_total_b"] - reading["memory_free_b"]) // 2**20


async def test_the_event_watcher_registers_every_gpu_that_reports_xid_or_ecc_events(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import pynvml

    pynvml.nvmlInit()
    wanted = nvml.wanted_events()
    supported = [
        pynvml.nvmlDeviceGetSupportedEventTypes(pynvml.nvmlDeviceGetHandleByIndex(i)) & wanted
        for i in range(pynvml.nvmlDeviceGetCount())
    ]
    watcher = nvml.EventWatcher(node="gpu-node", publish=lambda event: None, wall=time.time)
    watcher.start(asyncio.get_running_loop())
    try:
        assert await asyncio.to_thread(watcher.ready.wait, 30.0)
        assert watcher.failure is None and watcher.alive()
        assert watcher.registered == [i for i, kinds in enumerate(supported) if kinds]
    finally:
        await asyncio.to_thread(watcher.stop)
    assert not watcher.alive()
    with capsys.disabled():
        print(f"\nNVML events wanted and supported, per GPU: {[hex(k) for k in supported]}")
