"""Publishing a node's fingerprints and health events (DESIGN §1, §7.2).

* :class:`Publisher` — one per process: drains the bounded :class:`Outbox` to
  JetStream in order, each message acked, retried with the same
  ``Nats-Msg-Id`` while NATS is away (so nothing is stored twice and no
  health event is lost across a server restart).
* :class:`Reporter` — one per node: per-process ``boot_id``, a monotonically
  increasing ``seq``; a fingerprint on start, every report interval and on a
  material change; health events as they happen (``node:boot:h<n>``).
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence

import msgspec

from agents.changes import reason_to_publish
from agents.outbox import Item, Outbox
from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import HcsError
from hcs_bus.messages import DeviceFingerprint, HealthEvent, NodeFingerprint
from hcs_bus.telemetry import current_traceparent, logger, meter, span, zero_init

AGENT_VERSION = "0.1.0"
_log = logger("hcs.agent.reporting")
_meter = meter("hcs.agent")
DROPPED = zero_init(
    _meter.create_counter("hcs_agent_outbox_dropped", description="messages dropped, outbox full"),
    {"kind": "fingerprint"},
    {"kind": "health"},
)


class Publisher:
    """Drains the outbox to the bus, oldest first; waits out outages."""

    def __init__(self, bus: Bus, *, capacity: int, retry_s: float = 0.5) -> None:
        self.bus = bus
        self.outbox = Outbox(capacity)
        self.retry_s = retry_s
        self.published = 0
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def put(self, item: Item) -> None:
        dropped = self.outbox.put(item)
        if dropped is not None:
            DROPPED.add(1, {"kind": dropped.kind})
            _log.warning(
                "outbox_dropped",
                kind=dropped.kind,
                msg_id=dropped.msg_id,
                queued=len(self.outbox),
                dropped=dict(self.outbox.dropped),
            )
        self._idle.clear()
        self._wake.set()

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._drain()

    async def _drain(self) -> None:
        failures = 0
        while (item := self.outbox.peek()) is not None:
            try:
                await self.bus.publish(
                    item.subject,
                    item.message,
                    msg_id=item.msg_id,
                    timeout_s=1.0,
                    attempts=1,
                    traceparent=item.traceparent,
                )
            except (TimeoutError, HcsError, OSError) as exc:
                failures += 1
                if failures == 1:
                    _log.warning(
                        "publish_waiting",
                        msg_id=item.msg_id,
                        queued=len(self.outbox),
                        error=str(exc),
                    )
                await asyncio.sleep(min(self.retry_s * failures, 5.0))
                continue
            if self.outbox.peek() is item:
                self.outbox.pop()
            self.published += 1
            if failures:
                _log.info("publish_resumed", msg_id=item.msg_id, queued=len(self.outbox))
                failures = 0
        self._idle.set()

    async def flush(self, *, timeout_s: float) -> bool:
        """Wait until everything queued is acked (True) or the timeout (False)."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except TimeoutError:
            return False
        return True


class Reporter:
    """The publishing face of one node (real or simulated)."""

    def __init__(
        self,
        publisher: Publisher,
        *,
        node: str,
        report_interval_s: float,
        labels: dict[str, str] | None = None,
        simulated: bool = False,
        vram_threshold_mib: int = 1024,
        boot_id: str | None = None,
    ) -> None:
        subjects.node_token(node)  # fail early on a name that cannot be a subject
        self.publisher = publisher
        self.node = node
        self.report_interval_s = report_interval_s
        self.labels = dict(labels or {})
        self.simulated = simulated
        self.vram_threshold_mib = vram_threshold_mib
        self.boot_id = boot_id or uuid.uuid4().hex[:12]
        self.seq = 0
        self.health_seq = 0
        self.last: NodeFingerprint | None = None
        self._last_sent_loop_s: float | None = None

    def offer(
        self,
        devices: Sequence[DeviceFingerprint],
        *,
        now: float,
        loop_s: float,
        force: bool = False,
    ) -> NodeFingerprint | None:
        """Publish a fingerprint if it is the first, due, forced or materially changed."""
        previous = self.last.devices if self.last is not None else None
        reason = reason_to_publish(previous, devices, vram_threshold_mib=self.vram_threshold_mib)
        due = (
            self._last_sent_loop_s is None
            or loop_s - self._last_sent_loop_s >= self.report_interval_s
        )
        if not (force or due or reason):
            return None
        self.seq += 1
        fingerprint = NodeFingerprint(
            node=self.node,
            agent_version=AGENT_VERSION,
            boot_id=self.boot_id,
            seq=self.seq,
            time_s=now,
            devices=tuple(devices),
            labels=self.labels,
            simulated=self.simulated,
        )
        msg_id = f"{self.node}:{self.boot_id}:{self.seq}"
        self.publisher.put(Item(subjects.fp(self.node), fingerprint, msg_id, "fingerprint"))
        self.last = fingerprint
        self._last_sent_loop_s = loop_s
        if reason and reason != "first":
            _log.info("fingerprint_changed", node=self.node, reason=reason, seq=self.seq)
        return fingerprint

    def health(self, event: HealthEvent) -> HealthEvent:
        """Queue a health event, stamped with its id ``node:boot:h<n>``."""
        self.health_seq += 1
        msg_id = f"{self.node}:{self.boot_id}:h{self.health_seq}"
        stamped = msgspec.structs.replace(event, id=msg_id)
        # A trace starts where the fault is seen; its consumers (the healer's
        # verdict, the views) continue it from the event's headers.
        attributes = {"hcs.node": self.node, "hcs.kind": event.kind}
        with span("hcs.agent.health_event", attributes=attributes):
            traced = current_traceparent()
        self.publisher.put(Item(subjects.health(self.node), stamped, msg_id, "health", traced))
        return stamped
