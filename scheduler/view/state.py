"""The cluster view: pure state derived from fingerprints, verdicts and
reservations. No I/O, no clock reads (``now`` is passed in).

* Fingerprints are applied in (boot, seq) order per node
  (``hcs_bus.ordering``): a lower ``seq`` of the same boot, or a boot already
  replaced, is old and ignored, and never becomes the node's state; the
  body's ``time_s`` is never compared.
* Times are the bus server's: a fingerprint is applied with the server's
  receive time (``now``, the message's metadata timestamp) and staleness is
  judged against the server's clock (``hcs_bus.clocks.BusClock``), so an
  agent whose clock is hours off stays fresh while it reports, and a node
  replayed from an hour-old fingerprint is stale at once.
* Verdicts come from the healer (``HealthEvent`` source ``healer``, kind
  ``verdict``); they override a device's health and may isolate it.
* Reservations are the KV ``hcs_alloc`` documents; free VRAM is always
  ``total − reserved`` (never the agent's physical reading, which already
  contains what HCS handed out).
* A node whose fingerprints stop for ``stale_after_s`` is stale: kept in the
  view (for ``hcs top``) but not schedulable.
* Labels of the Node objects (fed from the Node watch) sit beside the
  fingerprints and outlive them. A node's ``labels`` are its fingerprint's
  overlaid by its Node's; the network labels (``NETWORK_LABELS``) are the
  Node's alone once its Node is known — one removed from the Node stops
  counting, whatever the fingerprint says. Fingerprint network labels count
  only for nodes without a Node object (no cluster configured, a simulated
  fleet not mapped onto Nodes).
* A Node that takes no new pods (``blocked``: cordoned, or tainted by the
  node lifecycle: not ready, unreachable, under pressure) is not schedulable
  either: its free devices are room no pod can reach, and a plan into a
  class whose only room is there would strand the pod (bench.burst: a
  hollow kubelet that stopped renewing its lease drew 40 pods that stayed
  Pending while two other classes had room).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

from hcs_bus import vocabulary
from hcs_bus.messages import (
    DeviceFingerprint,
    DeviceSlice,
    HealthEvent,
    NodeFingerprint,
    NodeReservations,
    Reservation,
    Verdict,
)
from hcs_bus.ordering import FingerprintOrder

# Placement groups, in the order they name a node's group (placing.network_group).
NETWORK_LABELS = (vocabulary.RDMA_FABRIC_LABEL, vocabulary.NETWORK_GROUP_LABEL)
RDMA_FABRIC_LABEL = NETWORK_LABELS[0]


@dataclass(slots=True)
class DeviceView:
    """One device as the scheduler sees it."""

    fp: DeviceFingerprint
    reserved_mib: int = 0
    whole_owner: str | None = None
    slice_owners: set[str] = field(default_factory=set)
    verdict: Verdict = "healthy"
    health_score: int = 100

    @property
    def index(self) -> int:
        return self.fp.index

    @property
    def free_mib(self) -> int:
        if self.whole_owner is not None:
            return 0
        fp = self.fp  # vram_usable_mib, inline: the filter's and the summary's hot path
        return max(fp.vram_total_mib - fp.vram_driver_mib - self.reserved_mib, 0)

    @property
    def usable(self) -> bool:
        """Healthy enough to place on: not failed, no detector error."""
        return self.verdict != "failed" and self.fp.error is None

    @property
    def idle(self) -> bool:
        return self.whole_owner is None and not self.slice_owners


@dataclass(slots=True)
class NodeView:
    name: str
    fingerprint: NodeFingerprint
    seen_at: float
    devices: dict[int, DeviceView]
    reservations: dict[str, Reservation] = field(default_factory=dict)
    stale: bool = False
    verdict: Verdict = "healthy"
    node_labels: Mapping[str, str] | None = None  # the Node object's; None: no Node seen
    blocked: str | None = None  # why its Node takes no new pods; None: it does

    @property
    def labels(self) -> dict[str, str]:
        """Fingerprint labels overlaid by the Node's; network labels from the
        Node alone once it is known (module docstring)."""
        return merged_labels(self.fingerprint.labels, self.node_labels)

    @property
    def schedulable(self) -> bool:
        return not self.stale and self.verdict != "failed" and self.blocked is None

    def models(self) -> set[str]:
        return {f"{d.fp.vendor}/{d.fp.model}" for d in self.devices.values()}


def pod_key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


class ClusterState:
    """Everything the scheduler knows, rebuilt from the bus at start."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeView] = {}
        # node → device index (None: the node) → (verdict, score)
        self._verdicts: dict[str, dict[int | None, tuple[Verdict, int]]] = {}
        self._reservations: dict[str, NodeReservations] = {}
        self._revisions: dict[str, int] = {}  # KV revision of each document held
        self._node_labels: dict[str, dict[str, str]] = {}
        self._node_blocks: dict[str, str] = {}  # Node name → why it takes no new pods
        self.order = FingerprintOrder()

    # -- applying ---------------------------------------------------------
    def apply_fingerprint(self, fp: NodeFingerprint, *, now: float) -> bool:
        """Apply a snapshot the bus server received at ``now`` (its clock);
        False (and counted) when it is older than held."""
        if not self.order.admit(fp):
            return False
        held = self.nodes.get(fp.node)
        if held is not None and _same_devices(held, fp):
            _refresh(held, fp, now=now)  # the common case: a periodic report
            self._restore_verdicts(held)
            return True
        node = NodeView(
            name=fp.node,
            fingerprint=fp,
            seen_at=now,
            devices={d.index: DeviceView(fp=d, health_score=d.health_score) for d in fp.devices},
            node_labels=self._node_labels.get(fp.node),
            blocked=self._node_blocks.get(fp.node),
        )
        if held is not None:
            node.verdict = held.verdict
        self.nodes[fp.node] = node
        self._restore_verdicts(node)
        reservations = self._reservations.get(fp.node)
        if reservations is not None:
            _book(node, reservations)
        return True

    def apply_health(self, event: HealthEvent) -> bool:
        """Apply a healer verdict; other events do not change the view."""
        if event.source != "healer" or event.kind != "verdict" or event.verdict is None:
            return False
        score = event.health_score if event.health_score is not None else _score(event.verdict)
        self._verdicts.setdefault(event.node, {})[event.device] = (event.verdict, score)
        node = self.nodes.get(event.node)
        if node is not None:
            _apply_verdict(node, event.device, event.verdict, score)
        return True

    def apply_reservations(
        self, node_name: str, doc: NodeReservations | None, *, revision: int | None = None
    ) -> None:
        """Replace a node's reservations with the KV document (None = deleted)
        at KV ``revision`` (None: not known)."""
        if doc is None:
            self._reservations.pop(node_name, None)
        else:
            self._reservations[node_name] = doc
        if doc is None or revision is None:
            self._revisions.pop(node_name, None)
        else:
            self._revisions[node_name] = revision
        node = self.nodes.get(node_name)
        if node is not None:
            _book(node, doc)

    def apply_node(
        self, node_name: str, labels: Mapping[str, str] | None, *, blocked: str | None = None
    ) -> bool:
        """Hold the labels of the Node object ``node_name`` (None: the Node was
        deleted) and why it takes no new pods (``blocked``; None: it does);
        True when either differs from what was held, so whatever was derived
        from the node must be recomputed."""
        held = self._node_labels.get(node_name)
        fresh = None if labels is None else dict(labels)
        block = None if labels is None else blocked
        if fresh == held and block == self._node_blocks.get(node_name):
            return False
        if fresh is None:
            self._node_labels.pop(node_name, None)
        else:
            self._node_labels[node_name] = fresh
        if block is None:
            self._node_blocks.pop(node_name, None)
        else:
            self._node_blocks[node_name] = block
        node = self.nodes.get(node_name)
        if node is not None:
            node.node_labels, node.blocked = fresh, block
        return True

    @property
    def stale_ignored(self) -> int:
        """Fingerprints ignored as older than the one applied."""
        return self.order.ignored

    def mark_stale(self, *, now: float, stale_after_s: float) -> list[str]:
        """Mark nodes whose latest fingerprint the server received more than
        ``stale_after_s`` before ``now`` (the server's clock); returns the
        newly stale."""
        newly: list[str] = []
        for node in self.nodes.values():
            is_stale = now - node.seen_at > stale_after_s
            if is_stale and not node.stale:
                newly.append(node.name)
            node.stale = is_stale
        return newly

    # -- reading ----------------------------------------------------------
    def schedulable(self) -> Iterator[NodeView]:
        return (n for n in self.nodes.values() if n.schedulable)

    def reservations_of(self, node_name: str) -> NodeReservations | None:
        return self._reservations.get(node_name)

    def ledger(self) -> list[NodeReservations]:
        """Every node's reservations document held, nodes not reported yet too."""
        return list(self._reservations.values())

    def revision_of(self, node_name: str) -> int | None:
        """The KV revision of the document ``reservations_of`` holds, if known."""
        return self._revisions.get(node_name)

    def find_pod(self, key: str) -> tuple[str, Reservation] | None:
        for node in self.nodes.values():
            found = node.reservations.get(key)
            if found is not None:
                return node.name, found
        return None

    def _restore_verdicts(self, node: NodeView) -> None:
        for index, (verdict, score) in self._verdicts.get(node.name, {}).items():
            _apply_verdict(node, index, verdict, score)


def merged_labels(fingerprint: Mapping[str, str], node: Mapping[str, str] | None) -> dict[str, str]:
    """A node's labels: the fingerprint's, overlaid by the Node's when the Node
    is known, whose network labels then replace the fingerprint's entirely."""
    if node is None:
        return dict(fingerprint)
    out = {k: v for k, v in fingerprint.items() if k not in NETWORK_LABELS}
    out.update(node)
    return out


def _score(verdict: Verdict) -> int:
    return {"healthy": 100, "degraded": 60, "failed": 0}[verdict]


def _same_devices(node: NodeView, fp: NodeFingerprint) -> bool:
    """The report names the same devices (index and UUID) as the one held."""
    held = node.devices
    return len(held) == len(fp.devices) and all(
        (view := held.get(d.index)) is not None and view.fp.uuid == d.uuid for d in fp.devices
    )


def _refresh(node: NodeView, fp: NodeFingerprint, *, now: float) -> None:
    """Take a new report of the same devices in place: what building the node
    afresh gives (reservations booked as before, verdicts to be restored),
    without rebuilding it (most of the view's ingest time went there)."""
    node.fingerprint, node.seen_at, node.stale = fp, now, False
    for d in fp.devices:
        view = node.devices[d.index]
        view.fp, view.health_score, view.verdict = d, d.health_score, "healthy"


def _apply_verdict(node: NodeView, index: int | None, verdict: Verdict, score: int) -> None:
    if index is None:
        node.verdict = verdict
        return
    device = node.devices.get(index)
    if device is not None:
        device.verdict = verdict
        device.health_score = min(score, device.fp.health_score)


def _book(node: NodeView, doc: NodeReservations | None) -> None:
    for device in node.devices.values():
        device.reserved_mib = 0
        device.whole_owner = None
        device.slice_owners = set()
    node.reservations = {}
    if doc is None:
        return
    for reservation in doc.reservations:
        if reservation.state not in ("reserved", "bound"):
            continue
        key = pod_key(reservation.pod.namespace, reservation.pod.name)
        node.reservations[key] = reservation
        hold_slices(node, key, reservation.devices)


def hold_slices(node: NodeView, owner: str, slices: Iterable[DeviceSlice]) -> None:
    """Book ``slices`` on ``node``'s devices for ``owner``."""
    for slice_ in slices:
        device = node.devices.get(slice_.index)
        if device is None:
            continue
        device.reserved_mib += slice_.vram_mib
        if slice_.whole:
            device.whole_owner = owner
        else:
            device.slice_owners.add(owner)


def booked(node: NodeView, doc: NodeReservations | None) -> NodeView:
    """A copy of ``node`` holding ``doc`` as its reservations (verdicts kept):
    what the node would look like with that KV document."""
    copy = NodeView(
        name=node.name,
        fingerprint=node.fingerprint,
        seen_at=node.seen_at,
        devices={
            i: DeviceView(fp=d.fp, verdict=d.verdict, health_score=d.health_score)
            for i, d in node.devices.items()
        },
        stale=node.stale,
        verdict=node.verdict,
        node_labels=node.node_labels,
    )
    _book(copy, doc)
    return copy


def free_for_work(node: NodeView, device: DeviceView) -> int:
    """VRAM a pod could still get on ``device``: none on a failed device or a
    stale or failed node, however little is reserved there."""
    return device.free_mib if node.schedulable and device.usable else 0


def fleet_totals(nodes: Iterable[NodeView]) -> dict[str, float]:
    """Devices, VRAM and ACU totals over nodes (for ``hcs top``)."""
    totals = {"nodes": 0.0, "devices": 0.0, "vram_total_mib": 0.0, "vram_free_mib": 0.0}
    totals |= {"acu": 0.0, "unhealthy_devices": 0.0}
    for node in nodes:
        totals["nodes"] += 1
        for device in node.devices.values():
            totals["devices"] += 1
            totals["vram_total_mib"] += device.fp.vram_usable_mib
            totals["vram_free_mib"] += free_for_work(node, device)
            totals["acu"] += device.fp.compute.acu
            totals["unhealthy_devices"] += device.verdict != "healthy"
    return totals
