"""The node-side VRAM backstop: a loop that reads per-process device memory
from the vendor library or tool, maps processes to pods through
``/proc/<pid>/cgroup``, and reports (and, if configured, acts on) pods over
their ``hcs.io/vram-quota``. Decisions are in ``agents.overquota``.

Readers: NVML ``nvmlDeviceGetComputeRunningProcesses`` (nvidia-ml-py), and the
process table of ``npu-smi info`` on Ascend. The pids are the host's: the
agent runs with ``hostPID`` or sees the host's /proc at ``agent.proc_root``.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from agents import nvml
from agents.overquota import (
    Action,
    Evict,
    Kill,
    ProcessUsage,
    Streaks,
    health_event,
    hy_smi_processes,
    npu_smi_processes,
    overruns,
    plan,
    pod_uid_of_cgroup,
    quotas_of_pods,
)
from hcs_bus.errors import KubeError
from hcs_bus.kube import Kube
from hcs_bus.messages import HealthEvent
from hcs_bus.settings import AgentSettings
from hcs_bus.telemetry import logger

_log = logger("hcs.agent.backstop")
MIB = 1 << 20
Reader = Callable[[], list[ProcessUsage]]


class HealthSink(Protocol):
    def health(self, event: HealthEvent) -> HealthEvent: ...


def nvml_processes() -> list[ProcessUsage]:
    """Device memory of every compute process on every NVIDIA device."""
    import pynvml as n

    n.nvmlInit()
    out = []
    for index in range(n.nvmlDeviceGetCount()):
        handle = n.nvmlDeviceGetHandleByIndex(index)
        for proc in n.nvmlDeviceGetComputeRunningProcesses(handle):
            used = getattr(proc, "usedGpuMemory", None)
            if used is not None:  # None: not available (e.g. under MIG without rights)
                out.append(ProcessUsage(pid=int(proc.pid), device=index, used_b=int(used)))
    return out


def tool_reader(
    argv: list[str], parse: Callable[[str], list[ProcessUsage]], *, timeout_s: float
) -> Reader:
    """A vendor tool's per-process readings (none when it fails)."""

    def read() -> list[ProcessUsage]:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
        return parse(done.stdout) if done.returncode == 0 else []

    return read


def readers(*, timeout_s: float) -> list[Reader]:
    """The per-process readings this node offers."""
    found: list[Reader] = []
    if nvml.available():
        found.append(nvml_processes)
    if shutil.which("npu-smi"):
        found.append(tool_reader(["npu-smi", "info"], npu_smi_processes, timeout_s=timeout_s))
    if shutil.which("hy-smi"):
        found.append(tool_reader(["hy-smi", "--showpids"], hy_smi_processes, timeout_s=timeout_s))
    return found


def pod_of(proc_root: Path, pid: int) -> str | None:
    try:
        return pod_uid_of_cgroup((proc_root / str(pid) / "cgroup").read_text())
    except OSError:  # gone, or not visible
        return None


class Backstop:
    """One sweep at a time: read → map → judge → report → act."""

    def __init__(
        self,
        *,
        node: str,
        kube: Kube | None,
        sink: HealthSink,
        readers: Sequence[Reader],
        action: Action,
        slack_mib: int,
        confirm_sweeps: int,
        proc_root: Path,
        kill: Callable[[int, int], None] = os.kill,
    ) -> None:
        self.node = node
        self.kube = kube
        self.sink = sink
        self.readers = list(readers)
        self.action: Action = action
        self.slack_b = slack_mib * MIB
        self.proc_root = proc_root
        self.kill = kill
        self.streaks = Streaks(confirm=confirm_sweeps)

    async def sweep(self, *, now: float) -> list[HealthEvent]:
        usages = [u for read in self.readers for u in await asyncio.to_thread(read)]
        if not usages or self.kube is None:
            self.streaks.step([])
            return []
        pods = await self.kube.list_pods(field_selector=f"spec.nodeName={self.node}")
        quotas = quotas_of_pods(pods)
        pod_of_pid = {}
        for pid in {u.pid for u in usages}:
            uid = pod_of(self.proc_root, pid)
            if uid is not None:
                pod_of_pid[pid] = uid
        found = overruns(
            usages, pod_of_pid=pod_of_pid, quotas=quotas, slack_per_process_b=self.slack_b
        )
        started, confirmed = self.streaks.step(found)
        events = [
            self.sink.health(health_event(o, node=self.node, now=now, action=self.action))
            for o in started
        ]
        for overrun in confirmed:
            for step in plan(overrun, action=self.action, slack_per_process_b=self.slack_b):
                await self._apply(step, uid=overrun.pod.uid)
        return events

    async def _apply(self, step: Kill | Evict, *, uid: str) -> None:
        if isinstance(step, Kill):
            # the pid may have been reused since the reading: only our pod's
            if pod_of(self.proc_root, step.pid) != uid:
                return
            try:
                self.kill(step.pid, signal.SIGKILL)
                _log.warning("vram_backstop_killed", pid=step.pid, pod_uid=uid, reason=step.reason)
            except ProcessLookupError:
                pass
            return
        assert self.kube is not None
        try:
            await self.kube.evict_pod(step.namespace, step.name, uid=step.uid)
            _log.warning(
                "vram_backstop_evicted", namespace=step.namespace, pod=step.name, reason=step.reason
            )
        except KubeError as exc:  # a PDB refuses (429), or the pod is gone: next sweep
            _log.warning(
                "vram_backstop_eviction_failed",
                namespace=step.namespace,
                pod=step.name,
                error=str(exc),
            )


async def run_backstop(
    *, node: str, kube: Kube | None, sink: HealthSink, settings: AgentSettings
) -> None:
    """Sweep every ``vram_backstop_interval_s`` until cancelled."""
    found = readers(timeout_s=settings.vendor_tool_timeout_s)
    if settings.vram_backstop_action == "off" or not found:
        _log.info("vram_backstop_idle", action=settings.vram_backstop_action, readers=len(found))
        return
    backstop = Backstop(
        node=node,
        kube=kube,
        sink=sink,
        readers=found,
        action=settings.vram_backstop_action,
        slack_mib=settings.vram_backstop_slack_mib,
        confirm_sweeps=settings.vram_backstop_confirm_sweeps,
        proc_root=Path(settings.proc_root),
    )
    while True:
        try:
            await backstop.sweep(now=time.time())
        except KubeError as exc:
            _log.warning("vram_backstop_sweep_failed", error=str(exc))
        await asyncio.sleep(settings.vram_backstop_interval_s)
