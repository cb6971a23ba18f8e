"""AllocationEvents as the extender publishes them on ``hcs.alloc.<node>``, for
the tests of what is derived from them (metering, ``hcs usage``)."""

from __future__ import annotations

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import AllocationEvent, AllocState, DeviceSlice, PodRef


def allocation(
    state: AllocState,
    time_s: float,
    *,
    pod: str,
    namespace: str = "ml",
    devices: int = 1,
    vram_mib: int = 16384,
    model: str = "A100-80G",
) -> AllocationEvent:
    """``pod``'s ``devices`` NVIDIA GPUs on gpu-node-a, ``vram_mib`` and 100 ACU each."""
    return AllocationEvent(
        node="gpu-node-a",
        pod=PodRef(namespace=namespace, name=pod, uid=f"uid-{pod}"),
        state=state,
        time_s=time_s,
        devices=tuple(
            DeviceSlice(index=i, uuid=f"GPU-{i}", vram_mib=vram_mib) for i in range(devices)
        ),
        vendor="nvidia",
        model=model,
        acu=100.0 * devices,
    )


async def publish(bus: Bus, *events: AllocationEvent) -> None:
    """Each event on its node's subject, de-duplicated by pod, state and time."""
    for e in events:
        msg_id = f"{e.pod.name}:{e.state}:{e.time_s}"
        await bus.publish(subjects.alloc(e.node), e, msg_id=msg_id)
