"""The alert feed as ``hcs top`` shows it: health events worth a person's
eye (warnings, fatals, the healer's verdicts) from ``hcs.health.*``.

``recent`` reads the newest ones back from stream ``HCS_HEALTH`` so that
``hcs top --once --json`` and a freshly started live view show the same
alerts as one that has been running; ``is_alert`` is the one filter both use.
"""

from __future__ import annotations

import msgspec
from nats.js.errors import NotFoundError

from hcs_bus import identity, messages, streams
from hcs_bus.bus import Bus
from hcs_bus.messages import HealthEvent

_decode = messages.decoder_for(HealthEvent).decode


def is_alert(subject: str, event: HealthEvent) -> bool:
    """Shown as an alert: believable on its subject, and not mere information."""
    if identity.refusal(subject, event):
        return False  # a forged verdict or another node's body
    return event.severity != "info" or event.source == "healer"


def decoded(subject: str, data: bytes) -> HealthEvent | None:
    """The alert in ``data``, or None when it is none (or not decodable)."""
    try:
        event = _decode(data)
    except (msgspec.MsgspecError, UnicodeDecodeError, RecursionError):
        return None
    return event if is_alert(subject, event) else None


async def recent(bus: Bus, *, limit: int = 50, scan: int = 500) -> list[HealthEvent]:
    """Up to ``limit`` newest alerts, oldest first, looking back at most ``scan``
    messages of ``HCS_HEALTH`` (informational events are most of them)."""
    info = await bus.js.stream_info(streams.HEALTH)
    last, first = info.state.last_seq, info.state.first_seq
    found: list[HealthEvent] = []
    seq = last
    while seq and seq >= max(first, last - scan + 1) and len(found) < limit:
        try:
            raw = await bus.js.get_msg(streams.HEALTH, seq)
        except NotFoundError:  # deleted or aged out between info and get
            seq -= 1
            continue
        event = decoded(raw.subject or "", raw.data or b"")
        if event is not None:
            found.append(event)
        seq -= 1
    return found[::-1]
