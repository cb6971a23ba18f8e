"""Writing the node's labels and extended resources to Kubernetes.

What to write is decided in :mod:`agents.labels`; here it is written: labels
by a merge patch on the Node (with ``ai.compute/collective`` and ``ai.compute/fabric``,
whose group may be the operator's label on the Node: learnt from the Node the
patch returns, and written again at once when it changes the fabric), capacity by a JSON Patch on ``nodes/<n>/status``
(both through :mod:`hcs_bus.kube`), each only when it differs from what was
last written, and everything again every ``resync_s`` (a Node deleted and
registered again has lost both). A Node that does not exist (yet) is logged
once and tried again after ``retry_s``, doubling while it stays missing (up
to ``resync_s``); another API error is logged when it changes and retried the
same way. With no cluster configured nothing is written and that is logged once.

``run_node`` keeps one :class:`Labeler`; fleet mode runs :func:`keep_labelled`
over every simulated node.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from agents.labels import capacity, collective_labels, valid_labels
from hcs_bus.errors import KubeError, KubeNotFound
from hcs_bus.kube import Kube
from hcs_bus.messages import DeviceFingerprint
from hcs_bus.telemetry import logger

_log = logger("hcs.agent.labeling")
RETRY_S = 30.0
RESYNC_S = 300.0
CONCURRENCY = 16


class Labeler:
    """One Node's labels and capacity, written when they change."""

    def __init__(
        self,
        kube: Kube | None,
        *,
        node: str,
        retry_s: float = RETRY_S,
        resync_s: float = RESYNC_S,
    ) -> None:
        self.kube = kube
        self.node = node
        self.retry_s = retry_s
        self.resync_s = resync_s
        self.written_labels: dict[str, str] | None = None
        self.written_capacity: dict[str, int] | None = None
        self.missing = False
        self.failures = 0
        self._synced_at_s: float | None = None
        self._retry_at_s = float("-inf")
        self._last_error: str | None = None
        self._given: dict[str, str] | None = None
        self._node_labels: dict[str, str] = {}  # the Node's, as the last patch returned them
        self._good: dict[str, str] = {}
        self._warned = False

    def due(
        self, labels: Mapping[str, str], devices: Sequence[DeviceFingerprint], *, now_s: float
    ) -> bool:
        """Whether :meth:`apply` would write now (no I/O)."""
        if self.kube is None or now_s < self._retry_at_s:
            return False
        if self._synced_at_s is None or now_s - self._synced_at_s >= self.resync_s:
            return True
        return self._valid(self._wanted(labels)) != self.written_labels or (
            capacity(devices) != self.written_capacity
        )

    async def apply(
        self, labels: Mapping[str, str], devices: Sequence[DeviceFingerprint], *, now_s: float
    ) -> bool:
        """Write what changed; True when something was written."""
        if self.kube is None:
            if not self._warned:
                _log.info("labels_skipped", node=self.node, reason="no Kubernetes cluster")
                self._warned = True
            return False
        if now_s < self._retry_at_s:
            return False
        if self._synced_at_s is not None and now_s - self._synced_at_s >= self.resync_s:
            self.written_labels = self.written_capacity = self._synced_at_s = None
        cap = capacity(devices)
        wrote = False
        try:
            for _ in range(2):  # again when the Node's own labels change the fabric
                good = self._valid(self._wanted(labels))
                if good == self.written_labels:
                    break
                node = await self.kube.patch_node_labels(self.node, self._patch(labels, good))
                self.written_labels, wrote = good, True
                self._node_labels = dict(node.get("metadata", {}).get("labels") or {})
            if cap != self.written_capacity:
                await self.kube.patch_node_capacity(self.node, cap)
                self.written_capacity, wrote = cap, True
        except KubeNotFound:
            self._failed(now_s, None)
            return wrote
        except KubeError as exc:
            self._failed(now_s, str(exc))
            return wrote
        self._succeeded(now_s)
        if wrote:
            _log.info("node_labelled", node=self.node, labels=good, capacity=cap)
        return wrote

    def _wanted(self, labels: Mapping[str, str]) -> dict[str, str]:
        """``labels`` with the collective and fabric labels they and the Node give."""
        derived = collective_labels(labels, node=self._node_labels)
        return {**labels, **{k: v for k, v in derived.items() if v is not None}}

    def _patch(self, labels: Mapping[str, str], good: Mapping[str, str]) -> dict[str, str | None]:
        """``good``, and None (remove) for a collective or fabric label the
        Node has that no longer holds."""
        derived = collective_labels(labels, node=self._node_labels)
        gone = {k: None for k, v in derived.items() if v is None and k in self._node_labels}
        return {**good, **gone}

    def _valid(self, labels: Mapping[str, str]) -> dict[str, str]:
        """The labels Kubernetes accepts; the others named once per change."""
        if labels != self._given:
            self._given = dict(labels)
            self._good, bad = valid_labels(labels)
            for key, why in bad.items():
                _log.warning("label_not_written", node=self.node, key=key, reason=why)
        return self._good

    def _failed(self, now_s: float, error: str | None) -> None:
        """``error`` None: the Node does not exist. Tried again after
        ``retry_s``, doubling with each failure in a row up to ``resync_s``."""
        self.failures += 1
        wait_s = min(self.retry_s * 2 ** (self.failures - 1), max(self.retry_s, self.resync_s))
        self._retry_at_s = now_s + wait_s
        if error is None:
            if not self.missing:
                _log.info("node_missing", node=self.node, retry_s=wait_s)
            self.missing = True
        elif error != self._last_error:
            _log.warning("labels_failed", node=self.node, error=error, retry_s=wait_s)
        self._last_error = error

    def _succeeded(self, now_s: float) -> None:
        if self.missing:
            _log.info("node_found", node=self.node)
        self.missing = False
        self.failures = 0
        self._last_error = None
        if self._synced_at_s is None:
            self._synced_at_s = now_s


class Target(NamedTuple):
    """One node to label: its name, its labels and its devices as last reported."""

    node: str
    labels: Mapping[str, str]
    devices: Sequence[DeviceFingerprint]


class FleetLabeler:
    """One :class:`Labeler` per node of a fleet; a pass writes the nodes that are due."""

    def __init__(
        self,
        kube: Kube | None,
        *,
        retry_s: float = RETRY_S,
        resync_s: float = RESYNC_S,
        concurrency: int = CONCURRENCY,
    ) -> None:
        self.kube = kube
        self.retry_s = retry_s
        self.resync_s = resync_s
        self.labelers: dict[str, Labeler] = {}
        self._limit = asyncio.Semaphore(concurrency)

    def labeler(self, node: str) -> Labeler:
        found = self.labelers.get(node)
        if found is None:
            found = Labeler(self.kube, node=node, retry_s=self.retry_s, resync_s=self.resync_s)
            self.labelers[node] = found
        return found

    async def label(self, targets: Sequence[Target], *, now_s: float) -> int:
        """One pass over ``targets``; how many nodes got a write."""
        due = [t for t in targets if self.labeler(t.node).due(t.labels, t.devices, now_s=now_s)]

        async def one(target: Target) -> bool:
            async with self._limit:
                return await self.labeler(target.node).apply(
                    target.labels, target.devices, now_s=now_s
                )

        return sum(await asyncio.gather(*(one(t) for t in due)))


async def keep_labelled(
    kube: Kube | None,
    targets: Callable[[], Sequence[Target]],
    *,
    period_s: float,
    retry_s: float = RETRY_S,
) -> None:
    """Label every target every ``period_s`` until cancelled (writes only
    changes); a Node not there is tried again after ``retry_s`` (and backs off)."""
    if kube is None:
        _log.info("labels_skipped", reason="no Kubernetes cluster", mode="fleet")
        return
    fleet = FleetLabeler(kube, retry_s=retry_s)
    loop = asyncio.get_running_loop()
    while True:
        await fleet.label(targets(), now_s=loop.time())
        await asyncio.sleep(period_s)
