"""``hcs usage [--namespace N] [--since 24h] [--json]``: replays ``HCS_ALLOC``
itself (no running service needed) and prints device-, ACU- and
VRAM-GiB-hours per namespace and model over the window (``scheduler.report.usage_rules``
does the sums; allocations still held count up to now)."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Any

from hcs_bus import streams, subjects
from hcs_bus.bus import Bus, Delivery, Follower
from hcs_bus.errors import BusTimeout
from hcs_bus.messages import AllocationEvent
from scheduler.report import usage_rules as metering
from scheduler.report.usage_rules import Lifetimes

REPLAY_TIMEOUT_S = 30.0
HEADERS = ("NAMESPACE", "MODEL", "DEVICE-H", "ACU-H", "VRAM-GiB-H", "HELD")


def rows(
    life: Lifetimes, *, since: float, now: float, namespace: str | None
) -> list[dict[str, Any]]:
    """One row per (namespace, vendor, model) that held devices in ``[since, now]``."""
    found = metering.usage(life.spans(), since=since, now=now, namespace=namespace)
    held: dict[tuple[str, str, str], int] = {}
    for span in life.open.values():
        held[span.key] = held.get(span.key, 0) + span.devices
    return [
        {
            "namespace": ns,
            "vendor": vendor,
            "model": model,
            "device_seconds": round(value.device_s, 3),
            "acu_seconds": round(value.acu_s, 3),
            "vram_gib_seconds": round(value.vram_gib_s, 3),
            "held_devices": held.get((ns, vendor, model), 0),
        }
        for (ns, vendor, model), value in sorted(found.items())
    ]


def table(found: list[dict[str, Any]], *, since: float, now: float) -> str:
    head = f"usage from {_iso(since)} to {_iso(now)}"
    if not found:
        return f"{head}: no devices were held"
    lines = [
        (
            r["namespace"],
            f"{r['vendor']}/{r['model']}",
            f"{r['device_seconds'] / 3600:,.2f}",
            f"{r['acu_seconds'] / 3600:,.1f}",
            f"{r['vram_gib_seconds'] / 3600:,.1f}",
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


async def run(bus: Bus, *, namespace: str | None, since_s: float, as_json: bool, now: float) -> int:
    life = await replay(bus)
    since = now - since_s
    found = rows(life, since=since, now=now, namespace=namespace)
    if as_json:
        window = {"since": _iso(since), "until": _iso(now), "window_s": since_s}
        print(json.dumps({**window, "rows": found}, indent=2))
    else:
        print(table(found, since=since, now=now))
    return 0
