"""Namespace compute quotas: ``ComputeQuota`` objects through the Kube adapter,
or a YAML file (``scheduler.quota_file``) when there is no cluster.

A ComputeQuota's limits are read from ``spec.hard`` with the resource names
pods use (``ai.compute/vram`` as a quantity, ``ai.compute/acu`` a number):
the ceiling the namespace may borrow up to. ``spec.guaranteed`` (``vram``,
``acu``, and per class ``classes: {<vendor/model or library>: {vram, acu}}``)
is what the shared pool always gives back to it, and ``spec.weight`` its
fair-share weight (``scheduler.quota.share_rules``). Several quotas in one
namespace: the tightest of each wins. ``UsedWriter`` writes their
``status.used`` from the ledger (reservations and pledges) and, given the
fleet's classes, their ``status.conditions`` (``GuaranteeFits``:
``share_rules.guarantee_conditions``). The file::

    namespaces:
      ml-team: {vram: 640Gi, acu: 800, guaranteed: {acu: 400}, weight: 2}

Answers are cached for ``ttl_s``; a failing API keeps the last answer
(quotas fail open: the bind still checks capacity) and logs it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol

import msgspec
import yaml

from hcs_bus import tasks
from hcs_bus.errors import ConfigError, HcsError
from hcs_bus.telemetry import logger
from hcs_bus.units import QuantityError, format_mib, parse_quantity, quantity_mib
from scheduler.ledger.pledge_rules import Held
from scheduler.ledger.reservation_store import Kube
from scheduler.plan.gang_rules import library_of
from scheduler.plan.rules import ClassStats, QuotaLimits, Usage
from scheduler.quota import share_rules as sharing

_log = logger("hcs.scheduler.quotas")


class StatusKube(Kube, Protocol):
    """The Kube calls of ``UsedWriter``: the ledger's, and the conditions."""

    async def patch_compute_quota_conditions(
        self, namespace: str, name: str, conditions: list[dict[str, Any]]
    ) -> dict[str, Any]: ...


class _Amount(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    vram: str | int | None = None
    acu: str | int | float | None = None


class _Guaranteed(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    vram: str | int | None = None
    acu: str | int | float | None = None
    classes: dict[str, _Amount] = {}


class _Limits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    vram: str | int | None = None
    acu: str | int | float | None = None
    guaranteed: _Guaranteed | None = None
    weight: float = 1.0


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    namespaces: dict[str, _Limits] = {}


def read_file(path: str | Path) -> dict[str, QuotaLimits]:
    """Quota limits per namespace from a YAML file; ConfigError names the problem."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        parsed = msgspec.convert(raw, _File)
        return {
            ns: _with_share(_limits(lim.vram, lim.acu), lim.guaranteed, lim.weight)
            for ns, lim in parsed.namespaces.items()
        }
    except (OSError, yaml.YAMLError, msgspec.ValidationError, QuantityError) as exc:
        raise ConfigError(f"quota file {path}: {exc}") from exc
    except ValueError as exc:
        raise ConfigError(f"quota file {path}: {exc}") from exc


def _with_share(lim: QuotaLimits, guaranteed: _Guaranteed | None, weight: float) -> QuotaLimits:
    if not weight > 0:
        raise ValueError(f"weight {weight!r} must be above 0")
    if guaranteed is None:
        return replace(lim, weight=weight)
    floor = _limits(guaranteed.vram, guaranteed.acu)
    for name, have, ceiling in (
        ("vram", floor.vram_mib, lim.vram_mib),
        ("acu", floor.acu, lim.acu),
    ):
        if have is not None and ceiling is not None and have > ceiling:
            raise ValueError(f"guaranteed {name} {have:g} is above the ceiling (hard) {ceiling:g}")
    classes = tuple(
        (key, c.vram_mib, c.acu)
        for key, c in sorted((k, _limits(v.vram, v.acu)) for k, v in guaranteed.classes.items())
    )
    return replace(
        lim,
        guaranteed_vram_mib=floor.vram_mib,
        guaranteed_acu=floor.acu,
        weight=weight,
        guaranteed_classes=classes,
    )


def _limits(vram: Any, acu: Any) -> QuotaLimits:
    return QuotaLimits(
        vram_mib=quantity_mib(vram) if vram is not None else None,
        acu=float(parse_quantity(acu)) if acu is not None else None,
    )


def from_objects(objects: list[dict[str, Any]]) -> QuotaLimits | None:
    """The tightest limits over a namespace's ComputeQuota objects (ceiling,
    guarantee and weight each the smallest given)."""
    found: list[QuotaLimits] = []
    for obj in objects:
        spec = obj.get("spec") or {}
        hard = spec.get("hard") or {}
        floor = spec.get("guaranteed") or {}
        lim = _limits(_pick(hard, "vram"), _pick(hard, "acu"))
        share = _limits(_pick(floor, "vram"), _pick(floor, "acu"))
        classes = tuple(
            (key, c.vram_mib, c.acu)
            for key, c in sorted(
                (k, _limits(_pick(v or {}, "vram"), _pick(v or {}, "acu")))
                for k, v in (floor.get("classes") or {}).items()
            )
        )
        found.append(
            replace(
                lim,
                guaranteed_vram_mib=share.vram_mib,
                guaranteed_acu=share.acu,
                weight=float(spec.get("weight", 1.0)),
                guaranteed_classes=classes,
            )
        )
    if all(
        f.vram_mib is None
        and f.acu is None
        and f.guaranteed_acu is None
        and f.guaranteed_vram_mib is None
        for f in found
    ):
        return None
    return QuotaLimits(
        vram_mib=_least(f.vram_mib for f in found),
        acu=_least(f.acu for f in found),
        guaranteed_vram_mib=_least(f.guaranteed_vram_mib for f in found),
        guaranteed_acu=_least(f.guaranteed_acu for f in found),
        weight=min(f.weight for f in found),
        guaranteed_classes=min(
            (f.guaranteed_classes for f in found if f.guaranteed_classes), default=()
        ),
    )


def _least(values: Iterable[Any]) -> Any:
    have = [v for v in values if v is not None]
    return min(have) if have else None


def _pick(hard: dict[str, Any], name: str) -> Any:
    for key in (f"ai.compute/{name}", name):
        if key in hard:
            return hard[key]
    return None


class QuotaSource:
    """Each namespace's limits, read from the API at most once per ``ttl_s``.

    Plans never queue behind the API server: an answer older than ``ttl_s`` is
    still given at once while one read refreshes it in the background, and
    plans arriving together for a namespace never read yet share one read
    (a burst of admissions once made one list call each, and under load
    waited past the webhook's timeout for them)."""

    def __init__(self, *, kube: Kube | None, file: str | None, ttl_s: float = 10.0) -> None:
        self.kube = kube
        self.ttl_s = ttl_s
        self._file = read_file(file) if file else None
        self._cache: dict[str, tuple[float, QuotaLimits | None]] = {}
        self._reading: dict[str, asyncio.Task[QuotaLimits | None]] = {}
        self.names: dict[str, tuple[str, ...]] = {}  # namespace → its ComputeQuotas

    def named(self) -> frozenset[str]:
        """The namespaces the quota file names (none with a cluster: its
        ComputeQuotas are read per namespace)."""
        return frozenset(self._file or ()) if self.kube is None else frozenset()

    async def limits(self, namespace: str) -> QuotaLimits | None:
        if self.kube is None:
            return (self._file or {}).get(namespace)
        held = self._cache.get(namespace)
        if held is None:
            return await asyncio.shield(self._read_once(namespace))
        if asyncio.get_running_loop().time() - held[0] >= self.ttl_s:
            self._read_once(namespace)  # the stale answer now, a fresh one soon
        return held[1]

    def _read_once(self, namespace: str) -> asyncio.Task[QuotaLimits | None]:
        task = self._reading.get(namespace)
        if task is None or task.done():
            task = tasks.start(self._read(namespace), name=f"quota-read:{namespace}")
            self._reading[namespace] = task
        return task

    async def _read(self, namespace: str) -> QuotaLimits | None:
        assert self.kube is not None
        held = self._cache.get(namespace)
        try:
            objects = await self.kube.list_compute_quotas(namespace)
            value = from_objects(objects)
        except (HcsError, QuantityError) as exc:
            _log.warning("quota_read_failed", namespace=namespace, error=str(exc))
            return held[1] if held else None
        self.names[namespace] = tuple(
            str((o.get("metadata") or {}).get("name", "")) for o in objects
        )
        self._cache[namespace] = (asyncio.get_running_loop().time(), value)
        return value


# ----------------------------------------------------------- status.used --


class Used(msgspec.Struct, frozen=True):
    """What the ledger holds for one namespace: reservations and pledges."""

    vram_mib: int = 0
    acu: float = 0.0
    devices: int = 0
    pledges: int = 0

    def body(self) -> dict[str, Any]:
        """``status.used`` of the namespace's ComputeQuotas."""
        return {
            "vram": format_mib(self.vram_mib),
            "acu": round(self.acu, 3),
            "devices": self.devices,
            "pledges": self.pledges,
        }


def used_by_namespace(
    usage: Mapping[str, Usage], pledged: Mapping[str, tuple[Held, int]]
) -> dict[str, Used]:
    """Per namespace: what its reservations hold (``usage``: the sum its
    quota verdicts use, ``plan.rules.namespace_usage``, kept node by node in
    ``plan.fleet_summary.Parts.usage``), plus its outstanding pledges
    (``pledged``: namespace → (what they hold, how many))."""
    out = {ns: Used(vram_mib=u.vram_mib, acu=u.acu, devices=u.devices) for ns, u in usage.items()}
    for ns, (held, count) in pledged.items():
        u = out.get(ns, Used())
        out[ns] = Used(
            vram_mib=u.vram_mib + held.vram_mib,
            acu=u.acu + held.acu,
            devices=u.devices + held.devices,
            pledges=u.pledges + count,
        )
    return out


class UsedWriter:
    """Writes ``status.used`` of every ComputeQuota of the namespaces HCS knows
    (those it planned for, and those the ledger holds devices for), when it
    changed; both replicas may write: the figures are the ledger's."""

    def __init__(
        self,
        *,
        kube: StatusKube,
        quotas: QuotaSource,
        used: Callable[[], dict[str, Used]],
        classes: Callable[[], Mapping[str, ClassStats]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.quotas, self.used = kube, quotas, used
        self.classes, self.clock = classes, clock
        self._written: dict[tuple[str, str], dict[str, Any]] = {}
        self._told: dict[tuple[str, str], dict[str, Any]] = {}  # conditions written
        self._since: dict[str, tuple[str, str]] = {}  # namespace -> (status, when it became so)

    async def write(self) -> int:
        """One round; how many quotas were patched."""
        now = self.used()
        count = 0
        names = sorted(set(now) | set(self.quotas.names))
        limits = {ns: await self.quotas.limits(ns) for ns in names}  # lists when old
        conditions = self._conditions(limits)
        for ns in names:
            body = now.get(ns, Used()).body()
            if ns in conditions:
                count += await self._write_condition(ns, conditions[ns])
            for name in self.quotas.names.get(ns, ()):
                if self._written.get((ns, name)) == body:
                    continue
                try:
                    await self.kube.patch_compute_quota_used(ns, name, body)
                except HcsError as exc:
                    _log.warning(
                        "quota_used_write_failed", namespace=ns, quota=name, error=str(exc)
                    )
                    continue
                self._written[(ns, name)] = body
                count += 1
        return count

    def _conditions(self, limits: Mapping[str, QuotaLimits | None]) -> dict[str, dict[str, Any]]:
        """``GuaranteeFits`` of each namespace with a quota, over the fleet's pool."""
        quoted = {ns: lim for ns, lim in limits.items() if lim is not None}
        if self.classes is None or not quoted:
            return {}  # no quota to judge: the fleet is not summed
        classes = self.classes()
        if not classes:
            return {}  # no fleet seen yet: nothing to judge against
        class_pool: dict[str, sharing.Amount] = {}
        for c in classes.values():
            amount = sharing.Amount(c.acu * c.devices, c.vram_mib * c.devices)
            for key in (c.key, library_of(c.vendor)):
                class_pool[key] = class_pool.get(key, sharing.NONE) + amount
        pool = sharing.NONE
        for c in classes.values():
            pool += sharing.Amount(c.acu * c.devices, c.vram_mib * c.devices)
        found = sharing.guarantee_conditions(
            {ns: sharing.share_of(ns, lim, pool=pool) for ns, lim in quoted.items()},
            pool=pool,
            by_class={ns: sharing.class_guarantees(lim) for ns, lim in quoted.items()},
            class_pool=class_pool,
        )
        out = {}
        for ns, cond in found.items():
            was = self._since.get(ns)
            if was is None or was[0] != cond.status:
                stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.clock()))
                self._since[ns] = was = (cond.status, stamp)
            out[ns] = {
                "type": cond.type,
                "status": cond.status,
                "reason": cond.reason,
                "message": cond.message,
                "lastTransitionTime": was[1],
            }
        return out

    async def _write_condition(self, ns: str, condition: dict[str, Any]) -> int:
        count = 0
        for name in self.quotas.names.get(ns, ()):
            if self._told.get((ns, name)) == condition:
                continue
            try:
                await self.kube.patch_compute_quota_conditions(ns, name, [condition])
            except HcsError as exc:
                _log.warning(
                    "quota_conditions_write_failed", namespace=ns, quota=name, error=str(exc)
                )
                continue
            self._told[(ns, name)] = condition
            count += 1
        return count

    async def run(self, *, every_s: float = 2.0) -> None:
        """Rounds forever, at most every ``every_s`` and less often when they
        grow long (``tasks.spacing_s``): a round takes the namespaces' usage
        as kept node by node (the nodes changed since the last round) and
        counts the outstanding pledges."""
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            await self.write()
            await asyncio.sleep(tasks.spacing_s(loop.time() - began, every_s=every_s))
