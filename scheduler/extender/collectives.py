"""Collective-library flags written at bind (``hcs.io/collective-*``). Pure.

The injector wires each vendor's collective-library env from these pod
annotations through the downward API (injector/data/runtimes.yaml); the
kubelet resolves them when the container starts, after the Binding set them.
Values are "0" or "1"; an annotation a vendor's runtime does not read is not
written (``READ_BY``).

Rules, from the chosen devices (their fingerprints' links and NUMA nodes) and
the node's labels (``NodeView.labels``: Node labels first):

* ``hcs.io/collective-p2p-disable`` (NCCL_P2P_DISABLE for NVIDIA, Hygon RCCL,
  Iluvatar; CNCL_MLULINK_DISABLE for Cambricon; MCCL_P2P_DISABLE for Moore
  Threads): "0" when every pair of chosen devices is joined by a peer link
  (``PEER_LINKS``: nvlink, hccs, xgmi, mlulink; a link listed by either
  device of the pair counts), else "1". A pair joined only through PCIe is
  not trusted for peer-to-peer (whether PCIe P2P works depends on ACS, IOMMU
  and root-complex settings no fingerprint reports, and a broken P2P path
  hangs the collective, while disabling it only routes through host
  memory) — so in particular a set spanning NUMA nodes without peer links
  is always disabled. A single device has no peer to reach: "0" (the
  library's default), so every pod of a vendor carries the same keys.
* ``hcs.io/collective-ib-disable`` (NCCL_IB_DISABLE, NVIDIA): "1" when the
  node has no RDMA fabric (no non-empty ``hcs.io/rdma-fabric`` label on its
  Node or, for a node without a Node object, in its fingerprint), else "0".
* ``hcs.io/collective-intra-pcie`` / ``hcs.io/collective-intra-roce``
  (HCCL_INTRA_PCIE_ENABLE / HCCL_INTRA_ROCE_ENABLE, Huawei): "1"/"0" when the
  chosen devices are pairwise HCCS-linked (and for a single device: HCCL's
  own defaults), "0"/"1" when they are not, so traffic between NPUs without
  HCCS goes over RoCE. The agent reads those links from ``npu-smi info -t
  topo`` (``HCCS``; an A3's ``HCCS_SW`` and ``SIO``), so NPUs it could not
  read a matrix for count as not linked.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence

from hcs_bus import vocabulary
from hcs_bus.messages import DeviceFingerprint
from scheduler.view.state import RDMA_FABRIC_LABEL

P2P_DISABLE = vocabulary.COLLECTIVE_P2P_DISABLE
IB_DISABLE = vocabulary.COLLECTIVE_IB_DISABLE
INTRA_PCIE = vocabulary.COLLECTIVE_INTRA_PCIE
INTRA_ROCE = vocabulary.COLLECTIVE_INTRA_ROCE
PEER_LINKS = frozenset({"nvlink", "hccs", "xgmi", "mlulink"})

# The collective annotations each vendor's runtime reads (injector/data/runtimes.yaml).
READ_BY: dict[str, frozenset[str]] = {
    "nvidia": frozenset({P2P_DISABLE, IB_DISABLE}),
    "huawei": frozenset({INTRA_PCIE, INTRA_ROCE}),
    "hygon": frozenset({P2P_DISABLE}),
    "cambricon": frozenset({P2P_DISABLE}),
    "mthreads": frozenset({P2P_DISABLE}),
    "iluvatar": frozenset({P2P_DISABLE}),
}


def collective_annotations(
    *,
    vendor: str,
    chosen: Sequence[int],
    devices: Mapping[int, DeviceFingerprint],
    labels: Mapping[str, str],
) -> dict[str, str]:
    """The ``hcs.io/collective-*`` annotations for ``chosen`` device indices of
    a node whose device fingerprints are ``devices`` (a chosen index missing
    there has no links of its own) and whose labels are ``labels``."""
    wanted = READ_BY.get(vendor, frozenset())
    if not wanted:
        return {}
    flags: dict[str, str] = {}
    if P2P_DISABLE in wanted:
        flags[P2P_DISABLE] = "0" if all_linked(chosen, devices, kinds=PEER_LINKS) else "1"
    if IB_DISABLE in wanted:
        flags[IB_DISABLE] = "0" if labels.get(RDMA_FABRIC_LABEL) else "1"
    if INTRA_PCIE in wanted or INTRA_ROCE in wanted:
        hccs = all_linked(chosen, devices, kinds=frozenset({"hccs"}))
        flags[INTRA_PCIE] = "1" if hccs else "0"
        flags[INTRA_ROCE] = "0" if hccs else "1"
    return {k: v for k, v in flags.items() if k in wanted}


def all_linked(
    chosen: Sequence[int], devices: Mapping[int, DeviceFingerprint], *, kinds: frozenset[str]
) -> bool:
    """Whether every pair of ``chosen`` is joined by a link of one of ``kinds``
    (listed by either side); trivially true for fewer than two devices."""
    distinct = dict.fromkeys(chosen)
    if len(distinct) < 2:  # a slice or one device: no pair to look up the links for
        return True
    pairs = _linked_pairs(devices.values(), kinds=kinds)
    return all(frozenset(pair) in pairs for pair in itertools.combinations(distinct, 2))


def _linked_pairs(
    devices: Iterable[DeviceFingerprint], *, kinds: frozenset[str]
) -> set[frozenset[int]]:
    return {
        frozenset((device.index, link.peer_index))
        for device in devices
        for link in device.links
        if link.type in kinds and link.peer_index != device.index
    }
