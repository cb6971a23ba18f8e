"""``hcs usage [--namespace N] [--since 24h] [--json]``: replays ``HCS_ALLOC``
itself (no running service needed) and prints device-, ACU- and
VRAM-GiB-hours per namespace and model over the window (``scheduler.report.usage_rules``
does the sums; allocations still held count up to now), each split into what
was held within the namespace's ComputeQuota guarantee and what was borrowed
beyond it. The guarantees are the cluster's ComputeQuotas when one is
configured, else ``scheduler.quota_file``'s; a namespace with no ComputeQuota
has no guarantee and borrowed all it held (as the shared pool's reclaim
treats it); one whose quotas cannot be read has no split (``-``, ``null``),
said once on stderr."""

from __future__ import annotations

import asyncio
import datetime
import json
import sys
from collections.abc import Iterable, Mapping
from typing import Any

from hcs_bus import kube as kube_mod
from hcs_bus import streams, subjects
from hcs_bus.bus import Bus, Delivery, Follower
from hcs_bus.errors import BusTimeout, ConfigError, HcsError
from hcs_bus.messages import AllocationEvent
from hcs_bus.settings import Settings
from hcs_bus.units import QuantityError
from scheduler.plan.rules import QuotaLimits
from scheduler.quota.source import from_objects, read_file
from scheduler.report import usage_rules as metering
from scheduler.report.usage_rules import Guarantee, Lifetimes, Split, Usage

REPLAY_TIMEOUT_S = 30.0
HEADERS = (
    "NAMESPACE",
    "MODEL",
    *("DEVICE-H", "WITHIN", "BORROWED"),
    *("ACU-H", "WITHIN", "BORROWED"),
    *("VRAM-GiB-H", "WITHIN", "BORROWED"),
    "HELD",
)


def rows(
    life: Lifetimes,
    *,
    since: float,
    now: float,
    namespace: str | None,
    guarantees: Mapping[str, Guarantee] | None = None,
) -> list[dict[str, Any]]:
    """One row per (namespace, vendor, model) that held devices in ``[since, now]``,
    split at its namespace's guarantee (``within``, ``borrowed``; None for a
    namespace missing from ``guarantees`` when given: its quotas are unknown)."""
    spans = [s for s in life.spans() if namespace is None or s.namespace == namespace]
    found = metering.usage(spans, since=since, now=now)
    known = dict(guarantees) if guarantees is not None else {ns: Guarantee() for ns, _, _ in found}
    split = metering.split_by_key(spans, since=since, now=now, guarantees=known)
    held: dict[tuple[str, str, str], int] = {}
    for span in life.open.values():
        held[span.key] = held.get(span.key, 0) + span.devices
    return [
        {
            "namespace": ns,
            "vendor": vendor,
            "model": model,
            **_seconds(value),
            **_parts(split.get((ns, vendor, model), Split()) if ns in known else None),
            "held_devices": held.get((ns, vendor, model), 0),
        }
        for (ns, vendor, model), value in sorted(found.items())
    ]


def by_namespace(
    found: list[dict[str, Any]], *, guarantees: Mapping[str, Guarantee]
) -> list[dict[str, Any]]:
    """The rows summed per namespace, with the guarantee they were split at."""
    out: dict[str, dict[str, Any]] = {}
    for row in found:
        ns = row["namespace"]
        into = out.setdefault(ns, {"namespace": ns, **_guaranteed(guarantees.get(ns))})
        _add(into, row)
    return list(out.values())


def _seconds(value: Usage) -> dict[str, float]:
    return {
        "device_seconds": round(value.device_s, 3),
        "acu_seconds": round(value.acu_s, 3),
        "vram_gib_seconds": round(value.vram_gib_s, 3),
    }


def _parts(split: Split | None) -> dict[str, Any]:
    if split is None:
        return {"within": None, "borrowed": None}
    return {"within": _seconds(split.within), "borrowed": _seconds(split.borrowed)}


def _guaranteed(guarantee: Guarantee | None) -> dict[str, Any]:
    if guarantee is None:
        return {"guaranteed": None}
    return {"guaranteed": {"acu": guarantee.acu, "vram_mib": guarantee.vram_mib}}


_UNITS = ("device_seconds", "acu_seconds", "vram_gib_seconds")


def _add(into: dict[str, Any], row: Mapping[str, Any]) -> None:
    for unit in _UNITS:
        into[unit] = round(into.get(unit, 0.0) + row[unit], 3)
    for part in ("within", "borrowed"):
        if row[part] is None or (part in into and into[part] is None):
            into[part] = None
            continue
        have = into.setdefault(part, dict.fromkeys(_UNITS, 0.0))
        for unit in _UNITS:
            have[unit] = round(have[unit] + row[part][unit], 3)


async def guarantees(
    settings: Settings, namespaces: Iterable[str]
) -> tuple[dict[str, Guarantee], dict[str, str]]:
    """Each namespace's guarantee, from the cluster's ComputeQuotas when one
    is configured, else from ``scheduler.quota_file`` (no quota: none); and
    why the quotas of those left out could not be read."""
    wanted = sorted(set(namespaces))
    kube = await kube_mod.connect(settings.kube)
    if kube is None:
        path = settings.scheduler.quota_file
        try:
            limits = read_file(path) if path else {}
        except ConfigError as exc:
            return {}, dict.fromkeys(wanted, str(exc))
        return {ns: _guarantee(limits.get(ns)) for ns in wanted}, {}
    found: dict[str, Guarantee] = {}
    unread: dict[str, str] = {}
    try:
        for ns in wanted:
            try:
                found[ns] = _guarantee(from_objects(await kube.list_compute_quotas(ns)))
            except (HcsError, QuantityError) as exc:
                unread[ns] = str(exc)
    finally:
        await kube.close()
    return found, unread


def _guarantee(limits: QuotaLimits | None) -> Guarantee:
    if limits is None:
        return Guarantee()
    return Guarantee(acu=limits.guaranteed_acu, vram_mib=limits.guaranteed_vram_mib)


def table(found: list[dict[str, Any]], *, since: float, now: float) -> str:
    head = f"usage from {_iso(since)} to {_iso(now)}"
    if not found:
        return f"{head}: no devices were held"
    lines = [
        (
            r["namespace"],
            f"{r['vendor']}/{r['model']}",
            *_hours(r, "device_seconds", ",.2f"),
            *_hours(r, "acu_seconds", ",.1f"),
            *_hours(r, "vram_gib_seconds", ",.1f"),
            str(r["held_devices"]),
        )
        for r in found
    ]
    widths = [max(len(row[i]) for row in [HEADERS, *lines]) for i in range(len(HEADERS))]
    body = [
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(row, widths, strict=True))
        )
        for row in [HEADERS, *lines]
    ]
    return "\n".join([head, *body])


def _hours(row: Mapping[str, Any], unit: str, spec: str) -> tuple[str, str, str]:
    """The row's total in ``unit`` in hours, then within and borrowed ("-": unknown)."""
    parts = [row.get("within"), row.get("borrowed")]
    shown = [format(p[unit] / 3600, spec) if p is not None else "-" for p in parts]
    return format(row[unit] / 3600, spec), shown[0], shown[1]


def _iso(time_s: float) -> str:
    moment = datetime.datetime.fromtimestamp(time_s, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


async def replay(bus: Bus, *, timeout_s: float = REPLAY_TIMEOUT_S) -> Lifetimes:
    """Every allocation lifetime ``HCS_ALLOC`` holds now."""
    life = Lifetimes()

    def take(item: Delivery[AllocationEvent]) -> None:
        life.apply(item.value)

    follower: Follower[AllocationEvent] = Follower(
        bus, stream=streams.ALLOC, subject=subjects.ALLOC_ALL, kind=AllocationEvent, handle=take
    )
    await follower.start()
    try:
        async with asyncio.timeout(timeout_s):
            await follower.caught_up.wait()
    except TimeoutError:
        raise BusTimeout(f"replaying {streams.ALLOC} took longer than {timeout_s:g} s") from None
    finally:
        await follower.stop()
    return life


async def run(
    bus: Bus,
    settings: Settings,
    *,
    namespace: str | None,
    since_s: float,
    as_json: bool,
    now: float,
) -> int:
    life = await replay(bus)
    since = now - since_s
    held = metering.usage(life.spans(), since=since, now=now, namespace=namespace)
    known, unread = await guarantees(settings, (ns for ns, _, _ in held))
    for ns, why in sorted(unread.items()):
        print(
            f"hcs usage: {ns}: its ComputeQuotas could not be read, no split: {why}",
            file=sys.stderr,
        )
    found = rows(life, since=since, now=now, namespace=namespace, guarantees=known)
    if as_json:
        window = {"since": _iso(since), "until": _iso(now), "window_s": since_s}
        namespaces = by_namespace(found, guarantees=known)
        print(json.dumps({**window, "rows": found, "namespaces": namespaces}, indent=2))
    else:
        print(table(found, since=since, now=now))
    return 0
