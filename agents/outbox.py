"""The agent's bounded outbox (pure): what waits to be published, in order.

While NATS is unreachable the agent keeps producing. When the box is full
the OLDEST fingerprint goes first (a later snapshot supersedes it); health
events are dropped — oldest first — only once nothing but health events is
left. Every drop is counted by kind.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

import msgspec

Kind = Literal["fingerprint", "health"]


@dataclass(frozen=True, slots=True)
class Item:
    subject: str
    message: msgspec.Struct
    msg_id: str
    kind: Kind
    traceparent: str | None = None  # the trace it was queued in, published with it


@dataclass
class Outbox:
    capacity: int
    items: deque[Item] = field(default_factory=deque)
    dropped: dict[str, int] = field(default_factory=lambda: {"fingerprint": 0, "health": 0})

    def __post_init__(self) -> None:
        if self.capacity < 1:
            raise ValueError(f"outbox capacity must be >= 1, got {self.capacity}")

    def __len__(self) -> int:
        return len(self.items)

    def put(self, item: Item) -> Item | None:
        """Append; returns the item dropped to make room, if any."""
        dropped = self._make_room() if len(self.items) >= self.capacity else None
        self.items.append(item)
        return dropped

    def _make_room(self) -> Item:
        for i, queued in enumerate(self.items):
            if queued.kind == "fingerprint":
                del self.items[i]
                self.dropped["fingerprint"] += 1
                return queued
        oldest = self.items.popleft()
        self.dropped[oldest.kind] += 1
        return oldest

    def discard(self, subject: str, kind: Kind) -> int:
        """Remove every queued ``kind`` item for ``subject``; how many there were."""
        kept = deque(i for i in self.items if i.subject != subject or i.kind != kind)
        gone = len(self.items) - len(kept)
        self.items = kept
        return gone

    def peek(self) -> Item | None:
        return self.items[0] if self.items else None

    def pop(self) -> Item:
        return self.items.popleft()
