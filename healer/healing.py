"""The healer service: fetch → judge → decide → act → ack.

Consumes ``hcs.health.*`` (durable ``<durable>-health``, explicit acks, only
while leader), ``hcs.fp.*`` (latest fingerprints: fleet medians, telemetry,
node staleness) and ``hcs.alloc.*`` (which pods use which devices). Judges
every device (``healer.rules``), publishes each changed verdict on
``hcs.health._healer_<node>`` (source "healer", ignored when it comes back), and
applies node plans (``healer.decisions``) through the circuit breaker and the
``Actor``. A degraded node's jobs are asked to checkpoint before eviction. A
victim that is a gang member (``hcs.io/gang``) restarts its gang whole
(``healer.restarting``): after a checkpoint where a sidecar runs, every
member is evicted, not the one rank alone.

A new leader starts knowing nothing of what the previous one applied, so it
reads the Node of every node it learns about from fingerprints and *adopts*
our taint (and the ``HCSHealthy`` condition) found there: the node is held at
the verdict the taint stands for (an ``ADOPTED`` pseudo-device) until its
fingerprints have been healthy for the recovery window, then untainted.

A node whose decision or action failed unexpectedly is logged
(``reconsider_failed``) and decided again by the sweep: the verdict change
that made it dirty is recorded and does not come again.

Fatal events are judged the moment they arrive. A node's fingerprint
telemetry is judged at most every ``telemetry_every_s`` (degradation is a
matter of a 60 s window; 1 Hz fingerprints from 5,000 nodes would otherwise
starve the fatal path), but a device missing or in error is judged at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
from typing import Any

import nats
from nats.js.api import DeliverPolicy

from hcs_bus import subjects, tasks, vocabulary
from hcs_bus.bus import Bus, Consumer, Delivery, Follower
from hcs_bus.errors import HcsError, KubeNotFound, PermanentError, TemporaryError
from hcs_bus.kube import Kube
from hcs_bus.messages import AllocationEvent, HealthEvent, NodeFingerprint, Telemetry
from hcs_bus.ordering import FingerprintOrder
from hcs_bus.settings import HealerSettings
from hcs_bus.streams import ALLOC, FP, HEALTH
from hcs_bus.telemetry import SECONDS_BUCKETS, logger, meter, zero_init
from healer import decisions, restarting, rules
from healer.acting import Actor, our_condition, our_taint
from healer.bindings import Bindings
from healer.breaker import Breaker
from healer.histories import DeviceHistory, FingerprintSample, Judgement
from healer.leading import Leader
from healer.requesting import CheckpointAsker
from healer.signals import Fleet

_log = logger("hcs.healer")
_meter = meter("hcs.healer")
VERDICTS = _meter.create_counter("hcs_healer_verdicts", description="verdict changes")
UNKNOWN = zero_init(
    _meter.create_counter("hcs_healer_unknown_kinds", description="unknown event kinds")
)
REACTION_SECONDS = _meter.create_histogram(
    "hcs_healer_reaction_seconds",
    unit="s",
    description="health batch read to changed verdicts published and node plans applied",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)

NODE = decisions.NODE  # history index for node-wide events (no device index, node-wide kind)
ADOPTED = -2  # history index for a taint found on the Node, applied by a previous leader
_READ_CONCURRENCY = 16  # Node reads in flight while adopting
_EMPTY = Telemetry()
_YIELD_EVERY = 25  # fingerprints judged between two turns of the event loop
ISOLATED = vocabulary.Kind.ISOLATED  # a healer event: an isolation the circuit breaker counted
HEALTH_BACKOFF_MAX_S = 30.0  # the longest wait between two deliveries of a health batch


class Healer:
    def __init__(
        self,
        bus: Bus,
        kube: Kube | None,
        settings: HealerSettings,
        *,
        identity: str = "hcs-healer",
        durable: str = "hcs-healer",
        rule_set: rules.Rules | None = None,
        actor: Actor | None = None,
        telemetry_every_s: float = 2.0,
    ) -> None:
        self.bus = bus
        self.kube = kube
        self.settings = settings
        self.durable = durable
        self.rules = rule_set or rules.load(
            degraded_window_s=settings.degraded_window_s,
            recovery_window_s=settings.recovery_window_s,
            taint_failed_share=settings.taint_failed_share,
        )
        self.actor = actor or Actor(bus=bus, kube=kube, dry_run=settings.dry_run)
        self.leader = Leader(kube, identity=identity, settings=settings, on_change=self._leadership)
        self.breaker = Breaker(
            max_fraction=settings.breaker_max_fraction, window_s=settings.breaker_window_s
        )
        self.asker = CheckpointAsker(bus, wait_s=settings.checkpoint_wait_s)
        self.restarts = restarting.GangRestarts(kube)
        self.fleet = Fleet(self.rules.telemetry)
        self.bindings = Bindings()
        self.histories: dict[str, dict[int, DeviceHistory]] = {}
        self.nodes: dict[str, decisions.NodeState] = {}
        self.last_seen: dict[str, float] = {}
        self.order = FingerprintOrder()  # older (boot, seq) fingerprints are ignored
        self.unknown = 0
        self.telemetry_every_s = telemetry_every_s
        self._judged_at: dict[str, float] = {}
        self.ready = asyncio.Event()
        self._locks: dict[str, asyncio.Lock] = {}
        self._tasks: list[asyncio.Task[Any]] = []
        self._leader_task: asyncio.Task[Any] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._acting: set[asyncio.Task[Any]] = set()
        self._leading = asyncio.Lock()
        self._unapplied: set[str] = set()
        self._judged: dict[int, str] = {}  # HCS_HEALTH sequences judged, not yet acked
        self.read_nodes: set[str] = set()  # Nodes read (and adopted) this leadership term
        self._to_read = asyncio.Event()
        self._seq = 0

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        self._leader_task = tasks.start(self.leader.run(), name="healer:leader")
        await self.leader.changed.wait()

    async def stop(self) -> None:
        if self._leader_task is not None:
            await tasks.stop(self._leader_task)
        await tasks.stop(*self._background)
        await self._stop_consuming()

    def _leadership(self, leader: bool) -> None:
        task = tasks.start(self._follow_leadership(), name=f"healer:leadership:{leader}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _follow_leadership(self) -> None:
        """Consume while leader, not otherwise; one change at a time, always to
        the current state (a quick win-lose-win must not leave a follower consuming)."""
        async with self._leading:
            if self.leader.is_leader:
                await self._start_consuming()
            else:
                await self._stop_consuming()

    async def _start_consuming(self) -> None:
        if self._tasks:
            return
        await self._restore_breaker()
        self.order = FingerprintOrder()  # a new term replays the latest fingerprints
        consumers: list[tuple[str, Consumer[Any]]] = [
            (
                "fp",
                Consumer(
                    self.bus,
                    stream=FP,
                    kind=NodeFingerprint,
                    handle=self._on_fps,
                    filter_subject=subjects.FP_ALL,
                    batch=250,
                    ack_all=True,
                ),
            ),
            (
                "alloc",
                Consumer(
                    self.bus,
                    stream=ALLOC,
                    kind=AllocationEvent,
                    handle=self._on_allocs,
                    filter_subject=subjects.ALLOC_ALL,
                    batch=1000,
                    ack_all=True,
                ),
            ),
            (
                "health",
                Consumer(
                    self.bus,
                    stream=HEALTH,
                    kind=HealthEvent,
                    handle=self._on_health,
                    filter_subject=subjects.HEALTH_ALL,
                    durable=f"{self.durable}-health",
                    deliver=DeliverPolicy.NEW,
                    batch=200,
                    fetch_timeout_s=0.05,
                    ack_wait_s=60.0,
                    # a fault is never dropped for an outage, however long: a
                    # batch whose action the API refused is redelivered, 1 s,
                    # 2 s, 4 s … at most HEALTH_BACKOFF_MAX_S apart
                    max_deliver=-1,
                    backoff_max_s=HEALTH_BACKOFF_MAX_S,
                ),
            ),
        ]
        if self.kube is not None and not self.actor.dry_run:
            self._tasks.append(tasks.start(self._adopting(), name="healer:adopt"))
        for name, consumer in consumers:
            await consumer.start()
            self._tasks.append(tasks.start(consumer.run(), name=f"healer:{name}"))
        for name, consumer in consumers[:2]:
            await asyncio.wait_for(consumer.caught_up.wait(), timeout=60.0)
            _log.info("replayed", stream=name, delivered=consumer.delivered)
        self._tasks.append(tasks.start(self._sweep(), name="healer:sweep"))
        self.ready.set()
        _log.info(
            "healing",
            recovery_window_s=self.rules.recovery_window_s,
            degraded_window_s=self.rules.degraded_window_s,
            min_change_interval_s=self.rules.min_change_interval_s,
            node_stale_s=self.rules.node_stale_s,
            telemetry_every_s=self.telemetry_every_s,
            dry_run=self.actor.dry_run,
        )

    async def _stop_consuming(self) -> None:
        """Stop consuming and acting: a replica that is not leader must not go on
        evicting (PDB retries, checkpoint-then-evict) behind the new leader's back."""
        running, self._tasks = self._tasks, []
        acting, self._acting = self._acting, set()
        self.ready.clear()
        self.read_nodes.clear()  # the next term reads what the other leader applied
        await tasks.stop(*running, *acting)
        await self.actor.close()

    # -- inputs ----------------------------------------------------------------

    async def _on_allocs(self, items: list[Delivery[AllocationEvent]]) -> None:
        for item in items:
            self.bindings.apply(item.value)

    async def _on_health(self, items: list[Delivery[HealthEvent]]) -> None:
        """Judge, decide and act; acked only once every node the batch touched
        has its plan applied. A refused action (the API away) fails the batch
        with a TemporaryError: it stays on the bus, redelivered until applied,
        to a new leader too; events judged already are not judged twice."""
        now = asyncio.get_running_loop().time()
        dirty: set[str] = set()
        publishing: list[Any] = []
        try:
            for item in items:
                event = item.value
                if event.source == "healer":
                    continue
                if item.stream_seq in self._judged:  # a redelivery: act, do not count again
                    dirty.add(event.node)
                    continue
                self._judged[item.stream_seq] = event.node
                index = decisions.history_index(device=event.device, kind=event.kind)
                history = self._history(event.node, index)
                judgement = rules.judge(history, event, now=now, rules=self.rules)
                if judgement.unknown:
                    self._count_unknown(event)
                if judgement.changed:
                    dirty.add(event.node)
                    publishing.append(self._publish_verdict(history, judgement))
            await asyncio.gather(*(self._reconsider(n, now=now) for n in dirty), *publishing)
            if dirty:
                REACTION_SECONDS.record(asyncio.get_running_loop().time() - now)
        except PermanentError:
            raise
        except HcsError as exc:
            raise TemporaryError(f"health batch: {exc}", delay_s=1.0) from exc
        except Exception as exc:  # a bug must not kill the loop: dead-lettered, replayable
            _log.exception("health_batch_failed", error=repr(exc))
            raise PermanentError(f"health batch: {exc!r}") from exc
        waiting = sorted(dirty & self._unapplied)
        if waiting:
            raise TemporaryError(f"not applied yet on {', '.join(waiting[:10])}", delay_s=1.0)
        for item in items:
            self._judged.pop(item.stream_seq, None)

    async def _on_fps(self, items: list[Delivery[NodeFingerprint]]) -> None:
        now = asyncio.get_running_loop().time()
        items = [item for item in items if self.order.admit(item.value)]
        self.fleet.update(item.value for item in items)
        dirty: set[str] = set()
        publishing: list[Any] = []
        for count, item in enumerate(items, start=1):
            if count % _YIELD_EVERY == 0:
                await asyncio.sleep(0)  # let a fatal event in between: it must not queue here
            fp = item.value
            self.last_seen[fp.node] = now
            if fp.node not in self.read_nodes:
                self._to_read.set()
            for history, judgement in self._judge_fp(fp, now=now):
                if judgement.changed:
                    dirty.add(fp.node)
                    publishing.append(self._publish_verdict(history, judgement))
            if self.nodes.get(fp.node, decisions.NodeState()).verdict == "lost":
                dirty.add(fp.node)
            adopted = self.histories.get(fp.node, {}).get(ADOPTED)
            if adopted is not None and adopted.verdict == "healthy":
                del self.histories[fp.node][ADOPTED]  # recovered: nothing left to hold
        done = await asyncio.gather(
            *(self._reconsider(n, now=now) for n in dirty), *publishing, return_exceptions=True
        )
        for failed in (r for r in done if isinstance(r, Exception)):  # the batch goes on
            _log.error("fingerprint_batch_failed", error=repr(failed), exc_info=failed)

    def _judge_fp(
        self, fp: NodeFingerprint, *, now: float
    ) -> list[tuple[DeviceHistory, Judgement]]:
        out = []
        seen = set()
        last = self._judged_at.get(fp.node)
        full = last is None or now - last >= self.telemetry_every_s
        if full:
            self._judged_at[fp.node] = now
        known = self.histories.get(fp.node, {})
        for d in fp.devices:
            seen.add(d.index)
            if not full and d.error is None and d.index in known and not known[d.index].lost:
                continue  # telemetry is judged every telemetry_every_s; loss at once
            tflops, clock = self.fleet.medians(d.model, now=now)
            sample = FingerprintSample(
                fp.node, d.index, d.model, d.telemetry, True, d.error, tflops, clock
            )
            history = self._history(fp.node, d.index)
            out.append((history, rules.judge(history, sample, now=now, rules=self.rules)))
        for index, history in self.histories.get(fp.node, {}).items():
            if index not in seen and index >= 0 and not history.lost:
                sample = FingerprintSample(fp.node, index, history.model, _EMPTY, present=False)
                out.append((history, rules.judge(history, sample, now=now, rules=self.rules)))
        for index in (ADOPTED, NODE):  # the node's own: a fingerprint counts towards recovery
            held = known.get(index)
            if full and held is not None:
                sample = FingerprintSample(fp.node, index, "", _EMPTY)
                out.append((held, rules.judge(held, sample, now=now, rules=self.rules)))
        return out

    async def _sweep(self) -> None:
        """Nodes whose fingerprints stopped are lost; refused taints are tried again."""
        loop = asyncio.get_running_loop()
        period = max(0.2, min(self.rules.node_stale_s / 4, 5.0))
        while True:
            await asyncio.sleep(period)
            now = loop.time()
            for node, seen in list(self.last_seen.items()):
                stale = now - seen >= self.rules.node_stale_s
                if stale and self.nodes.get(node, decisions.NodeState()).verdict != "lost":
                    await self._reconsider(node, now=now)
            retrying = [self._reconsider(n, now=now) for n in list(self._unapplied)]
            await asyncio.gather(*retrying)  # taints the API refused until now

    # -- adopting what a previous leader applied -------------------------------------

    async def _adopting(self) -> None:
        """Read the Node of every node seen in fingerprints once per leadership term."""
        gate = asyncio.Semaphore(_READ_CONCURRENCY)

        async def read(node: str) -> None:
            async with gate:
                await self._adopt(node)

        while True:
            await self._to_read.wait()
            self._to_read.clear()
            pending = set(self.last_seen) - self.read_nodes
            await asyncio.gather(*(read(n) for n in pending))
            if set(self.last_seen) - self.read_nodes:
                await asyncio.sleep(1.0)  # some reads failed: try them again
                self._to_read.set()

    async def _adopt(self, node: str) -> None:
        assert self.kube is not None
        try:
            found = await self.kube.get_node(node)
        except KubeNotFound:
            self.read_nodes.add(node)  # no such Node: nothing applied to adopt
            return
        except (HcsError, OSError, TimeoutError) as exc:
            _log.warning("node_read_failed", node=node, error=str(exc))
            return
        async with self._locks.setdefault(node, asyncio.Lock()):
            self.read_nodes.add(node)
            condition = our_condition(found)
            if condition is not None:
                self.actor.adopt_condition(node, condition)
            taint = our_taint(found)
            state = self.nodes.get(node, decisions.NodeState())
            if taint is None or state.effect or state.blocked:
                return  # nothing of ours there, or this leader has acted on it already
            self._hold(node, effect=str(taint.get("effect") or ""), value=taint.get("value"))

    def _hold(self, node: str, *, effect: str, value: object) -> None:
        """Take over a taint found on the Node as applied by us: the node stays at
        the verdict it stands for until healthy for the recovery window."""
        verdict: Any = "degraded" if effect == "PreferNoSchedule" else "failed"
        history = self._history(node, ADOPTED)
        history.verdict, history.reason = verdict, f"tainted by a previous leader ({value})"
        history.changed_at, history.good_since = asyncio.get_running_loop().time(), None
        held = frozenset({ADOPTED})
        self.nodes[node] = decisions.NodeState(
            verdict,
            effect,
            failed=held if verdict == "failed" else frozenset(),
            degraded=held if verdict == "degraded" else frozenset(),
        )
        _log.info(
            "taint_adopted",
            node=node,
            effect=effect,
            value=value,
            verdict=verdict,
            held_at_least_s=max(self.rules.recovery_window_s, self.rules.min_change_interval_s),
        )

    # -- deciding and acting ------------------------------------------------------

    async def _reconsider(self, node: str, *, now: float) -> None:
        """Decide and act on one node. A failure is logged and the node is tried
        again by the sweep: the verdict change that made it dirty has been
        recorded and will not come again, so nothing else would bring it back."""
        try:
            await self._decide(node, now=now)
        except Exception as exc:  # a bug must not leave the node as it is forever
            _log.exception("reconsider_failed", node=node, error=repr(exc))
            self._unapplied.add(node)

    async def _decide(self, node: str, *, now: float) -> None:
        lock = self._locks.setdefault(node, asyncio.Lock())
        async with lock:
            seen = self.last_seen.get(node)
            stale = seen is not None and now - seen >= self.rules.node_stale_s
            judged = rules.judge_node(self.histories.get(node, {}).values(), stale=stale)
            previous = self.nodes.get(node, decisions.NodeState())
            devices = sum(1 for i in self.histories.get(node, {}) if i >= 0)
            node_plan = decisions.plan(previous, judged, rules=self.rules, devices=devices)
            verdict = node_plan.state.verdict  # the node as a whole: one failed device of 8 is not
            if verdict != previous.verdict:
                await self._publish_node_verdict(node, verdict, node_plan.reason)
            self.nodes[node] = await self._apply(node, node_plan, previous=previous, now=now)

    async def _apply(
        self,
        node: str,
        plan: decisions.NodePlan,
        *,
        previous: decisions.NodeState,
        now: float,
    ) -> decisions.NodeState:
        self._unapplied.discard(node)
        if plan.empty:
            return plan.state
        if plan.isolates:
            decision = self.breaker.admit(node, known_nodes=self._known_nodes(), now=now)
            if not decision.allowed:
                await self._breaker_open(node, plan, reason=decision.reason)
                return decisions.blocked(plan)
            await self._publish(node, self._isolation(node), tag="isolated")
        if plan.taint is not None:
            pods = [b.key for b in self._victims(node, plan.evict_now)]
            if plan.taint:
                done = await self.actor.taint(
                    node, effect=plan.taint, reason=plan.reason, pods=pods
                )
            else:
                done = await self.actor.untaint(node, reason=f"healthy again ({plan.reason})")
            if not done:  # keep the effect really applied: the sweep plans the taint again
                self._unapplied.add(node)
                plan = dataclasses.replace(
                    plan, state=dataclasses.replace(plan.state, effect=previous.effect)
                )
        if plan.evict_now:
            victims = self._victims(node, plan.evict_now)
            why = f"devices {list(plan.evict_now)} failed"
            found = await self.restarts.split(victims) if not self.actor.dry_run else None
            await self.actor.evict(list(found.alone) if found else victims, reason=why)
            for gang in found.gangs if found else ():
                self._act(self._restart(gang, reason=f"{why} on {node}"), name=f"gang:{gang.key}")
        if plan.checkpoint_then_evict:
            victims = self._victims(node, plan.checkpoint_then_evict)
            self._act(self._checkpoint_then_evict(node, victims), name=f"ckpt:{node}")
        return plan.state

    def _act(self, work: Any, *, name: str) -> None:
        """Start acting in the background (stopped when leadership is lost)."""
        task = tasks.start(work, name=f"healer:{name}")
        self._acting.add(task)
        task.add_done_callback(self._acting.discard)

    async def _restart(self, gang: restarting.Gang, *, reason: str) -> None:
        """Checkpoint the gang's job where a sidecar runs, then evict every member."""
        if gang.sidecar and gang.job:
            await self.asker.checkpoint(gang.namespace, gang.job, reason=reason)
        restarting.RESTARTS.add(1, {"outcome": "restarted"})
        _log.warning(
            "gang_restarting",
            gang=gang.key,
            members=[m.key for m in gang.members],
            checkpointed=gang.sidecar,
            reason=reason,
        )
        await self.actor.evict(list(gang.members), reason=f"gang {gang.key} restarts: {reason}")

    def _victims(self, node: str, devices: tuple[int, ...]) -> list[Any]:
        """Pods on ``devices``; every HCS pod of the node when the whole node
        (``NODE``: an event without a device index) is affected."""
        if NODE in devices:
            return self.bindings.on_node(node)
        return self.bindings.on_devices(node, devices)

    async def _checkpoint_then_evict(self, node: str, victims: list[Any]) -> None:
        """Checkpoint, then evict; a gang member's gang is evicted whole."""
        if not victims:
            return
        await self.asker.checkpoint_all(victims, reason=f"node {node} degraded")
        if self.nodes.get(node, decisions.NodeState()).verdict == "healthy":
            _log.info("degraded_eviction_cancelled", node=node)
            return
        found = await self.restarts.split(victims) if not self.actor.dry_run else None
        await self.actor.evict(
            list(found.alone) if found else victims, reason=f"node {node} degraded"
        )
        for gang in found.gangs if found else ():
            reason = f"gang {gang.key} restarts: node {node} degraded"
            await self.actor.evict(list(gang.members), reason=reason)

    def _known_nodes(self) -> int:
        return max(len(self.fleet.nodes), len(self.nodes))

    def _isolation(self, node: str) -> HealthEvent:
        """The record of an isolation the breaker counted (``ISOLATED``): the
        breaker's window lives on the bus, so a new leader starts with it."""
        return HealthEvent(
            node=node,
            kind=ISOLATED,
            severity="info",
            source="healer",
            time_s=_wall(),
            evidence={"breaker_window_s": f"{self.breaker.window_s:g}"},
            message=f"isolated {node}: counted by the circuit breaker",
        )

    async def _restore_breaker(self) -> None:
        """Count again the isolations the breaker's window still holds, from
        the ``ISOLATED`` records on HCS_HEALTH (whoever led when they were made)."""
        loop = asyncio.get_running_loop()
        window_s = self.breaker.window_s
        since = datetime.datetime.now(datetime.UTC) - datetime.timedelta(seconds=window_s)
        wall_now, loop_now = _wall(), loop.time()
        self.breaker = Breaker(max_fraction=self.breaker.max_fraction, window_s=window_s)

        def record(item: Delivery[HealthEvent]) -> None:
            event = item.value
            if event.kind == ISOLATED and subjects.is_healer_health(item.subject):
                at = item.received_s or event.time_s
                self.breaker.record(event.node, now=loop_now - max(0.0, wall_now - at))

        follower = Follower(
            self.bus,
            stream=HEALTH,
            subject=subjects.HEALTH_ALL,
            kind=HealthEvent,
            handle=record,
            deliver=DeliverPolicy.BY_START_TIME,
            opt_start_time=since,
        )
        try:
            await follower.start()
            await asyncio.wait_for(follower.caught_up.wait(), timeout=60.0)
        except (HcsError, TimeoutError, nats.errors.Error) as exc:
            _log.error("breaker_not_restored", error=repr(exc))
        finally:
            await follower.stop()
        _log.info("breaker_restored", isolated=self.breaker.isolated(now=loop_now))

    async def _breaker_open(self, node: str, plan: decisions.NodePlan, *, reason: str) -> None:
        _log.error("breaker_open", node=node, verdict=plan.state.verdict, reason=reason)
        event = HealthEvent(
            node=node,
            kind="breaker_open",
            severity="critical",
            source="healer",
            time_s=_wall(),
            verdict=_device_verdict(plan.state.verdict),
            evidence={
                "reason": reason,
                "would_taint": plan.taint or "",
                "verdict": plan.state.verdict,
            },
            message=f"circuit breaker open: not isolating {node} ({reason})",
        )
        await self._publish(node, event, tag="breaker")

    # -- publishing ----------------------------------------------------------------

    async def _publish_verdict(self, history: DeviceHistory, judgement: Judgement) -> None:
        if history.device == ADOPTED:
            return  # not a device: the node verdict that follows says it
        VERDICTS.add(1, {"verdict": judgement.verdict})
        event = HealthEvent(
            node=history.node,
            kind="verdict",
            severity=_severity(judgement.verdict),
            source="healer",
            time_s=_wall(),
            device=None if history.device == NODE else history.device,
            verdict=judgement.verdict,
            health_score=judgement.health_score,
            evidence={**judgement.evidence, vocabulary.DEVICES_OUT: self._out(history.node)},
            message=history.reason,
        )
        await self._publish(history.node, event, tag=f"v{history.device}")

    async def _publish_node_verdict(self, node: str, verdict: str, reason: str) -> None:
        scores = [h.score for i, h in self.histories.get(node, {}).items() if i >= 0]
        event = HealthEvent(
            node=node,
            kind="verdict",
            severity=_severity(_device_verdict(verdict)),
            source="healer",
            time_s=_wall(),
            verdict=_device_verdict(verdict),
            health_score=min(scores, default=100) if verdict != "lost" else 0,
            evidence={
                "node_verdict": verdict,
                "reason": reason[:500],
                vocabulary.DEVICES_OUT: self._out(node),
            },
            message=reason[:500],
        )
        await self._publish(node, event, tag="node")

    async def _publish(self, node: str, event: HealthEvent, *, tag: str) -> None:
        self._seq += 1
        msg_id = f"healer:{node}:{tag}:{event.time_s}:{self._seq}"
        try:
            await self.bus.publish(subjects.healer_health(node), event, msg_id=msg_id)
        except HcsError as exc:
            _log.warning("verdict_publish_failed", node=node, error=str(exc))

    def _out(self, node: str) -> str:
        """The devices of ``node`` held failed now (``vocabulary.DEVICES_OUT``)."""
        held = self.histories.get(node, {})
        return ",".join(str(i) for i in sorted(held) if i >= 0 and held[i].verdict == "failed")

    def _history(self, node: str, device: int) -> DeviceHistory:
        devices = self.histories.setdefault(node, {})
        found = devices.get(device)
        if found is None:
            found = devices[device] = DeviceHistory(node=node, device=device)
        return found

    def _count_unknown(self, event: HealthEvent) -> None:
        self.unknown += 1
        UNKNOWN.add(1, {"kind": event.kind[:40]})
        _log.warning(
            "unknown_health_kind",
            node=event.node,
            kind=event.kind,
            device=event.device,
            count=self.unknown,
        )


def _device_verdict(verdict: str) -> Any:
    return "failed" if verdict == "lost" else verdict


def _severity(verdict: str) -> Any:
    return {"healthy": "info", "degraded": "warning"}.get(verdict, "critical")


def _wall() -> float:
    # Producer timestamp of an outgoing event, not a decision input.
    return datetime.datetime.now(datetime.UTC).timestamp()
