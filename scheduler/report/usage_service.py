"""The metering service: replays ``HCS_ALLOC``, keeps running usage totals
(``scheduler.report.usage_rules``), and every ``interval_s``

* exports them as Prometheus counters through OpenTelemetry
  (``hcs_usage_device_seconds_total``, ``hcs_usage_acu_seconds_total``,
  ``hcs_usage_vram_byte_seconds_total`` by namespace, vendor and model: usage
  since the oldest allocation the stream holds; a new process starts again
  from the stream, which Prometheus reads as a counter reset) and a gauge
  ``hcs_usage_quota_ratio`` (held / hard, the tighter of VRAM and ACU);
* writes ``status.usage`` of every ComputeQuota of a namespace that held
  devices within the window (``window_s``, default the last 24 h), its
  totals split at the quota's guarantee (``withinGuarantee`` and
  ``borrowed``: ``usage_rules.split_by_guarantee``);
* publishes a ``UsageAlert`` on ``hcs.usage.<namespace>`` (core NATS) when a
  namespace's share of its quota reaches ``alert_share``, once per crossing
  (again after it fell below ``rearm_share``).

It runs in the mirror process (``python -m scheduler.report.computenode_loop``),
two replicas: both follow ``HCS_ALLOC``, keep the totals, judge the shares and
export the counters (the same figures from the same stream: a replica that
restarts while the other runs leaves no reset in ``max without (pod)``; both
restarted rebuild them from the stream, exact while it holds every allocation,
``bus.alloc_max_age_s``); only the Lease holder (``leading``) writes
``status.usage`` and publishes alerts. A follower tracks the crossings too, so
a new leader does not alert again for a crossing already alerted.
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from hcs_bus import messages, streams, subjects, tasks
from hcs_bus.bus import Bus, Delivery, Follower
from hcs_bus.errors import HcsError
from hcs_bus.messages import AllocationEvent, UsageAlert
from hcs_bus.telemetry import logger, meter
from hcs_bus.units import QuantityError, format_mib
from scheduler.plan.rules import QuotaLimits
from scheduler.quota.source import from_objects
from scheduler.report import usage_rules as metering
from scheduler.report.usage_rules import Guarantee, Held, Key, Lifetimes, Span, Split, Usage

_log = logger("hcs.metering")
BYTES_PER_GIB = 1 << 30  # the VRAM counter is in bytes, as Prometheus names units
_meters: weakref.WeakSet[Meter] = weakref.WeakSet()
MAX_SHARE = 1e6  # a share over a zero quota is reported as this, not infinity


class QuotaKube(Protocol):
    async def list_compute_quotas(self, namespace: str) -> list[dict[str, Any]]: ...

    async def patch_compute_quota_usage(
        self, namespace: str, name: str, usage: dict[str, Any]
    ) -> Any: ...


@dataclass(eq=False)
class Meter:
    bus: Bus
    kube: QuotaKube | None
    window_s: float = 24 * 3600.0
    interval_s: float = 30.0
    alert_share: float = 0.9
    rearm_share: float = 0.8
    clock: Callable[[], float] = time.time  # event times are Unix seconds
    lifetimes: Lifetimes = field(default_factory=Lifetimes)
    folded: dict[Key, Usage] = field(default_factory=dict)  # pruned spans' usage
    shares: dict[str, float] = field(default_factory=dict)
    limits: dict[str, tuple[str, QuotaLimits]] = field(default_factory=dict)  # resource, hard
    alerting: frozenset[str] = frozenset()
    alerts: int = 0
    writes: int = 0
    leading: bool = True  # False: write and publish nothing (another replica leads)
    _exported: dict[Key, Usage] = field(default_factory=dict)
    _follower: Follower[AllocationEvent] | None = None
    _tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    async def start(self) -> None:
        self._follower = Follower(
            self.bus,
            stream=streams.ALLOC,
            subject=subjects.ALLOC_ALL,
            kind=AllocationEvent,
            handle=self._on_event,
        )
        await self._follower.start()
        _meters.add(self)
        self._tasks.append(tasks.start(self._loop(), name="metering"))

    async def stop(self) -> None:
        _meters.discard(self)
        await tasks.stop(*self._tasks)
        self._tasks.clear()
        if self._follower is not None:
            await self._follower.stop()
            self._follower = None

    def lead(self, leading: bool) -> None:
        self.leading = leading

    @property
    def caught_up(self) -> asyncio.Event:
        assert self._follower is not None, "start() first"
        return self._follower.caught_up

    def _on_event(self, item: Delivery[AllocationEvent]) -> None:
        self.lifetimes.apply(item.value)

    def totals(self, *, now: float) -> dict[Key, Usage]:
        """Usage since the stream's oldest allocation, never below what was
        exported before (a release stamped before the last reading)."""
        found = metering.merge(
            self.folded, metering.usage(self.lifetimes.spans(), since=-math.inf, now=now)
        )
        for key, value in found.items():
            last = self._exported.get(key, Usage())
            self._exported[key] = Usage(
                device_s=max(value.device_s, last.device_s),
                acu_s=max(value.acu_s, last.acu_s),
                vram_gib_s=max(value.vram_gib_s, last.vram_gib_s),
            )
        return dict(self._exported)

    async def _loop(self) -> None:
        await self.caught_up.wait()
        while True:
            await self.tick()
            await asyncio.sleep(self.interval_s)

    async def tick(self) -> None:
        """One round: prune, write every namespace's status, alert."""
        now = self.clock()
        since = now - self.window_s
        pruned = self.lifetimes.prune(before_s=since)
        self.folded = metering.merge(self.folded, pruned)
        spans = list(self.lifetimes.spans())
        window = metering.usage(spans, since=since, now=now)
        holding = metering.held(spans)
        namespaces = {ns for ns, _, _ in window} | set(holding) | set(self.shares)
        by_namespace: dict[str, list[Span]] = {}
        for span in spans:
            by_namespace.setdefault(span.namespace, []).append(span)
        shares: dict[str, float] = {}
        for namespace in sorted(namespaces):
            share = await self._namespace(
                namespace,
                window=window,
                holding=holding.get(namespace, Held()),
                spans=by_namespace.get(namespace, []),
                now=now,
            )
            if share is not None:
                shares[namespace] = share
        self.shares = shares
        fired, self.alerting = metering.crossings(
            shares, alerting=self.alerting, threshold=self.alert_share, rearm=self.rearm_share
        )
        for namespace in fired:
            await self._alert(namespace, holding=holding.get(namespace, Held()), now=now)

    async def _namespace(
        self,
        namespace: str,
        *,
        window: dict[Key, Usage],
        holding: Held,
        spans: list[Span],
        now: float,
    ) -> float | None:
        """Write the namespace's quotas' ``status.usage``; its quota share."""
        if self.kube is None:
            return None
        try:
            quotas = await self.kube.list_compute_quotas(namespace)
            limits = from_objects(quotas)
        except (HcsError, QuantityError) as exc:
            _log.warning("usage_quota_unreadable", namespace=namespace, error=str(exc))
            return self.shares.get(namespace)
        found = (
            metering.quota_share(holding, vram_mib_hard=limits.vram_mib, acu_hard=limits.acu)
            if limits is not None
            else None
        )
        share = min(found[0], MAX_SHARE) if found else None
        if found and limits is not None:
            self.limits[namespace] = (found[1], limits)
        mine = {k: v for k, v in window.items() if k[0] == namespace}
        guarantee = (
            Guarantee(acu=limits.guaranteed_acu, vram_mib=limits.guaranteed_vram_mib)
            if limits is not None
            else Guarantee()
        )
        split = metering.split_by_guarantee(
            spans, since=now - self.window_s, now=now, guarantees={namespace: guarantee}
        ).get(namespace, Split())
        status = usage_status(
            mine, holding=holding, share=share, now=now, window_s=self.window_s, split=split
        )
        for quota in quotas if self.leading else ():
            name = str((quota.get("metadata") or {}).get("name", ""))
            try:
                await self.kube.patch_compute_quota_usage(namespace, name, status)
                self.writes += 1
            except HcsError as exc:
                _log.warning("usage_write_failed", namespace=namespace, quota=name, error=str(exc))
        return share

    async def _alert(self, namespace: str, *, holding: Held, now: float) -> None:
        if not self.leading:
            return  # the leader alerts; this replica only keeps the crossing
        share = self.shares[namespace]
        resource, hard = self.limits[namespace]
        alert = UsageAlert(
            namespace=namespace,
            resource=resource,
            share=round(share, 4),
            threshold=self.alert_share,
            time_s=now,
            held_devices=holding.devices,
            held_vram_mib=holding.vram_mib,
            held_acu=holding.acu,
            vram_mib_hard=hard.vram_mib,
            acu_hard=hard.acu,
            message=f"{namespace} holds {share:.0%} of its {resource} quota",
        )
        try:
            await self.bus.nc.publish(subjects.usage(namespace), messages.encode(alert))
            self.alerts += 1
        except Exception as exc:  # nats raises several unrelated types; the gauge still shows it
            _log.warning("usage_alert_lost", namespace=namespace, error=repr(exc))
        _log.warning("usage_over_share", namespace=namespace, share=round(share, 3))


def usage_status(
    found: dict[Key, Usage],
    *,
    holding: Held,
    share: float | None,
    now: float,
    window_s: float,
    split: Split | None = None,
) -> dict[str, Any]:
    """``status.usage`` of a ComputeQuota (schema in
    ``deploy/base/crds/computequotas.yaml``); ``split``: the window's usage
    within the guarantee and borrowed."""
    total = sum(found.values(), Usage())
    status: dict[str, Any] = {
        "windowSeconds": window_s,
        "since": _iso(now - window_s),
        "updated": _iso(now),
        **_figures(total),
        "held": {
            "devices": holding.devices,
            "vram": format_mib(holding.vram_mib),
            "acu": round(holding.acu, 1),
        },
        "byModel": [
            {"vendor": vendor, "model": model, **_figures(value)}
            for (_, vendor, model), value in sorted(found.items())
        ],
    }
    if share is not None:
        status["quotaShare"] = round(share, 4)
    if split is not None:
        status["withinGuarantee"] = _figures(split.within)
        status["borrowed"] = _figures(split.borrowed)
    return status


def _figures(value: Usage) -> dict[str, float]:
    return {
        "deviceSeconds": round(value.device_s, 1),
        "acuSeconds": round(value.acu_s, 1),
        "vramGiBSeconds": round(value.vram_gib_s, 1),
    }


def _iso(time_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(time_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


# -- metrics --------------------------------------------------------------------


def _totals() -> Iterable[tuple[Key, Usage]]:
    for m in list(_meters):
        yield from m.totals(now=m.clock()).items()


def _observe(pick: Callable[[Usage], float]) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        for (namespace, vendor, model), value in _totals():
            labels = {"namespace": namespace, "vendor": vendor, "model": model}
            yield Observation(pick(value), labels)

    return callback


def _quota_ratio(_options: CallbackOptions) -> Iterable[Observation]:
    for m in list(_meters):
        for namespace, share in m.shares.items():
            yield Observation(share, {"namespace": namespace})


_meter = meter("hcs.metering")
for _name, _pick, _what in (
    ("hcs_usage_device_seconds", lambda u: u.device_s, "device-seconds held"),
    ("hcs_usage_acu_seconds", lambda u: u.acu_s, "ACU-seconds held"),
    (
        "hcs_usage_vram_byte_seconds",
        lambda u: u.vram_gib_s * BYTES_PER_GIB,
        "VRAM byte-seconds held",
    ),
):
    _meter.create_observable_counter(_name, callbacks=[_observe(_pick)], description=_what)
_meter.create_observable_gauge(
    "hcs_usage_quota_ratio",
    callbacks=[_quota_ratio],
    description="what a namespace holds over its ComputeQuota (the tighter of VRAM and ACU)",
)
