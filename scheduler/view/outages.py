"""Which devices of a node are out, from the healer's verdicts (pure).

A device is *out* (isolated: kept out of placement, its pods evicted) while
the healer's latest verdict about it is ``failed``. ``track`` folds one healer
event into the devices held out:

* a device verdict ``failed`` puts the device out (reason: the verdict's
  message, since: its time; a repeated verdict keeps the first reason and
  time);
  ``healthy`` or ``degraded`` brings it back;
* every healer verdict also carries ``evidence.devices_out`` (the indices the
  healer holds failed when it published, comma-separated; "" for none).
  That list is authoritative: a mirror that started from the last event of
  each node (``LAST_PER_SUBJECT``) still knows every device out, only not
  why (reason ``failed``) — so ``kubectl get computenodes`` never shows a
  device out that is back, or misses one that is out.

``entries`` renders them for ComputeNode ``status.devicesOut``.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcs_bus.messages import DeviceFingerprint, HealthEvent
from hcs_bus.vocabulary import DEVICES_OUT


@dataclass(frozen=True, slots=True)
class Outage:
    index: int
    reason: str
    since_s: float
    said: bool = True  # False: known only from a list, its device verdict not seen yet


def listed(value: object) -> frozenset[int] | None:
    """The indices of an ``evidence.devices_out`` value; None when absent or
    not a list of indices (a healer that does not say)."""
    if not isinstance(value, str):
        return None
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not all(p.isdigit() for p in parts):
        return None
    return frozenset(int(p) for p in parts)


def track(held: Mapping[int, Outage], event: HealthEvent) -> dict[int, Outage]:
    """The devices out once ``event`` (a healer verdict) is taken in."""
    out = dict(held)
    if event.source != "healer" or event.kind != "verdict" or event.verdict is None:
        return out
    if event.device is not None:
        if event.verdict == "failed":
            held_one = out.get(event.device)
            if held_one is None or not held_one.said:  # a list may come before the verdict
                since = min(event.time_s, held_one.since_s if held_one else event.time_s)
                out[event.device] = Outage(event.device, event.message or "failed", since)
        else:
            out.pop(event.device, None)
    said = listed(event.evidence.get(DEVICES_OUT))
    if said is not None:
        out = {i: out.get(i) or Outage(i, "failed", event.time_s, said=False) for i in sorted(said)}
    return out


def entries(
    out: Mapping[int, Outage], devices: tuple[DeviceFingerprint, ...]
) -> list[dict[str, Any]]:
    """``status.devicesOut``: one entry per device out, by index."""
    uuids = {d.index: d.uuid for d in devices}
    return [
        {
            "index": o.index,
            "id": uuids.get(o.index, ""),
            "reason": o.reason[:500],
            "since": _iso(o.since_s),
        }
        for o in sorted(out.values(), key=lambda o: o.index)
    ]


def _iso(time_s: float) -> str:
    try:
        moment = datetime.datetime.fromtimestamp(time_s, tz=datetime.UTC)
    except (OverflowError, OSError, ValueError):
        return ""
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")
