"""Publishing a node's fingerprints and health events (docs/architecture.md#subjects, #bus-rules).

* :class:`Publisher` — one per process: drains the bounded :class:`Outbox` to
  JetStream in order, each message acked, retried with the same
  ``Nats-Msg-Id`` while NATS is away (so nothing is stored twice and no
  health event is lost across a server restart).
* :class:`Reporter` — one per node: per-process ``boot_id``, a monotonically
  increasing ``seq``; a fingerprint on start, every report interval and on a
  material change; health events as they happen (``node:boot:h<n>``).

``HCS_FP`` keeps one fingerprint per node (the last stored), so a late one
from a stale writer (an agent process already replaced, a copy held back)
would replace a newer one for every follower that replays later. A
fingerprint is therefore published expecting the stream sequence of the last
one this process stored on its subject (``Nats-Expected-Last-Subject-Sequence``;
the first of a process claims the subject unconditionally). When the server
finds another there (``StaleWrite``), something stored on the node's subject
since: every fingerprint this process still queues for it is older than that
and is dropped (logged, counted in ``hcs_agent_fingerprints_superseded``);
the next one made is published on top of what the stream holds. An empty
subject (the stream made again) takes the refused one at once.
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
from hcs_bus.errors import HcsError, StaleWrite
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
SUPERSEDED = zero_init(
    _meter.create_counter(
        "hcs_agent_fingerprints_superseded",
        description="queued fingerprints dropped: the stream held a later one for the node",
    )
)


class Publisher:
    """Drains the outbox to the bus, oldest first; waits out outages."""

    def __init__(self, bus: Bus, *, capacity: int, retry_s: float = 0.5) -> None:
        self.bus = bus
        self.outbox = Outbox(capacity)
        self.retry_s = retry_s
        self.published = 0
        self.superseded = 0
        self._stored: dict[str, int] = {}  # subject → stream seq of our last fingerprint there
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
            fingerprint = item.kind == "fingerprint"
            try:
                seq = await self.bus.publish(
                    item.subject,
                    item.message,
                    msg_id=item.msg_id,
                    timeout_s=1.0,
                    attempts=1,
                    traceparent=item.traceparent,
                    expect_last_subject_seq=self._stored.get(item.subject) if fingerprint else None,
                )
            except StaleWrite as exc:
                self._superseded(item, exc)
                continue
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
            if fingerprint:
                self._stored[item.subject] = seq
            if self.outbox.peek() is item:
                self.outbox.pop()
            self.published += 1
            if failures:
                _log.info("publish_resumed", msg_id=item.msg_id, queued=len(self.outbox))
                failures = 0
        self._idle.set()

    def _superseded(self, item: Item, refused: StaleWrite) -> None:
        """The stream holds another fingerprint on ``item``'s subject than our
        last: an empty subject takes ``item`` next; else what we queue for it
        is older than what is there and goes (module docstring)."""
        if refused.last_seq == 0:
            self._stored[item.subject] = 0
            return
        dropped = self.outbox.discard(item.subject, "fingerprint")
        self.superseded += dropped
        SUPERSEDED.add(dropped)
        if refused.last_seq > 0:
            self._stored[item.subject] = refused.last_seq
        else:  # the server did not say which: the next one is stored unconditionally
            self._stored.pop(item.subject, None)
        _log.warning(
            "fingerprints_superseded",
            subject=item.subject,
            msg_id=item.msg_id,
            dropped=dropped,
            stream_last_seq=refused.last_seq,
            error=str(refused),
        )

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
        self._boot_loop_s: float | None = None  # the loop's clock at the first offer

    def due(self, loop_s: float) -> bool:
        """Whether a fingerprint offered at ``loop_s`` is published however
        little it changed: the first, or ``report_interval_s`` after the last."""
        last = self._last_sent_loop_s
        return last is None or loop_s - last >= self.report_interval_s

    def offer(
        self,
        devices: Sequence[DeviceFingerprint],
        *,
        now: float,
        loop_s: float,
        force: bool = False,
    ) -> NodeFingerprint | None:
        """Publish a fingerprint if it is the first, due, forced or materially changed.

        ``now`` is the wall clock (the body's ``time_s``), ``loop_s`` the
        loop's; ``boot_s`` is put on the wall clock from the loop's time
        since the first offer, so it moves with ``time_s`` when the wall
        clock is stepped and never claims a boot after the report."""
        if self._boot_loop_s is None:
            self._boot_loop_s = loop_s
        previous = self.last.devices if self.last is not None else None
        reason = reason_to_publish(previous, devices, vram_threshold_mib=self.vram_threshold_mib)
        due = self.due(loop_s)
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
            boot_s=now - (loop_s - self._boot_loop_s),
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
