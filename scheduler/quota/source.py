"""Namespace compute quotas: ``ComputeQuota`` objects through the Kube adapter,
or a YAML file (``scheduler.quota_file``) when there is no cluster.

A ComputeQuota's limits are read from ``spec.hard`` with the resource names
pods use (``ai.compute/vram`` as a quantity, ``ai.compute/acu`` a number);
several quotas in one namespace: the tightest of each wins. ``UsedWriter``
writes their ``status.used`` from the ledger (reservations and pledges).
The file::

    namespaces:
      ml-team: {vram: 640Gi, acu: 800}

Answers are cached for ``ttl_s``; a failing API keeps the last answer
(quotas fail open: the bind still checks capacity) and logs it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
import yaml

from hcs_bus import tasks
from hcs_bus.errors import ConfigError, HcsError
from hcs_bus.messages import Reservation
from hcs_bus.telemetry import logger
from hcs_bus.units import QuantityError, format_mib, parse_quantity, quantity_mib
from scheduler.ledger.pledge_rules import Held
from scheduler.ledger.reservation_store import Kube
from scheduler.plan.rules import QuotaLimits, namespace_usage

_log = logger("hcs.scheduler.quotas")


class _Limits(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    vram: str | int | None = None
    acu: str | int | float | None = None


class _File(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    namespaces: dict[str, _Limits] = {}


def read_file(path: str | Path) -> dict[str, QuotaLimits]:
    """Quota limits per namespace from a YAML file; ConfigError names the problem."""
    try:
        raw = yaml.safe_load(Path(path).read_text()) or {}
        parsed = msgspec.convert(raw, _File)
        return {ns: _limits(lim.vram, lim.acu) for ns, lim in parsed.namespaces.items()}
    except (OSError, yaml.YAMLError, msgspec.ValidationError, QuantityError) as exc:
        raise ConfigError(f"quota file {path}: {exc}") from exc


def _limits(vram: Any, acu: Any) -> QuotaLimits:
    return QuotaLimits(
        vram_mib=quantity_mib(vram) if vram is not None else None,
        acu=float(parse_quantity(acu)) if acu is not None else None,
    )


def from_objects(objects: list[dict[str, Any]]) -> QuotaLimits | None:
    """The tightest limits over a namespace's ComputeQuota objects."""
    vram: int | None = None
    acu: float | None = None
    for obj in objects:
        hard = (obj.get("spec") or {}).get("hard") or {}
        lim = _limits(_pick(hard, "vram"), _pick(hard, "acu"))
        if lim.vram_mib is not None:
            vram = lim.vram_mib if vram is None else min(vram, lim.vram_mib)
        if lim.acu is not None:
            acu = lim.acu if acu is None else min(acu, lim.acu)
    if vram is None and acu is None:
        return None
    return QuotaLimits(vram_mib=vram, acu=acu)


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
    reservations: Iterable[Reservation], pledged: Mapping[str, tuple[Held, int]]
) -> dict[str, Used]:
    """Per namespace: what its reservations hold (``plan.rules.namespace_usage``,
    the sum its quota verdicts use), plus its outstanding pledges
    (``pledged``: namespace → (what they hold, how many))."""
    out = {
        ns: Used(vram_mib=u.vram_mib, acu=u.acu, devices=u.devices)
        for ns, u in namespace_usage(reservations).items()
    }
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
        kube: Kube,
        quotas: QuotaSource,
        used: Callable[[], dict[str, Used]],
    ) -> None:
        self.kube, self.quotas, self.used = kube, quotas, used
        self._written: dict[tuple[str, str], dict[str, Any]] = {}

    async def write(self) -> int:
        """One round; how many quotas were patched."""
        now = self.used()
        count = 0
        for ns in sorted(set(now) | set(self.quotas.names)):
            await self.quotas.limits(ns)  # lists the quotas when the cache is old
            body = now.get(ns, Used()).body()
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

    async def run(self, *, every_s: float = 2.0) -> None:
        while True:
            await self.write()
            await asyncio.sleep(every_s)
