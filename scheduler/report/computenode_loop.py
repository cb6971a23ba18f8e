"""Mirror each node's latest fingerprint and health verdict into ComputeNode
status, so ``kubectl get computenodes`` shows the fleet.

* ``node_status(fp, verdict=...)`` — pure: NodeFingerprint (+ the latest
  healer verdict) → the ``status`` dict of a ComputeNode (CRD schema in
  ``deploy/base/crds/computenodes.yaml``).
* ``Mirror`` — replays ``HCS_FP`` (last per node) and ``HCS_HEALTH`` (verdicts)
  and writes at most one status per node per ``min_interval_s``; the latest
  state always gets written (a newer one replaces a pending one). A report
  that changes only the node's readings (``READINGS``: ``lastReport``,
  ``observedSeq``, free VRAM, health scores) is written once the node's
  last write is ``refresh_after_s(node)`` old (between 3/4 of ``refresh_s``
  and ``refresh_s``, 300 s as kubelet's node status report frequency; a
  fixed share per node, so the refreshes of a fleet written in one wave at
  start spread over the period), so a quiet fleet costs the API server one
  PATCH per node per few minutes instead of one per report; a change of
  anything else (health, a verdict, a device out or gone) is written at once. A
  fingerprint older in (boot, seq) than the one held never replaces it
  (``hcs_bus.ordering``); ``lastReport`` is when the bus server received the
  one held, never the agent's clock; a fingerprint claiming a boot in the
  future of its receipt is dead-lettered (``hcs_bus.clocks``).
* ``python -m scheduler.report.computenode_loop`` — runs it with metering
  (Deployment ``hcs-mirror``, two replicas). Both replicas follow the bus; only
  the one holding the Lease ``hcs-mirror`` (``hcs_bus.leases``) writes
  ComputeNode status, ComputeQuota usage and usage alerts. A replica that
  takes over writes every node it holds at once.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import msgspec
from nats.js.api import DeliverPolicy

from hcs_bus import streams, subjects, tasks
from hcs_bus.bus import Bus, Consumer, Delivery, connect
from hcs_bus.clocks import DEFAULT_CLOCK_SKEW_TOLERANCE_S
from hcs_bus.errors import KubeError
from hcs_bus.leases import Leader, LeaseTerms, identity
from hcs_bus.messages import HealthEvent, NodeFingerprint
from hcs_bus.ordering import FingerprintOrder
from hcs_bus.telemetry import TallyCounter, logger, zero_init
from hcs_bus.units import format_mib
from scheduler.view import outages

_log = logger("hcs.mirror")
HEALTH_RANK = {"healthy": 0, "degraded": 1, "failed": 2}
REFRESH_S = 300.0  # longest a node's readings wait for a write when nothing else changed
REFRESH_SPREAD = 0.25  # a node's own period is refresh_s less up to this share of it
# fields of a status (and of its devices) that change with every report or
# with the workload: on their own they are written at the node's refresh
READINGS = frozenset({"lastReport", "observedSeq", "vramFree"})
DEVICE_READINGS = frozenset({"vramFree", "healthScore"})
STATUS_WRITES = zero_init(
    TallyCounter(
        "hcs_mirror_status_writes",
        description="ComputeNode status writes: changed (first, or more than readings), "
        "refresh (readings alone, at the node's period), failed",
        meter_name="hcs.mirror",
    ),
    {"reason": "changed"},
    {"reason": "refresh"},
    {"reason": "failed"},
)
READINGS_HELD = zero_init(
    TallyCounter(
        "hcs_mirror_readings_held",
        description="reports that changed only a node's readings, left for its refresh",
        meter_name="hcs.mirror",
    )
)


class StatusWriter(Protocol):
    async def patch_compute_node_status(self, name: str, status: dict[str, Any]) -> Any: ...


_CHANGED, _REFRESH, _FAILED = ({"reason": r} for r in ("changed", "refresh", "failed"))


def _iso(time_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(time_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _device_health(score: int, error: str | None) -> str:
    if error or score <= 0:
        return "failed"
    return "healthy" if score >= 80 else "degraded"


def _verdict_status(verdict: HealthEvent) -> dict[str, Any]:
    out: dict[str, Any] = {
        "verdict": verdict.verdict or "unknown",
        "kind": verdict.kind,
        "message": verdict.message,
        "time": _iso(verdict.time_s),
    }
    if verdict.device is not None:
        out["device"] = verdict.device
    return out


def node_status(
    fp: NodeFingerprint,
    *,
    verdict: HealthEvent | None = None,
    out: Mapping[int, outages.Outage] | None = None,
    received_s: float | None = None,
) -> dict[str, Any]:
    """The ComputeNode status for a node's fingerprint, its latest verdict and
    the devices the healer holds out (``scheduler.view.outages``).
    ``lastReport`` is ``received_s``, when the bus server received the
    fingerprint (the agent's ``time_s`` only where that is not known).

    Health is the node verdict when the healer judged the whole node, else the
    worst of the devices' (a device verdict lowers its device's health).
    """
    out = out or {}
    devices = []
    for d in fp.devices:
        health = _device_health(d.health_score, d.error)
        if verdict and verdict.verdict and verdict.device == d.index:
            health = verdict.verdict
        if d.index in out:
            health = "failed"
        entry: dict[str, Any] = {
            "index": d.index,
            "uuid": d.uuid,
            "model": d.model,
            "vram": format_mib(d.vram_total_mib),
            "vramFree": format_mib(d.vram_free_mib),
            "acu": round(d.compute.acu, 1),
            "health": health,
            "healthScore": d.health_score,
        }
        if d.error:
            entry["error"] = d.error
        devices.append(entry)
    if verdict and verdict.verdict and verdict.device is None:
        health = verdict.verdict
    elif devices:
        health = max((e["health"] for e in devices), key=lambda h: HEALTH_RANK.get(h, 0))
    else:
        health = "unknown"
    status: dict[str, Any] = {
        "vendor": ",".join(sorted({d.vendor for d in fp.devices})),
        "model": ",".join(sorted({d.model for d in fp.devices})),
        "devices": len(fp.devices),
        "vram": format_mib(sum(d.vram_total_mib for d in fp.devices)),
        "vramFree": format_mib(sum(d.vram_free_mib for d in fp.devices)),
        "acu": round(sum(d.compute.acu for d in fp.devices), 1),
        "health": health,
        "simulated": fp.simulated,
        "agentVersion": fp.agent_version,
        "observedSeq": fp.seq,
        "lastReport": _iso(fp.time_s if received_s is None else received_s),
        "deviceList": devices,
        "devicesOut": outages.entries(out, fp.devices),  # [] clears it (merge patch)
    }
    if verdict is not None:
        status["lastVerdict"] = _verdict_status(verdict)
    return status


def state_of(status: Mapping[str, Any]) -> dict[str, Any]:
    """``status`` without its readings (``READINGS``, ``DEVICE_READINGS``):
    what, when it changes, is written at once."""
    state = {k: v for k, v in status.items() if k not in READINGS and k != "deviceList"}
    state["deviceList"] = [
        {k: v for k, v in d.items() if k not in DEVICE_READINGS}
        for d in status.get("deviceList", ())
    ]
    return state


@dataclass
class Mirror:
    """Writes ComputeNode status from the bus, at most once per node per
    interval; readings alone at most once per ``refresh_s``."""

    bus: Bus
    kube: StatusWriter
    min_interval_s: float = 10.0
    refresh_s: float = REFRESH_S
    clock_skew_tolerance_s: float = DEFAULT_CLOCK_SKEW_TOLERANCE_S
    fingerprints: dict[str, NodeFingerprint] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)  # node → server receive time
    verdicts: dict[str, HealthEvent] = field(default_factory=dict)
    outs: dict[str, dict[int, outages.Outage]] = field(default_factory=dict)
    written: dict[str, float] = field(default_factory=dict)  # node → loop time of its last write
    sent: dict[str, bytes] = field(default_factory=dict)  # node → ``state_of`` written, as JSON
    writes: int = 0
    held: int = 0  # reports whose readings alone waited for ``refresh_s``
    leading: bool = True  # False: follow the bus, write nothing (another replica leads)
    order: FingerprintOrder = field(default_factory=FingerprintOrder)
    _dirty: set[str] = field(default_factory=set)
    _quiet: dict[str, float] = field(default_factory=dict)  # node → when its readings are due
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _timer: asyncio.TimerHandle | None = None  # the next wake for a node due later
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def start(self) -> None:
        fp: Consumer[NodeFingerprint] = Consumer(
            self.bus,
            stream=streams.FP,
            kind=NodeFingerprint,
            handle=self._on_fps,
            filter_subject=subjects.FP_ALL,
            deliver=DeliverPolicy.LAST_PER_SUBJECT,
            ack_all=True,
            clock_skew_tolerance_s=self.clock_skew_tolerance_s,
        )
        health: Consumer[HealthEvent] = Consumer(
            self.bus,
            stream=streams.HEALTH,
            kind=HealthEvent,
            handle=self._on_health,
            filter_subject=subjects.HEALTH_ALL,
            deliver=DeliverPolicy.LAST_PER_SUBJECT,
            ack_all=True,
        )
        for name, consumer in (("fp", fp), ("health", health)):
            await consumer.start()
            self._tasks.append(tasks.start(consumer.run(), name=f"mirror:{name}"))
        self._tasks.append(tasks.start(self._write_loop(), name="mirror:write"))

    async def stop(self) -> None:
        await tasks.stop(*self._tasks)
        self._tasks.clear()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _on_fps(self, items: list[Delivery[NodeFingerprint]]) -> None:
        for item in items:
            if self.order.admit(item.value):  # an older (boot, seq) is ignored
                self.fingerprints[item.value.node] = item.value
                self.received[item.value.node] = item.received_s
                self._mark(item.value.node)

    async def _on_health(self, items: list[Delivery[HealthEvent]]) -> None:
        for item in items:
            event = item.value
            # a healer event reaches here only from the healer's subject (hcs_bus.identity)
            if event.source == "healer" and event.verdict is not None:
                self.verdicts[event.node] = event
                self.outs[event.node] = outages.track(self.outs.get(event.node, {}), event)
                self._mark(event.node)

    def refresh_after_s(self, node: str) -> float:
        """How long ``node``'s readings alone wait after its last write: a
        fixed share of ``refresh_s`` between ``1 - REFRESH_SPREAD`` and 1
        (from the CRC-32 of its name), so nodes first written together drift
        apart and their refreshes spread over the period."""
        share = zlib.crc32(node.encode()) / 2**32
        return self.refresh_s * (1.0 - REFRESH_SPREAD * share)

    def lead(self, leading: bool) -> None:
        """Start or stop writing; a new leader writes every node it holds."""
        self.leading = leading
        if leading:
            self.written.clear()
            self.sent.clear()
            self._quiet.clear()
            for node in self.fingerprints:
                self._mark(node)

    def _mark(self, node: str) -> None:
        self._dirty.add(node)
        self._wake.set()

    async def _write_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self.leading:
                continue  # the marks wait for leadership (``lead``)
            now = loop.time()
            due = [
                n for n in self._dirty if now - self.written.get(n, -1e18) >= self.min_interval_s
            ]
            due += [n for n, at in self._quiet.items() if at <= now and n not in self._dirty]
            for node in due:
                self._dirty.discard(node)
                await self._write(node, now=now)
            # a node first marked while a write was awaited has no `written` yet: due now
            at = [self.written.get(n, now) + self.min_interval_s for n in self._dirty]
            at += [due_at for n, due_at in self._quiet.items() if n not in self._dirty]
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if at:
                self._timer = loop.call_later(max(min(at) - now, 0.0), self._wake.set)

    async def _write(self, node: str, *, now: float) -> None:
        fp = self.fingerprints.get(node)
        if fp is None:
            return  # a verdict before any fingerprint: written with the first one
        status = node_status(
            fp,
            verdict=self.verdicts.get(node),
            out=self.outs.get(node),
            received_s=self.received.get(node) or None,
        )
        state = msgspec.json.encode(state_of(status))  # compact to hold, cheap to compare
        last, after_s = self.written.get(node), self.refresh_after_s(node)
        readings_only = last is not None and self.sent.get(node) == state
        if last is not None and readings_only and now - last < after_s:
            self._quiet[node] = last + after_s  # only readings changed: they wait
            self.held += 1
            READINGS_HELD.add(1)
            return
        self._quiet.pop(node, None)
        self.sent.pop(node, None)
        self.written[node] = now
        try:
            await self.kube.patch_compute_node_status(node, status)
            self.writes += 1
            self.sent[node] = state
            STATUS_WRITES.add(1, _REFRESH if readings_only else _CHANGED)
        except KubeError as exc:
            STATUS_WRITES.add(1, _FAILED)
            _log.warning("computenode_write_failed", node=node, error=str(exc))
            self._mark(node)


MIRROR_LEASE = "hcs-mirror"


def lease_terms() -> LeaseTerms:
    """The Lease the mirror replicas elect on: ``hcs-mirror`` in the pod's
    namespace (``POD_NAMESPACE``, else ``hcs-system``), kube-scheduler's terms."""
    return LeaseTerms(
        lease_name=MIRROR_LEASE, lease_namespace=os.environ.get("POD_NAMESPACE") or "hcs-system"
    )


class _Leads(Protocol):
    def lead(self, leading: bool) -> None: ...


def _both(*parts: _Leads) -> Callable[[bool], None]:
    def on_change(leading: bool) -> None:
        for part in parts:
            part.lead(leading)

    return on_change


async def _main() -> None:
    from hcs_bus import kube as kube_module
    from hcs_bus import settings as settings_module
    from hcs_bus.telemetry import configure
    from scheduler.report.usage_service import Meter

    settings = settings_module.load()
    configure(settings.telemetry, service="hcs-mirror")
    kube = await kube_module.connect(settings.kube)
    if kube is None:
        _log.error("mirror_needs_kubernetes")
        return
    bus = await connect(settings.bus, name="hcs-mirror")
    mirror = Mirror(
        bus,
        kube,
        clock_skew_tolerance_s=settings.scheduler.clock_skew_tolerance_s,
        leading=False,
    )
    meter = Meter(bus, kube, leading=False)  # ComputeQuota status.usage, counters, alerts
    leader = Leader(
        kube, identity=identity(), settings=lease_terms(), on_change=_both(mirror, meter)
    )
    await mirror.start()
    await meter.start()
    election = tasks.start(leader.run(), name="mirror:lease")
    tasks.long_lived()
    await tasks.stop_event().wait()
    await tasks.stop(election)
    await meter.stop()
    await mirror.stop()
    await kube.close()
    await bus.drain()


if __name__ == "__main__":
    asyncio.run(_main())
