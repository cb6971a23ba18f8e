"""Times on the bus (pure: no I/O, no clock reads).

The times in a message body (``time_s``, ``boot_s``) are read off its
sender's clock, which may be hours off. Nothing that orders fingerprints or
judges a node stale reads them: fingerprints are ordered by (boot, seq)
(``hcs_bus.ordering``), and a node is as fresh as the JetStream server's
receive time of its latest fingerprint (the message's metadata timestamp,
``Delivery.received_s``) against ``BusClock``, the server's clock as the
messages received show it.

A body's clock may be off but must agree with itself. Its ``time_s`` says
where the sender's clock stood when it sent the message, which the server
received at ``received_s``; any other time the body claims is put on the
server's clock by that offset (``claimed − time_s + received_s``). A
fingerprint whose boot, put so, falls after the server received it by more
than the tolerance (``scheduler.clock_skew_tolerance_s``) claims a boot that
has not happened: ``future_claim`` says why, naming the field, and the
consumers (``hcs_bus.consuming``) dead-letter it. A time that is not a finite
number is refused the same way. An agent whose clock is simply ahead or
behind claims nothing in the future and is believed.
"""

from __future__ import annotations

import math

from hcs_bus.messages import NodeFingerprint

DEFAULT_CLOCK_SKEW_TOLERANCE_S = 30.0


def future_claim(value: object, *, received_s: float, tolerance_s: float) -> str:
    """Why ``value``, received by the server at ``received_s`` (Unix s; 0: not
    known), claims a time it cannot have; "" when it claims none."""
    if not isinstance(value, NodeFingerprint):
        return ""
    for name, claimed in (("time_s", value.time_s), ("boot_s", value.boot_s)):
        if not math.isfinite(claimed):
            return f"fingerprint {name} is {claimed!r}, not a time"
    if not value.boot_s or received_s <= 0:  # boot not said (an older agent), or no receipt
        return ""
    boot_on_server_s = value.boot_s - value.time_s + received_s
    ahead_s = boot_on_server_s - received_s
    if ahead_s <= tolerance_s:
        return ""
    return (
        f"fingerprint boot_s claims a boot {ahead_s:.0f} s after the server received it "
        f"(boot_s {value.boot_s!r}, time_s {value.time_s!r}; tolerance {tolerance_s:g} s)"
    )


class BusClock:
    """The bus server's clock, as read off the messages received.

    Each message was stored by the server at ``received_s`` (its clock), no
    later than the moment it was read (the loop's monotonic clock): the
    largest ``received_s − loop_s`` seen is the offset between the two. So
    ``now`` is never ahead of the server, and behind it by the delivery
    delay of the freshest message (milliseconds while fingerprints flow).
    A server clock stepped back is followed only once it has caught up
    with the offset held."""

    def __init__(self) -> None:
        self._offset_s: float | None = None

    def saw(self, received_s: float, *, loop_s: float) -> None:
        """Note a message the server received at ``received_s``, read at ``loop_s``."""
        if received_s <= 0:
            return
        offset_s = received_s - loop_s
        if self._offset_s is None or offset_s > self._offset_s:
            self._offset_s = offset_s

    def now(self, *, loop_s: float) -> float | None:
        """The server's time at ``loop_s``; None before any message was seen."""
        return None if self._offset_s is None else loop_s + self._offset_s
