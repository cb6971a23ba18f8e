"""Fingerprint order per node (pure: no I/O, no clocks).

An agent numbers its fingerprints ``seq`` = 1, 2, … within one boot
(``boot_id``). A fingerprint is applied only when it is newer than the last
one applied for its node: the same boot with a higher ``seq``, or a boot not
seen before (the node restarted). A lower or equal ``seq`` of the current
boot, or any fingerprint of a boot that was already replaced, is old and
ignored (counted). The body's ``time_s`` plays no part: a node's clock may be
hours off, and staleness is judged on receive time by whoever applies.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hcs_bus.messages import NodeFingerprint

RETIRED_BOOTS_KEPT = 8  # replaced boots remembered per node


@dataclass(slots=True)
class _Held:
    boot_id: str
    seq: int
    retired: deque[str] = field(default_factory=lambda: deque(maxlen=RETIRED_BOOTS_KEPT))


class FingerprintOrder:
    """The (boot, seq) last applied per node; ``ignored`` counts old ones."""

    def __init__(self) -> None:
        self._held: dict[str, _Held] = {}
        self.ignored = 0

    def admit(self, fp: NodeFingerprint) -> bool:
        """True (and recorded as the node's latest) when ``fp`` is newer than
        the last admitted of its node; False (counted) when it is old."""
        held = self._held.get(fp.node)
        if held is None:
            self._held[fp.node] = _Held(fp.boot_id, fp.seq)
            return True
        if fp.boot_id == held.boot_id:
            if fp.seq > held.seq:
                held.seq = fp.seq
                return True
        elif fp.boot_id not in held.retired:
            held.retired.append(held.boot_id)
            held.boot_id, held.seq = fp.boot_id, fp.seq
            return True
        self.ignored += 1
        return False

    def forget(self, node: str) -> None:
        self._held.pop(node, None)
