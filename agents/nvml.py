"""NVIDIA devices through NVML (nvidia-ml-py): raw readings and event waits.

``read_all`` returns the plain dicts ``agents.parsing.nvml_readings`` converts;
``EventWatcher`` runs ``nvmlEventSetWait`` in a thread and hands Xid / ECC
events to the loop. Every call that a GPU may not support is guarded: a
missing reading is left out, never guessed.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from agents import xids
from hcs_bus.messages import HealthEvent
from hcs_bus.telemetry import logger
from hcs_bus.vocabulary import Kind

_log = logger("hcs.agent.nvml")
SKIP_REASON = "needs an NVIDIA GPU with NVML (libnvidia-ml.so.1 not loadable)"


def available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    return True


def _try(fn: Callable[..., Any], *args: Any) -> Any:
    import pynvml

    try:
        return fn(*args)
    except pynvml.NVMLError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _fields(handle: Any) -> dict[str, int]:
    import pynvml as n

    ids = {
        "ecc_sbe_volatile": n.NVML_FI_DEV_ECC_SBE_VOL_TOTAL,
        "ecc_dbe_volatile": n.NVML_FI_DEV_ECC_DBE_VOL_TOTAL,
        "remapped_cor": n.NVML_FI_DEV_REMAPPED_COR,
        "remapped_unc": n.NVML_FI_DEV_REMAPPED_UNC,
        "remap_pending": n.NVML_FI_DEV_REMAPPED_PENDING,
        "remap_failure": n.NVML_FI_DEV_REMAPPED_FAILURE,
        "pcie_replay": n.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    }
    values = _try(n.nvmlDeviceGetFieldValues, handle, list(ids.values()))
    out: dict[str, int] = {}
    if values is None:
        return out
    for name, value in zip(ids, values, strict=True):
        if value.nvmlReturn == n.NVML_SUCCESS:
            out[name] = int(value.value.ullVal)  # all these fields are unsigned counters
    return out


def _nvlinks(handle: Any) -> list[dict[str, Any]]:
    import pynvml as n

    links = []
    for link in range(n.NVML_NVLINK_MAX_LINKS):
        state = _try(n.nvmlDeviceGetNvLinkState, handle, link)
        if state is None:
            break
        if not state:
            continue
        remote = _try(n.nvmlDeviceGetNvLinkRemotePciInfo, handle, link)
        kind = _try(n.nvmlDeviceGetNvLinkRemoteDeviceType, handle, link)
        links.append(
            {
                "link": link,
                "version": _try(n.nvmlDeviceGetNvLinkVersion, handle, link) or 0,
                "remote_bus_id": _text(remote.busId) if remote is not None else "",
                "remote_type": {0: "gpu", 2: "switch"}.get(kind, "unknown")
                if kind is not None
                else "gpu",
            }
        )
    return links


def read_one(handle: Any, index: int) -> dict[str, Any]:
    import pynvml as n

    memory = n.nvmlDeviceGetMemoryInfo(handle)
    pci = n.nvmlDeviceGetPciInfo(handle)
    util = _try(n.nvmlDeviceGetUtilizationRates, handle)
    power = _try(n.nvmlDeviceGetPowerUsage, handle)
    limit = _try(n.nvmlDeviceGetEnforcedPowerLimit, handle)
    reading: dict[str, Any] = {
        "index": index,
        "name": _text(n.nvmlDeviceGetName(handle)),
        "uuid": _text(n.nvmlDeviceGetUUID(handle)),
        "pci_bus_id": _text(pci.busId),
        "pci_device_id": int(pci.pciDeviceId),
        "memory_total_b": int(memory.total),
        "memory_free_b": int(memory.free),
        # what the driver and firmware hold (v2 API; None where unsupported),
        # which the fingerprint keeps out of what slices are counted against
        "memory_reserved_b": _reserved_b(handle),
        "cuda_capability": _try(n.nvmlDeviceGetCudaComputeCapability, handle),
        "sm_clock_mhz": _try(n.nvmlDeviceGetClockInfo, handle, n.NVML_CLOCK_SM) or 0,
        "max_sm_clock_mhz": _try(n.nvmlDeviceGetMaxClockInfo, handle, n.NVML_CLOCK_SM) or 0,
        "clock_event_reasons": _try(n.nvmlDeviceGetCurrentClocksEventReasons, handle) or 0,
        "fields": _fields(handle),
        "pcie_gen": _try(n.nvmlDeviceGetCurrPcieLinkGeneration, handle),
        "pcie_width": _try(n.nvmlDeviceGetCurrPcieLinkWidth, handle),
        "numa_node": _try(n.nvmlDeviceGetNumaNodeId, handle),
        "temperature_c": _try(n.nvmlDeviceGetTemperature, handle, n.NVML_TEMPERATURE_GPU) or 0,
        "utilisation_pct": util.gpu if util is not None else 0,
        "power_w": power / 1000.0 if power is not None else 0.0,
        "power_limit_w": limit / 1000.0 if limit is not None else 0.0,
        "nvlinks": _nvlinks(handle),
    }
    return reading


def _reserved_b(handle: Any) -> int | None:
    import pynvml as n

    version = getattr(n, "nvmlMemory_v2", None)
    memory = _try(n.nvmlDeviceGetMemoryInfo, handle, version) if version else None
    return int(memory.reserved) if memory is not None else None


def read_all() -> list[dict[str, Any]]:
    """Readings of every GPU, with the PCIe common ancestor of each pair."""
    import pynvml as n

    n.nvmlInit()
    handles = [n.nvmlDeviceGetHandleByIndex(i) for i in range(n.nvmlDeviceGetCount())]
    readings = []
    for i, handle in enumerate(handles):
        try:
            reading = read_one(handle, i)
        except n.NVMLError as exc:
            reading = {"index": i, "error": str(exc)}
        readings.append(reading)
    for i, handle in enumerate(handles):
        ancestors = {}
        for j, other in enumerate(handles):
            level = _try(n.nvmlDeviceGetTopologyCommonAncestor, handle, other) if i != j else None
            if level is not None and "pci_bus_id" in readings[j]:
                ancestors[readings[j]["pci_bus_id"]] = int(level)
        readings[i]["common_ancestor"] = ancestors
    return readings


def wanted_events() -> int:
    """The NVML event types the watcher registers for, where a device has them."""
    import pynvml as n

    return (
        n.nvmlEventTypeXidCriticalError
        | n.nvmlEventTypeDoubleBitEccError
        | n.nvmlEventTypeSingleBitEccError
    )


class EventWatcher:
    """NVML event waits in a thread → HealthEvents on the loop (Xid, ECC).

    ``ready`` is set once every device is registered (``registered`` lists
    them) or the thread has failed (``failure`` says why, also logged)."""

    def __init__(
        self, *, node: str, publish: Callable[[HealthEvent], object], wall: Callable[[], float]
    ) -> None:
        self.node, self.publish, self.wall = node, publish, wall
        self.ready = threading.Event()
        self.registered: list[int] = []
        self.failure: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._thread = threading.Thread(
            target=self._guarded, args=(loop,), name="nvml-events", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _guarded(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            self._run(loop)
        except Exception as exc:  # a dead watcher must be seen, not vanish with its thread
            self.failure = f"{type(exc).__name__}: {exc}"
            _log.error("nvml_events_failed", node=self.node, error=self.failure)
        finally:
            self.ready.set()

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        import pynvml as n

        n.nvmlInit()
        events = n.nvmlEventSetCreate()
        wanted = wanted_events()
        try:
            for i in range(n.nvmlDeviceGetCount()):
                handle = n.nvmlDeviceGetHandleByIndex(i)
                supported = _try(n.nvmlDeviceGetSupportedEventTypes, handle) or 0
                if wanted & supported == 0:
                    _log.warning("nvml_events_unsupported", device=i)
                    continue
                try:
                    n.nvmlDeviceRegisterEvents(handle, wanted & supported, events)
                except n.NVMLError as exc:
                    _log.warning("nvml_events_unsupported", device=i, error=str(exc))
                else:
                    self.registered.append(i)
            self.ready.set()
            while not self._stop.is_set():
                try:
                    data = n.nvmlEventSetWait(events, 500)
                except n.NVMLError_Timeout:
                    continue
                loop.call_soon_threadsafe(self.publish, self._event(data, n))
        finally:
            n.nvmlEventSetFree(events)

    def _event(self, data: Any, n: Any) -> HealthEvent:
        import pynvml

        uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        index = _try(pynvml.nvmlDeviceGetIndex, data.device)
        if data.eventType == n.nvmlEventTypeXidCriticalError:
            code = int(data.eventData)
            return HealthEvent(
                node=self.node,
                kind=Kind.XID,
                severity=xids.severity(code),
                source="agent",
                time_s=self.wall(),
                device=index,
                device_uuid=uuid,
                code=code,
                message=f"Xid {code}",
            )
        dbe = data.eventType == n.nvmlEventTypeDoubleBitEccError
        return HealthEvent(
            node=self.node,
            kind=Kind.ECC_UNCORRECTED if dbe else Kind.ECC_CORRECTED,
            severity="critical" if dbe else "warning",
            source="agent",
            time_s=self.wall(),
            device=index,
            device_uuid=uuid,
            message="double-bit ECC error" if dbe else "single-bit ECC error",
        )
