"""The node's labels and extended resources in Kubernetes.

Labels ``hcs.io/vendor``, ``hcs.io/model``, ``hcs.io/network-group`` (and
``hcs.io/rdma-fabric`` where known); capacity ``ai.compute/vram`` (MiB) and
``ai.compute/acu`` on Node status, from the healthy devices. Written only when
they change; with no cluster configured the agent logs once and carries on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from hcs_bus.errors import KubeError
from hcs_bus.kube import Kube
from hcs_bus.messages import DeviceFingerprint
from hcs_bus.profiles import Profile
from hcs_bus.telemetry import logger

_log = logger("hcs.agent.labeling")

VENDOR = "hcs.io/vendor"
MODEL = "hcs.io/model"
NETWORK_GROUP = "hcs.io/network-group"
RDMA_FABRIC = "hcs.io/rdma-fabric"
VRAM = "ai.compute/vram"
ACU = "ai.compute/acu"


def node_labels(
    base: Mapping[str, str],
    *,
    profiles: Iterable[Profile],
    network_group: str | None,
    rdma_fabric: str | None = None,
) -> dict[str, str]:
    """Labels for a node whose devices have these profiles (first model wins
    when mixed; ``mixed`` names the case)."""
    out = dict(base)
    models = sorted({(p.vendor, p.model) for p in profiles})
    if models:
        vendors = {v for v, _ in models}
        out[VENDOR] = models[0][0] if len(vendors) == 1 else "mixed"
        out[MODEL] = models[0][1] if len(models) == 1 else "mixed"
    if network_group:
        out[NETWORK_GROUP] = network_group
    if rdma_fabric:
        out[RDMA_FABRIC] = rdma_fabric
    return out


def labels_of_devices(
    devices: Sequence[DeviceFingerprint], *, base: Mapping[str, str]
) -> dict[str, str]:
    out = dict(base)
    good = sorted({(d.vendor, d.model) for d in devices if not d.error})
    if good:
        out[VENDOR] = good[0][0] if len({v for v, _ in good}) == 1 else "mixed"
        out[MODEL] = good[0][1] if len(good) == 1 else "mixed"
    return out


def capacity(devices: Sequence[DeviceFingerprint]) -> dict[str, int]:
    """Extended resources from the devices that are usable (no error)."""
    usable = [d for d in devices if not d.error]
    return {
        VRAM: sum(d.vram_total_mib for d in usable),
        ACU: int(sum(d.compute.acu for d in usable)),
    }


class Labeler:
    """Writes labels and capacity when they differ from what was last written."""

    def __init__(self, kube: Kube | None, *, node: str) -> None:
        self.kube = kube
        self.node = node
        self.written_labels: dict[str, str] | None = None
        self.written_capacity: dict[str, int] | None = None
        self._warned = False

    async def apply(self, labels: Mapping[str, str], devices: Sequence[DeviceFingerprint]) -> bool:
        """True when something was written."""
        if self.kube is None:
            if not self._warned:
                _log.info("labels_skipped", node=self.node, reason="no Kubernetes cluster")
                self._warned = True
            return False
        hcs = {k: v for k, v in labels.items() if k.startswith("hcs.io/")}
        cap = capacity(devices)
        wrote = False
        try:
            if hcs != self.written_labels:
                await self.kube.patch_node_labels(self.node, dict(hcs))
                self.written_labels, wrote = hcs, True
            if cap != self.written_capacity:
                await self.kube.patch_node_capacity(self.node, cap)
                self.written_capacity, wrote = cap, True
        except KubeError as exc:
            _log.warning("labels_failed", node=self.node, error=str(exc))
        if wrote:
            _log.info("node_labelled", node=self.node, labels=hcs, capacity=cap)
        return wrote
