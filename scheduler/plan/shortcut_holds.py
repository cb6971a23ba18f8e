"""What the shortcut plans of one replica hold until their pods are booked.

A quick plan (``Planner.quick``) pledges nothing in KV; what it gave is held
here, in this replica's memory, so the plans after it count it. The holds are
kept summed per class and per namespace as they come: a plan reads the sums,
never the list. Under overload every plan is a quick one, so a plan that
walked the list would cost as much as the holds before it, and an overloaded
replica would fall further behind with every plan it answered.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

from scheduler.ledger.pledge_rules import Held, Pledge


class Hold(NamedTuple):
    until: float  # loop time past which it is dropped (a pledge's TTL)
    namespace: str
    pod: str  # the pod's name, or "" for a generated one (never matched to a booking)
    held: Pledge


class ShortcutHolds:
    """The holds standing, and their sums by class and by namespace."""

    def __init__(self) -> None:
        self._items: list[Hold] = []
        self.by_class: dict[str, Held] = {}
        self.by_namespace: dict[str, Held] = {}
        self.version = 0  # changes whenever the sums do

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Hold]:
        return iter(self._items)

    def add(self, hold: Hold) -> None:
        self._items.append(hold)
        self._count(hold)
        self.version += 1

    def expire(self, now: float) -> None:
        """Drop the holds whose time has passed (cheap when none has: holds
        come in order of their time, all with the same TTL)."""
        if self._items and self._items[0].until <= now:
            self.keep(lambda h: h.until > now)

    def keep(self, wanted: Callable[[Hold], bool]) -> None:
        """Only the holds ``wanted`` says to keep; the sums counted again."""
        kept = [h for h in self._items if wanted(h)]
        if len(kept) == len(self._items):
            return
        self._items = kept
        self.by_class, self.by_namespace = {}, {}
        for hold in kept:
            self._count(hold)
        self.version += 1

    def _count(self, hold: Hold) -> None:
        key = hold.held.key
        self.by_class[key] = self.by_class.get(key, Held()).plus(hold.held)
        self.by_namespace[hold.namespace] = self.by_namespace.get(hold.namespace, Held()).plus(
            hold.held
        )
