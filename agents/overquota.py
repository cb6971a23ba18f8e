"""What the node-side VRAM backstop decides, without I/O.

The interceptor in each pod enforces its VRAM slice from inside; whatever gets
past it (a process without ``LD_PRELOAD``, a path it does not hook, an edited
accounting file) still shows in the device memory that the driver reports per
process. Here: those readings (NVML, npu-smi, hy-smi) are mapped to pods through
``/proc/<pid>/cgroup``, summed per pod and device, and compared with the pod's
``hcs.io/vram-quota`` annotation; an overrun becomes a ``HealthEvent`` naming
the pod and its processes, and the configured action (report, evict the pod,
kill processes) a plan of what to do.

Device numbering: readings carry host device indices; the quota's ``i:`` is the
pod's ``i``-th device, the ``i``-th index of its ``hcs.io/devices``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec

from agents.parsing import hy_smi, npu_smi
from hcs_bus import vocabulary
from hcs_bus.messages import HealthEvent
from hcs_bus.units import QuantityError, parse_quantity

QUOTA_ANNOTATION = vocabulary.VRAM_QUOTA
DEVICES_ANNOTATION = vocabulary.DEVICES
KIND = vocabulary.Kind.VRAM_OVER_QUOTA
MIB = 1 << 20

Action = Literal["report", "evict", "kill"]


class ProcessUsage(msgspec.Struct, frozen=True, kw_only=True):
    """Device memory one process holds on one device (host index)."""

    pid: int
    device: int
    used_b: int


class PodQuota(msgspec.Struct, frozen=True, kw_only=True):
    """A pod's VRAM quota. ``per_ordinal``: quota by the pod's device ordinal;
    ``every_device``: the quota of every device when one size is given."""

    uid: str
    namespace: str
    name: str
    devices: tuple[int, ...] = ()
    every_device: int | None = None
    per_ordinal: dict[int, int] = {}

    def quota_of(self, device: int) -> int | None:
        """The quota on a host device, None when the pod has none there."""
        if self.every_device is not None:
            return self.every_device
        if device not in self.devices:
            return None
        return self.per_ordinal.get(self.devices.index(device))


class Overrun(msgspec.Struct, frozen=True, kw_only=True):
    """A pod using more than its quota on one device."""

    pod: PodQuota
    device: int
    used_b: int
    quota_b: int
    processes: tuple[ProcessUsage, ...]


class Kill(msgspec.Struct, frozen=True, kw_only=True):
    pid: int
    reason: str


class Evict(msgspec.Struct, frozen=True, kw_only=True):
    namespace: str
    name: str
    uid: str
    reason: str


# ------------------------------------------------------------- cgroups ---

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# systemd driver: .../kubepods-burstable-pod<uid with _>.slice/...
# cgroupfs driver: /kubepods/burstable/pod<uid>/<container>
_POD = re.compile(rf"kubepods[^\n]*?[-/]pod({_UID})(?:\.slice|/|$)")


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID in the text of ``/proc/<pid>/cgroup`` (cgroup v1 or v2,
    systemd or cgroupfs driver), None for a process outside any pod."""
    for line in text.splitlines():
        path = line.split(":", 2)[-1]
        match = _POD.search(path)
        if match:
            return match.group(1).replace("_", "-")
    return None


# -------------------------------------------------------------- quotas ---


def parse_quota(text: str) -> tuple[int | None, dict[int, int]]:
    """``"16Gi"`` → (bytes, {}); ``"0:16Gi,1:8Gi"`` → (None, {0: …, 1: …}).
    Raises ValueError on anything else (the interceptor refuses it too)."""
    text = text.strip()
    if ":" not in text:
        return _bytes(text), {}
    per: dict[int, int] = {}
    for part in text.split(","):
        ordinal, _, size = part.partition(":")
        if not ordinal.strip().isdigit():
            raise ValueError(f"{part!r}: not <device>:<size>")
        per[int(ordinal)] = _bytes(size)
    return None, per


def _bytes(text: str) -> int:
    try:
        value = parse_quantity(text.strip())
    except QuantityError as exc:
        raise ValueError(str(exc)) from exc
    if value < 0:
        raise ValueError(f"{text!r}: negative")
    return int(value)


def pod_quota(pod: Mapping[str, Any]) -> PodQuota | None:
    """The quota of a pod object (Kubernetes JSON), None without a usable one."""
    meta = pod.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    text = annotations.get(QUOTA_ANNOTATION)
    if not text or not meta.get("uid"):
        return None
    try:
        every, per = parse_quota(str(text))
    except ValueError:
        return None
    devices = tuple(
        int(d)
        for d in str(annotations.get(DEVICES_ANNOTATION, "")).split(",")
        if d.strip().isdigit()
    )
    return PodQuota(
        uid=str(meta["uid"]),
        namespace=str(meta.get("namespace", "default")),
        name=str(meta.get("name", "")),
        devices=devices,
        every_device=every,
        per_ordinal=per,
    )


def quotas_of_pods(pods: Iterable[Mapping[str, Any]]) -> dict[str, PodQuota]:
    """Pods with a quota, by UID (pods that have finished hold no memory)."""
    out: dict[str, PodQuota] = {}
    for pod in pods:
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            continue
        quota = pod_quota(pod)
        if quota is not None:
            out[quota.uid] = quota
    return out


# ------------------------------------------------------------ judgement ---


def overruns(
    usages: Iterable[ProcessUsage],
    *,
    pod_of_pid: Mapping[int, str],
    quotas: Mapping[str, PodQuota],
    slack_per_process_b: int = 0,
) -> list[Overrun]:
    """Pods whose processes together hold more than their quota on a device.

    ``slack_per_process_b``: what the driver keeps per process outside any
    allocation the interceptor can see (its context), allowed on top.
    """
    groups: dict[tuple[str, int], list[ProcessUsage]] = {}
    for usage in usages:
        uid = pod_of_pid.get(usage.pid)
        if uid is None or uid not in quotas:
            continue
        groups.setdefault((uid, usage.device), []).append(usage)
    found = []
    for (uid, device), procs in sorted(groups.items()):
        pod = quotas[uid]
        quota = pod.quota_of(device)
        if quota is None:
            continue
        used = sum(p.used_b for p in procs)
        if used > quota + slack_per_process_b * len(procs):
            ordered = tuple(sorted(procs, key=lambda p: (-p.used_b, p.pid)))
            found.append(
                Overrun(pod=pod, device=device, used_b=used, quota_b=quota, processes=ordered)
            )
    return found


def health_event(overrun: Overrun, *, node: str, now: float, action: Action) -> HealthEvent:
    pod = overrun.pod
    pids = ",".join(str(p.pid) for p in overrun.processes)
    return HealthEvent(
        node=node,
        kind=KIND,
        severity="warning",
        source="agent",
        time_s=now,
        device=overrun.device,
        evidence={
            "namespace": pod.namespace,
            "pod": pod.name,
            "pod_uid": pod.uid,
            "pids": pids,
            "used_b": overrun.used_b,
            "quota_b": overrun.quota_b,
            "action": action,
        },
        message=(
            f"pod {pod.namespace}/{pod.name} uses {overrun.used_b // MIB} MiB on device "
            f"{overrun.device}, over its quota of {overrun.quota_b // MIB} MiB "
            f"(pids {pids}); action: {action}"
        ),
    )


def plan(overrun: Overrun, *, action: Action, slack_per_process_b: int = 0) -> list[Kill | Evict]:
    """What to do about one overrun. ``kill``: the largest processes first,
    just enough of them to bring the pod back within its quota."""
    pod = overrun.pod
    why = f"{overrun.used_b // MIB} MiB over a quota of {overrun.quota_b // MIB} MiB"
    if action == "evict":
        return [Evict(namespace=pod.namespace, name=pod.name, uid=pod.uid, reason=why)]
    if action != "kill":
        return []
    kills: list[Kill | Evict] = []
    used, left = overrun.used_b, len(overrun.processes)
    for proc in overrun.processes:
        if used <= overrun.quota_b + slack_per_process_b * left:
            break
        kills.append(Kill(pid=proc.pid, reason=why))
        used -= proc.used_b
        left -= 1
    return kills


# ------------------------------------------------------ vendor readings ---


def npu_smi_processes(text: str) -> list[ProcessUsage]:
    """The process table of ``npu-smi info``, each on its chip's device (the
    NPU id only on one-chip cards: not on a 310P Duo or an A3)."""
    return [
        ProcessUsage(pid=p.pid, device=p.device, used_b=p.memory_mib * MIB)
        for p in npu_smi.processes(text)
    ]


def hy_smi_processes(text: str) -> list[ProcessUsage]:
    """``hy-smi --showpids``, for processes on one device: a process on
    several is left out, the tool printing only its total."""
    return [
        ProcessUsage(pid=p.pid, device=p.devices[0], used_b=p.vram_mib * MIB)
        for p in hy_smi.processes(text)
        if len(p.devices) == 1
    ]


def usages_from_records(records: Sequence[Mapping[str, Any]]) -> list[ProcessUsage]:
    """Readings as plain dicts (``pid``, ``device``, ``used_b``), e.g. a recording."""
    return [
        ProcessUsage(pid=int(r["pid"]), device=int(r["device"]), used_b=int(r["used_b"]))
        for r in records
        if r.get("used_b") is not None
    ]


class Streaks:
    """Consecutive sweeps each (pod, device) has been over quota: an overrun
    is reported when it starts and acted on once it has lasted ``confirm``
    sweeps (device memory readings lag allocations a little)."""

    def __init__(self, *, confirm: int) -> None:
        self.confirm = max(1, confirm)
        self._count: dict[tuple[str, int], int] = {}

    def step(self, found: Sequence[Overrun]) -> tuple[list[Overrun], list[Overrun]]:
        """(overruns that just started, overruns confirmed in this sweep)."""
        counts = {}
        started, confirmed = [], []
        for overrun in found:
            key = (overrun.pod.uid, overrun.device)
            count = self._count.get(key, 0) + 1
            counts[key] = count
            if count == 1:
                started.append(overrun)
            if count >= self.confirm:
                confirmed.append(overrun)
        self._count = counts
        return started, confirmed
