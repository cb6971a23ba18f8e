"""The pending HCS pods, kept from the scheduler's pod watch so that the
stranding scan (``scheduler.replan.loop``) need not list them from the API
server every few seconds (up to 1,000 pods every 2 s in bench.burst).

Each ADDED or MODIFIED pod is kept while ``replanning.pending`` reads it as a
pending HCS pod (keyed namespace/name) and dropped once it is not (bound,
finished, going, another scheduler's); a DELETED one is dropped. The store
is trusted only while ``synced`` is set: ``restart`` (each time the watch is
opened again, from a fresh list) empties it and clears ``synced``, which the
watch sets again once every pod of its first list has been applied; so a pod
deleted while nobody watched is not kept. Until then the scan lists."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from scheduler.replan import rules as replanning
from scheduler.replan.rules import Pending


@dataclass
class PendingPods:
    scheduler_name: str
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    _pods: dict[str, Pending] = field(default_factory=dict)

    def restart(self) -> None:
        """A new watch begins with a fresh list: forget everything until it is taken."""
        self.synced.clear()
        self._pods.clear()

    def apply(self, kind: str, pod: dict[str, Any]) -> None:
        """One watch event (ADDED|MODIFIED|DELETED); other kinds are ignored."""
        meta = pod.get("metadata") or {}
        key = f"{meta.get('namespace', 'default')}/{meta.get('name', '')}"
        if kind == "DELETED":
            self._pods.pop(key, None)
            return
        if kind not in ("ADDED", "MODIFIED"):
            return
        found = replanning.pending(pod, scheduler_name=self.scheduler_name)
        if found is None:
            self._pods.pop(key, None)
        else:
            self._pods[key] = found

    def pods(self) -> list[Pending] | None:
        """The pending HCS pods, or None while the store is not synced."""
        if not self.synced.is_set():
            return None
        return list(self._pods.values())
