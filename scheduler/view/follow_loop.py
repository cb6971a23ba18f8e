"""Keeps a replica's ``ClusterState`` in step with the bus.

At start each replica replays, for itself (ephemeral consumers, docs/architecture.md#streams):
the latest fingerprint of every node (``HCS_FP``, last per subject), recent
health events (``HCS_HEALTH`` from ``now − health_replay_s``), and every
node's reservations (KV ``hcs_alloc`` watch, done once it has brought every
key the bucket held when it began: ``hcs_bus.kvkeys``). The same consumers
then carry on live. ``ready`` is set only when all three have caught up; a watchdog
marks nodes stale when their fingerprints stop.

Time is the bus server's: each fingerprint is applied with the time the
server received it (``Delivery.received_s``), and staleness is judged on
``clock`` (``hcs_bus.clocks.BusClock``: the server's clock as the messages
show it), never on an agent's or this replica's wall clock. Staleness is
judged once more as soon as the fingerprints are replayed, so a node whose
last fingerprint is old is stale when the view becomes ready. Fingerprints
whose boot claim is in the future of their receipt are dead-lettered by the
follower (``hcs_bus.clocks.future_claim``, ``clock_skew_tolerance_s``).

With a cluster, the Node watch (``watching.watch_nodes``) feeds Node labels
through ``apply_node``; ``nodes_synced`` (set by the runner) then also
gates ``ready``, for at most ``SYNC_WAIT_S``, so a fresh replica does not bind
on fingerprint labels the Nodes contradict. The steps in ``before_ready``
run after that and gate it too (the runner's first reconcile: a replica
takes no bind before the ledger holds every pod bound by HCS).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import msgspec
from nats.js.api import DeliverPolicy
from nats.js.kv import KeyValue

from hcs_bus import kvkeys, messages, streams, subjects, tasks
from hcs_bus.bus import Bus, Delivery, Follower
from hcs_bus.clocks import BusClock
from hcs_bus.errors import BusUnavailable
from hcs_bus.messages import HealthEvent, NodeFingerprint, NodeReservations
from hcs_bus.settings import SchedulerSettings
from hcs_bus.telemetry import logger, observe_counter
from scheduler.view.state import ClusterState

_log = logger("hcs.scheduler.view")
_views: weakref.WeakSet[ClusterView] = weakref.WeakSet()
SYNC_WAIT_S = 5.0  # longest wait for the Nodes' first list; the reservations' is logged


class ClusterView:
    """A ClusterState fed from the bus. ``state`` may be read at any time."""

    def __init__(
        self,
        bus: Bus,
        *,
        settings: SchedulerSettings,
        state: ClusterState | None = None,
        health_replay_s: float = 24 * 3600.0,
        batch: int = 1000,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.state = state or ClusterState()
        self.health_replay_s = health_replay_s
        self.batch = batch
        self.ready = asyncio.Event()
        self.applied = 0
        self.clock = BusClock()
        self.listeners: list[Callable[[str], None]] = []
        # KV hcs_alloc keys that are not nodes (``pledges=<ns>``; no node name
        # has ``=``): (key, value or None when deleted, revision)
        self.key_listeners: list[Callable[[str, bytes | None, int], None]] = []
        self._tasks: list[asyncio.Task[Any]] = []
        self._kv_ready = asyncio.Event()
        self._replay: kvkeys.Replay | None = None  # the keys the first watch must bring
        self._fp: Follower[NodeFingerprint] | None = None
        self._health: Follower[HealthEvent] | None = None
        self.nodes_synced: asyncio.Event | None = None  # set: wait for the Node list
        # run in order once the replay is done, before ``ready`` (the runner's
        # first reconcile of the ledger against the pods)
        self.before_ready: list[Callable[[], Awaitable[None]]] = []
        _views.add(self)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        since = dt.datetime.now(dt.UTC) - dt.timedelta(seconds=self.health_replay_s)
        self._fp = Follower(
            self.bus,
            stream=streams.FP,
            subject=subjects.FP_ALL,
            kind=NodeFingerprint,
            handle=self._on_fingerprint,
            deliver=DeliverPolicy.LAST_PER_SUBJECT,
            clock_skew_tolerance_s=self.settings.clock_skew_tolerance_s,
        )
        # Verdicts older than the replay window have been superseded by the
        # healer's later ones (it republishes on every change).
        self._health = health_follower(self.bus, since=since, handle=self._on_health)
        await self._fp.start()
        await self._health.start()
        kv = await self.bus.js.key_value(streams.KV_ALLOC)
        self._tasks = [
            # a KV watch that dies (a dropped connection, a bug) is started again:
            # a replica must never stop seeing reservations while it answers
            tasks.supervise(lambda: self._watch_reservations(kv), name="view:alloc"),
            tasks.start(self._watch_staleness(), name="view:stale"),
            tasks.start(self._wait_caught_up(loop.time()), name="view:ready"),
        ]

    async def stop(self) -> None:
        await tasks.stop(*self._tasks)
        self._tasks = []
        for follower in (self._fp, self._health):
            if follower is not None:
                await follower.stop()

    async def wait_ready(self, *, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self.ready.wait()

    # -- handlers ---------------------------------------------------------
    def _on_fingerprint(self, item: Delivery[NodeFingerprint]) -> None:
        loop_s = asyncio.get_running_loop().time()
        self.clock.saw(item.received_s, loop_s=loop_s)
        received_s = item.received_s or self.clock.now(loop_s=loop_s) or 0.0
        if self.state.apply_fingerprint(item.value, now=received_s):
            self._changed(item.value.node)
        self.applied += 1

    def _on_health(self, item: Delivery[HealthEvent]) -> None:
        self.clock.saw(item.received_s, loop_s=asyncio.get_running_loop().time())
        if self.state.apply_health(item.value):
            self._changed(item.value.node)
        self.applied += 1

    def apply_node(
        self, node: str, labels: Mapping[str, str] | None, *, blocked: str | None = None
    ) -> bool:
        """Take a Node object's labels (None: the Node was deleted) and why it
        takes no new pods (None: it does); listeners hear of the node when
        either changed."""
        if not self.state.apply_node(node, labels, blocked=blocked):
            return False
        self._changed(node)
        return True

    async def _watch_reservations(self, kv: KeyValue) -> None:
        if not self._kv_ready.is_set():  # the keys first: a watch may say "done" early
            self._replay = kvkeys.Replay(await kvkeys.stored_keys(self.bus, streams.KV_ALLOC))
            if self._replay.done:
                self._kv_ready.set()
        watcher = await kv.watchall()
        try:
            await self._follow(watcher)
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    async def _follow(self, watcher: KeyValue.KeyWatcher) -> None:
        decode = messages.decoder_for(NodeReservations).decode
        async for entry in watcher:
            if entry is None:  # nats-py's end of the replay, which can come early
                continue
            if self._replay is not None and self._replay.saw(entry.key):
                self._kv_ready.set()
            if "=" in entry.key:
                gone = entry.operation in ("DEL", "PURGE")
                for listener in self.key_listeners:
                    listener(entry.key, None if gone else entry.value, entry.revision or 0)
                continue
            node = subjects.node_from_token(entry.key)
            if entry.operation in ("DEL", "PURGE") or not entry.value:
                self.state.apply_reservations(node, None)
            else:
                try:
                    doc = decode(entry.value)
                    self.state.apply_reservations(node, doc, revision=entry.revision)
                except msgspec.MsgspecError as exc:
                    _log.error("bad_reservation_doc", node=node, rev=entry.revision, error=str(exc))
                    continue
            self._changed(node)

    async def _watch_staleness(self) -> None:
        period = max(self.settings.stale_after_s / 5, 0.05)
        while True:
            await asyncio.sleep(period)
            self._mark_stale()

    def _mark_stale(self) -> None:
        """Mark the nodes silent for ``stale_after_s`` on the server's clock."""
        now = self.clock.now(loop_s=asyncio.get_running_loop().time())
        if now is None:  # nothing received yet: no node to judge
            return
        after_s = self.settings.stale_after_s
        for node in self.state.mark_stale(now=now, stale_after_s=after_s):
            _log.warning("node_stale", node=node, after_s=after_s)
            self._changed(node)

    async def _wait_caught_up(self, started: float) -> None:
        assert self._fp is not None and self._health is not None
        await self._fp.caught_up.wait()
        await self._health.caught_up.wait()
        self._mark_stale()  # a node replayed from an old fingerprint is stale now
        await self._reservations_replayed()
        if self.nodes_synced is not None:
            try:
                async with asyncio.timeout(SYNC_WAIT_S):
                    await self.nodes_synced.wait()
            except TimeoutError:
                _log.warning("nodes_not_listed", waited_s=SYNC_WAIT_S, labels="from fingerprints")
        for step in self.before_ready:
            await step()
        self.ready.set()
        took = asyncio.get_running_loop().time() - started
        _log.info("view_ready", nodes=len(self.state.nodes), replay_s=round(took, 3))

    async def _reservations_replayed(self) -> None:
        """Wait until the watch has brought every key stored when it began;
        every ``SYNC_WAIT_S`` the keys purged since are let go (nothing of
        theirs is left to bring) and the wait is logged."""
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SYNC_WAIT_S):
                    await self._kv_ready.wait()
            if self._kv_ready.is_set():
                return
            if self._replay is None:
                _log.warning("reservations_replaying", waiting="the ledger's keys (not listed yet)")
                continue
            try:
                stored = await kvkeys.stored_keys(self.bus, streams.KV_ALLOC)
            except BusUnavailable as exc:
                _log.warning("reservations_replaying", error=str(exc))
                continue
            if self._replay.keep_only(stored):
                self._kv_ready.set()
            else:
                _log.warning("reservations_replaying", waiting=len(self._replay.waiting))

    def _changed(self, node: str) -> None:
        if self.listeners:
            for listener in self.listeners:
                listener(node)


def health_follower(
    bus: Bus, *, since: dt.datetime, handle: Callable[[Delivery[HealthEvent]], None]
) -> Follower[HealthEvent]:
    """Every node's health events published since ``since``, then each new one."""
    return Follower(
        bus,
        stream=streams.HEALTH,
        subject=subjects.HEALTH_ALL,
        kind=HealthEvent,
        handle=handle,
        deliver=DeliverPolicy.BY_START_TIME,
        opt_start_time=since,
    )


def _applied_total() -> float:
    return float(sum(view.applied for view in _views))


observe_counter(
    "hcs_view_applied",
    _applied_total,
    description="bus messages applied to the view",
    meter_name="hcs.scheduler",
)
