"""Reservations in KV ``hcs_alloc``: bind, release and expiry (docs/architecture.md#ledger).

Every write is a compare-and-set on the node key's revision (``create`` when
the key is absent; ``hcs_bus.kvcas``), so two replicas can never hand out the same device
slice: the loser re-reads the document, re-decides against it and either
books other devices or answers "no longer fits". Fit is judged on the KV
document itself (plus the view's fingerprint for the devices), never on the
possibly lagging view.

Bind: reserve (``reserved``) → POST the Binding with the ``hcs.io/*``
annotations (devices, VRAM quota, resume point, collective-library flags)
→ mark ``bound`` (restoring the reservation if it vanished meanwhile) →
publish ``AllocationEvent bound``. A failed Binding releases the reservation.
Every change of a node's document (reserve, mark, release) goes through
one group commit per node (``scheduler.ledger.group_commit``): changes that arrive
while a write is on its way are applied together and written once, so binds
crowding one node do not race each other's compare-and-set.
One left ``reserved`` longer than ``reserve_ttl_s`` is checked against its
pod first: bound to that node → marked ``bound`` (a crash between the
Binding and the mark); gone or not bound there → ``AllocationEvent
expired``; the pod unreadable → kept until the next round. A reservation
whose pod is bound is never expired.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from nats.errors import Error as NatsError
from nats.js.errors import KeyNotFoundError
from nats.js.kv import KeyValue

from hcs_bus import checkpoint, kvcas, messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BusUnavailable, HcsError, KubeNotFound
from hcs_bus.messages import (
    AllocationEvent,
    AllocState,
    DeviceSlice,
    NodeReservations,
    PodRef,
    Reservation,
)
from hcs_bus.quorum import LeaderWatch
from hcs_bus.telemetry import SECONDS_BUCKETS, TallyCounter, logger, meter, span, zero_init
from scheduler.extender.collectives import collective_annotations
from scheduler.extender.rules import Demand, check_node, choose_devices, slices_for
from scheduler.ledger import audit_rules as ledger
from scheduler.ledger import claim_rules as claims
from scheduler.ledger.audit_rules import BindingOutcome
from scheduler.ledger.group_commit import Batches
from scheduler.plan import gang_records, pods
from scheduler.view.state import ClusterState, DeviceView, NodeView, booked

_log = logger("hcs.scheduler.booking")
_meter = meter("hcs.scheduler")
BINDS = TallyCounter("hcs_scheduler_binds", description="bind outcomes", meter_name="hcs.scheduler")
CONFLICTS = zero_init(
    _meter.create_counter("hcs_scheduler_cas_conflicts", description="KV CAS retries")
)
WRITES = zero_init(
    TallyCounter(
        "hcs_scheduler_node_writes",
        description="node reservation documents written to KV",
        meter_name="hcs.scheduler",
    )
)
BIND_SECONDS = _meter.create_histogram(
    "hcs_scheduler_bind_seconds",
    unit="s",
    description="time to bind one pod: reserve, POST the Binding, announce",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
BIND_STEP_SECONDS = _meter.create_histogram(
    "hcs_scheduler_bind_step_seconds",
    unit="s",
    description=(
        "each step of a bind: pledge (spend), reserve (KV), binding (API);"
        " mark (KV): from the Binding until the mark rides a write of the node"
    ),
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)


class _step:
    """``with _step("claim"):`` times one step of a bind into
    ``BIND_STEP_SECONDS``; a plain class, cheaper than a generator-based
    context manager on every bind."""

    __slots__ = ("attributes", "started")

    def __init__(self, name: str) -> None:
        self.attributes = _STEP_ATTRIBUTES.get(name) or {"step": name}
        self.started = 0.0

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *_exc: object) -> None:
        BIND_STEP_SECONDS.record(time.perf_counter() - self.started, self.attributes)


_STEP_ATTRIBUTES = {name: {"step": name} for name in ("pledge", "claim", "reserve", "binding")}


OVERCOMMITS = _meter.create_counter(
    "hcs_scheduler_overcommitted_devices",
    description="devices found holding more than they have (the ledger cannot undo it)",
)
# writes of a node's document tried before giving up: a rival replica writes on
# its own last write without a read, so a loser under a burst may lose often
MAX_ATTEMPTS = 50
MARK_AFTER_S = 1.0  # longest a bound pod's mark waits for its node's next write
_DOC = messages.decoder_for(NodeReservations)
_CLAIM = msgspec.json.Decoder(claims.PodClaim)


class Kube(Protocol):
    """The part of ``hcs_bus.kube.Kube`` the scheduler uses."""

    async def bind_pod(
        self, namespace: str, name: str, *, uid: str, node: str, annotations: dict[str, str]
    ) -> Any: ...

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any]: ...

    def watch_pods(
        self, *, field_selector: str | None = None, synced: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    def watch_nodes(
        self,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        synced: asyncio.Event | None = None,
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]: ...

    async def list_compute_quotas(self, namespace: str) -> list[dict[str, Any]]: ...

    async def patch_compute_quota_used(
        self, namespace: str, name: str, used: dict[str, Any]
    ) -> dict[str, Any]: ...

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        cached: bool = False,
    ) -> list[dict[str, Any]]: ...

    async def list_pod_annotations(self, namespace: str) -> list[dict[str, Any]]: ...

    async def list_pod_summaries(self) -> list[dict[str, Any]]: ...


class Doc(msgspec.Struct, frozen=True):
    doc: NodeReservations | None
    revision: int | None


def device_annotations(
    *,
    vendor: str,
    slices: tuple[DeviceSlice, ...],
    resume_from: str | None,
    node: NodeView | None = None,
) -> dict[str, str]:
    """The ``hcs.io/*`` annotations the Binding carries. NVIDIA's runtime takes
    UUIDs (stable across reboots); the other vendors' runtimes take indices.
    With the node's view, also the collective-library flags that fit the
    chosen devices' links and the node's labels (``scheduler.extender.collectives``)."""
    ids = [s.uuid if vendor == "nvidia" and s.uuid else str(s.index) for s in slices]
    quota = ",".join(f"{i}:{s.vram_mib}Mi" for i, s in enumerate(slices))
    out = {pods.DEVICES_ANNOTATION: ",".join(ids), pods.VRAM_QUOTA_ANNOTATION: quota}
    if resume_from:
        out[pods.RESUME_ANNOTATION] = resume_from
    if node is not None:
        out |= collective_annotations(
            vendor=vendor,
            chosen=[s.index for s in slices],
            devices={i: d.fp for i, d in node.devices.items()},
            labels=node.labels,
        )
    return out


def expired(doc: NodeReservations, *, now: float, ttl_s: float) -> list[Reservation]:
    """Reservations stuck in ``reserved`` for longer than ``ttl_s``."""
    return [r for r in doc.reservations if r.state == "reserved" and now - r.time_s > ttl_s]


_same_pod = ledger.same_pod


@dataclass(frozen=True, slots=True)
class _Change:
    """What an edit makes of a node document: the new one (None: unchanged)
    and the answer for its caller once it is written."""

    doc: NodeReservations | None
    result: Any


# an edit of a node document: document -> its change. The batch it is in
# is written with ``hcs_bus.kvcas``: an answer that writes nothing is only
# ever given on a document just read, or on one a write proved the latest
_Edit = Callable[[NodeReservations | None], _Change]
_Applied = tuple[list[Any], bool]  # a batch's answers, and whether it wrote the document


class Booker:
    """Bind, release and expire reservations for one replica."""

    def __init__(
        self,
        bus: Bus,
        *,
        kv: KeyValue,
        ckpt: KeyValue | None,
        state: ClusterState,
        kube: Kube | None,
        replica: str,
        clock: Callable[[], float] = time.time,
        claim_ttl_s: float = 60.0,
    ) -> None:
        self.bus, self.kv, self.ckpt, self.state = bus, kv, ckpt, state
        self.kube, self.replica, self.clock = kube, replica, clock
        # a claim whose node holds no reservation is stale this long after it
        # was made (``claim_rules``: a bind that crashed between the two)
        self.claim_ttl_s = claim_ttl_s
        # the admission's pledge spent before a reservation (``Planner.spend``);
        # ("", pledge id) or (refusal, "")
        self.spend: Callable[[pods.PodInfo, Demand], Awaitable[tuple[str, str]]] | None = None
        # a pledge dropped when its pod goes away (``Pledger.release``)
        self.unpledge: Callable[..., Awaitable[bool]] | None = None
        self._docs: dict[str, Doc] = {}  # per node: the document last read or written here
        # every change of a node document goes through here: one write per batch
        self.batches: Batches[str, _Edit, Any] = Batches(self._commit)
        self._tasks: set[asyncio.Task[None]] = set()
        # whether the ledger's stream has a leader (``hcs_bus.quorum``): without
        # one, binds and plans are refused with its reason, never guessed
        self.quorum: LeaderWatch | None = None

    def quorum_lost(self) -> str:
        """The refusal while the ledger's stream has no leader, else ""."""
        return self.quorum.reason if self.quorum is not None and self.quorum.lost else ""

    # -- KV documents -----------------------------------------------------
    async def read(self, node: str) -> Doc:
        """The node's document as KV holds it now (kept for ``known``)."""
        found = await kvcas.read(self.kv, subjects.alloc_key(node), decode=_DOC.decode)
        self._seen(node, found)
        return Doc(found.value, found.revision)

    def _seen(self, node: str, found: kvcas.Read[NodeReservations]) -> None:
        """Keep the document last read or written here (``known``)."""
        if found.revision is None:
            self._docs.pop(node, None)
        else:
            self._docs[node] = Doc(found.value, found.revision)

    def known(self, node: str) -> Doc | None:
        """The newest document of ``node`` known without a read: the one this
        replica last read or wrote, or the view's (its KV watch), whichever
        has the higher revision; None when neither has one.

        A compare-and-set against it is as safe as one after a fresh read: it
        lands only if that revision is still the latest, else it fails and
        the caller reads. It saves a KV round trip per write (two per bind).
        A decision that writes nothing (already there, no longer fits) is not
        taken on it: ``hcs_bus.kvcas`` reads first."""
        mine = self._docs.get(node)
        seen = self.state.revision_of(node)
        if seen is not None and (mine is None or mine.revision is None or seen > mine.revision):
            return Doc(self.state.reservations_of(node), seen)
        return mine if mine is not None and mine.revision is not None else None

    # -- bind -------------------------------------------------------------
    async def bind(self, pod: pods.PodInfo, demand: Demand, *, node: str) -> str:
        """Reserve, bind and announce; returns "" or the error for kube-scheduler.
        Traced as a child of the pod's admission (``hcs.io/traceparent``)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        attributes = {"hcs.pod": f"{pod.ref.namespace}/{pod.ref.name}", "hcs.node": node}
        with span("hcs.bind", traceparent=pod.traceparent, attributes=attributes):
            error = await self._bind(pod, demand, node=node)
        BIND_SECONDS.record(loop.time() - started, {"outcome": "refused" if error else "bound"})
        return error

    async def _bind(self, pod: pods.PodInfo, demand: Demand, *, node: str) -> str:
        if refusal := self.quorum_lost():
            BINDS.add(1, {"outcome": "quorum_lost"})  # logged once, by the watch
            return refusal
        try:
            with _step("pledge"):
                refusal, pledge = await self.spend(pod, demand) if self.spend else ("", "")
            if refusal:
                BINDS.add(1, {"outcome": "pledge_refused"})
                return refusal
            with _step("claim"):
                try:
                    claimed = await self._claim(pod.ref, node=node)
                except HcsError as exc:
                    raise BusUnavailable(f"{exc} (binding to {node})") from exc
            if claimed:
                BINDS.add(1, {"outcome": "claimed_elsewhere"})
                _log.warning("bind_refused_claimed", pod=pods_key(pod.ref), node=node, why=claimed)
                return claimed
            with _step("reserve"):
                reservation = await self._reserve(pod, demand, node=node, pledge=pledge)
        except HcsError as exc:
            BINDS.add(1, {"outcome": "refused"})
            await self._unclaim_quietly(pod.ref, node=node)
            return str(exc)
        if isinstance(reservation, str):
            BINDS.add(1, {"outcome": "no_longer_fits"})
            await self._unclaim_quietly(pod.ref, node=node)
            return reservation
        with _step("binding"):
            note, annotations = await self._post_binding(
                pod, reservation, node=node, vendor=demand.vendor
            )
        if note.startswith("hcs: Binding failed"):
            outcome = await self._binding_outcome(pod.ref, node=node)
            if outcome != "bound":
                await self._after_failed_binding(pod.ref, node=node, note=note, outcome=outcome)
                BINDS.add(1, {"outcome": "binding_failed"})
                return note
            _log.warning("binding_landed_after_all", pod=pod.ref.name, node=node, note=note)
            note = ""
        self._mark_later(reservation, node=node)
        await self.announce(node, reservation, state="bound", reason=note, annotations=annotations)
        BINDS.add(1, {"outcome": "bound"})
        return ""

    async def _claim(self, ref: PodRef, *, node: str) -> str:
        """Claim the pod for ``node`` (``claim_rules``) in one compare-and-set:
        "" when it may be bound there, else kube-scheduler's error. Tried as
        a create first (the usual case: no claim yet), so it costs one write."""
        now = self.clock()
        mine = claims.PodClaim(node=node, uid=ref.uid, time_s=now)

        async def decide(
            found: claims.PodClaim | None,
        ) -> kvcas.Change[claims.PodClaim, str]:
            held_there = False
            if found is not None and found.node != node:
                held_there = ledger.holding((await self.read(found.node)).doc, ref) is not None
            v = claims.verdict(
                found,
                node=node,
                uid=ref.uid,
                now=now,
                ttl_s=self.claim_ttl_s,
                held_there=held_there,
            )
            if v.outcome == "take":
                return kvcas.Put(mine, "")
            if v.outcome == "mine":
                return kvcas.Keep("")
            return kvcas.Keep(claims.refusal(v, ref=ref, node=node))

        answer: str = await kvcas.update(
            self.kv,
            claims.key_for(ref),
            decide,
            decode=_CLAIM.decode,
            encode=messages.encode,
            absent_first=True,
            attempts=MAX_ATTEMPTS,
        )
        return answer

    async def _unclaim(self, ref: PodRef, *, node: str) -> None:
        """Drop the pod's claim when it names ``node`` (its reservation there is gone)."""

        def decide(found: claims.PodClaim | None) -> kvcas.Change[claims.PodClaim, None]:
            if claims.releasable(found, node=node, uid=ref.uid):
                return kvcas.Delete(None)
            return kvcas.Keep(None)

        await kvcas.update(
            self.kv,
            claims.key_for(ref),
            decide,
            decode=_CLAIM.decode,
            encode=messages.encode,
            attempts=MAX_ATTEMPTS,
        )

    async def _unclaim_quietly(self, ref: PodRef, *, node: str) -> None:
        """``_unclaim``; a failure is logged: the claim goes stale after
        ``claim_ttl_s`` anyway (its node holds no reservation)."""
        try:
            await self._unclaim(ref, node=node)
        except HcsError as exc:
            _log.warning("unclaim_failed", pod=pods_key(ref), node=node, error=str(exc))

    async def _reserve(
        self, pod: pods.PodInfo, demand: Demand, *, node: str, pledge: str = ""
    ) -> Reservation | str:
        view = self.state.nodes.get(node)
        if view is None:
            return f"hcs: node {node} is unknown to HCS; cannot bind {pod.ref.name}"

        def reserve(doc: NodeReservations | None) -> _Change:
            current = doc.reservations if doc else ()
            mine = next((r for r in current if _same_pod(r.pod, pod.ref)), None)
            now = self.state.nodes.get(node) or view
            fit = check_node(booked(now, doc), demand)
            if mine is None and fit.ok:
                reservation = self._reservation(
                    pod, demand, fit_devices=choose_devices(fit, demand), pledge=pledge
                )
                added = NodeReservations(node=node, reservations=(*current, reservation))
                return _Change(added, reservation)
            if mine is not None:
                return _Change(None, mine)
            who = f"{pod.ref.namespace}/{pod.ref.name}"
            return _Change(None, f"hcs: {node} no longer fits {who}: {fit.reason}")

        found: Reservation | str = await self.batches.submit(node, reserve)
        return found

    def _reservation(
        self, pod: pods.PodInfo, demand: Demand, *, fit_devices: list[DeviceView], pledge: str = ""
    ) -> Reservation:
        acu = demand.acu_per_device * demand.devices
        return Reservation(
            pod=pod.ref,
            devices=slices_for(fit_devices, demand),
            state="reserved",
            time_s=self.clock(),
            vendor=demand.vendor,
            model=demand.model,
            acu=acu,
            job=pod.job,
            priority=pod.priority,
            pledge=pledge,
        )

    async def _post_binding(
        self, pod: pods.PodInfo, reservation: Reservation, *, node: str, vendor: str
    ) -> tuple[str, dict[str, str]]:
        """Post the Binding; returns a note ("" when posted) and the annotations."""
        resume = await self._resume_from(pod)
        annotations = device_annotations(
            vendor=vendor,
            slices=reservation.devices,
            resume_from=resume,
            node=self.state.nodes.get(node),
        )
        annotations |= await self._gang_flags(pod)  # one set for every rank of a job
        if self.kube is None:
            _log.info("no_cluster_binding_not_posted", pod=pod.ref.name, node=node)
            return "no cluster: Binding not posted", annotations
        try:
            await self.kube.bind_pod(
                pod.ref.namespace,
                pod.ref.name,
                uid=pod.ref.uid,
                node=node,
                annotations=annotations,
            )
        except Exception as exc:  # every Kube* error, and the unexpected
            _log.warning("binding_failed", pod=pod.ref.name, node=node, error=repr(exc))
            failed = f"hcs: Binding failed for {pod.ref.namespace}/{pod.ref.name} on {node}: {exc}"
            return failed, annotations
        return "", annotations

    async def _gang_flags(self, pod: pods.PodInfo) -> dict[str, str]:
        """The collective flags the pod's pledged gang fixed for all its ranks
        (from the whole job's placement); none for a pod of no gang."""
        if not pod.job or not pod.gang:
            return {}
        key = gang_records.key_for(pod.ref.namespace, pod.job, pod.run)
        try:
            found = await kvcas.read(self.kv, key, decode=gang_records.DECODER.decode)
        except (HcsError, NatsError, msgspec.MsgspecError) as exc:
            _log.warning("gang_flags_unreadable", gang=key, error=repr(exc))
            return {}
        record = found.value
        return dict(record.flags) if record is not None and record.state == "pledged" else {}

    async def _resume_from(self, pod: pods.PodInfo) -> str | None:
        """The checkpoint of the pod's own run (or the run its hcs.io/resume-run
        names): a new run of a job never resumes another run's unless it names it.
        A gang's ranks all resume from one point: the first rank's bind records
        it in the gang's record, every later rank's bind reads it there."""
        if self.ckpt is None or not pod.job:
            return None
        found = await self._checkpoint_of(pod)
        return await self._gang_resume(pod, found)

    async def _gang_resume(self, pod: pods.PodInfo, found: str | None) -> str | None:
        """The resume point the pod's pledged gang recorded (recording ``found``
        when it is the first rank to bind); ``found`` for a pod of no gang."""
        if not pod.job:
            return found

        def decide(
            record: gang_records.GangRecord | None,
        ) -> kvcas.Change[gang_records.GangRecord, str | None]:
            if record is None or record.state != "pledged":
                return kvcas.Keep(found)
            if record.resume_from is not None:
                return kvcas.Keep(record.resume_from or None)
            return kvcas.Put(gang_records.resumed(record, found or ""), found)

        key = gang_records.key_for(pod.ref.namespace, pod.job, pod.run)
        try:
            return await kvcas.update(
                self.kv,
                key,
                decide,
                decode=gang_records.DECODER.decode,
                encode=gang_records.ENCODER.encode,
            )
        except (HcsError, NatsError, msgspec.MsgspecError) as exc:
            _log.warning("gang_resume_unreadable", gang=key, error=repr(exc))
            return found

    async def _checkpoint_of(self, pod: pods.PodInfo) -> str | None:
        if self.ckpt is None or not pod.job:
            return None
        run = pod.resume_run or pod.run
        try:
            entry = await self.ckpt.get(subjects.ckpt_key(pod.ref.namespace, pod.job, run))
        except (KeyNotFoundError, ValueError):
            return None
        except NatsError as exc:  # the bind goes on without a resume point
            _log.warning("checkpoint_unreadable", job=pod.job, error=repr(exc))
            return None
        found = checkpoint.resume_point(  # refused (and logged) across namespaces
            entry.value, key=entry.key, namespace=pod.ref.namespace, job=pod.job, run=run
        )
        return found.uri if found is not None and found.uri else None

    async def _binding_outcome(self, ref: PodRef, *, node: str) -> BindingOutcome:
        """What a Binding whose POST failed did after all, read from the pod: a
        timeout or a 409 does not say whether the pod sits on ``node`` now."""
        if self.kube is None:
            return "elsewhere"
        try:
            pod: dict[str, Any] | None = await self.kube.get_pod(ref.namespace, ref.name)
        except KubeNotFound:
            pod = None
        except HcsError as exc:
            _log.warning("binding_outcome_unknown", pod=ref.name, node=node, error=str(exc))
            return "unknown"
        return ledger.binding_outcome(ref, pod, node=node)

    async def _after_failed_binding(
        self, ref: PodRef, *, node: str, note: str, outcome: BindingOutcome
    ) -> None:
        """Free the devices only when the pod is surely not on ``node``; when
        that cannot be told, the reservation stays ``reserved`` and expiry
        (which reads the pod again) decides."""
        if outcome == "unknown":
            return
        try:
            await self.release(ref, reason=note, state="released", node=node)
        except HcsError as exc:  # left "reserved": expiry takes it back
            _log.error("release_after_failed_binding", pod=ref.name, error=str(exc))

    def _mark_later(self, reservation: Reservation, *, node: str) -> None:
        """The pod is bound: its reservation turns ``bound`` with the node's
        next write (under a burst, the next pod's reserve) or ``MARK_AFTER_S``
        from now; the bind is answered without waiting. Until then it is
        ``reserved``, which is safe: expiry and the reconcile read the pod and
        keep the devices of a pod bound to the node. A reservation gone by
        then (a release, an expiry) is restored only if the pod is still
        bound here (``_keep_if_bound``): it may have been deleted meanwhile."""
        started = time.perf_counter()

        def mark(doc: NodeReservations | None) -> _Change:
            if ledger.holding(doc, reservation.pod) is None:
                return _Change(None, "missing")
            marked = ledger.with_bound(doc, reservation, node=node)
            if marked is None:  # already bound
                return _Change(None, None)
            return _Change(marked, True)

        def written(done: asyncio.Future[Any]) -> None:
            BIND_STEP_SECONDS.record(time.perf_counter() - started, {"step": "mark"})
            if done.cancelled():
                return
            if (exc := done.exception()) is not None:  # expiry reads the pod before it frees
                _log.error("mark_bound_failed", pod=reservation.pod.name, node=node, error=str(exc))
            elif done.result() == "missing":
                self._background(self._keep_if_bound(reservation, node=node))

        self.batches.defer(node, mark, after_s=MARK_AFTER_S).add_done_callback(written)

    async def _keep_if_bound(self, reservation: Reservation, *, node: str) -> None:
        # unreadable: the reconcile rebuilds it from the pod's annotations
        if self.kube is not None and not await self._bound_now(
            reservation, node=node, unreadable="mark_pod_unreadable"
        ):
            return
        try:
            await self.hold_bound(reservation, node=node, reason="bound")
        except HcsError as exc:
            _log.error("mark_bound_failed", pod=reservation.pod.name, node=node, error=str(exc))

    def _background(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def settle(self) -> None:
        """Write the deferred marks now, and finish what they started."""
        await self.batches.settle()
        await asyncio.sleep(0)  # the marks' done callbacks run, and start what they start
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def hold_bound(self, reservation: Reservation, *, node: str, reason: str) -> bool:
        """CAS the pod of ``reservation`` into ``node``'s document as ``bound``:
        a ``reserved`` one is marked, a missing one added (the pod holds those
        devices whatever the ledger says). True when the document changed; an
        over-commit that an addition reveals is logged and counted."""

        def mark(doc: NodeReservations | None) -> _Change:
            marked = ledger.with_bound(doc, reservation, node=node)
            if marked is None:  # already bound
                return _Change(None, None)
            added = ledger.holding(doc, reservation.pod) is None
            return _Change(marked, marked if added else True)

        outcome: NodeReservations | bool | None = await self.batches.submit(node, mark)
        if isinstance(outcome, NodeReservations):  # the pod's reservation was missing
            _log.warning(
                "reservation_restored", node=node, pod=pods_key(reservation.pod), reason=reason
            )
            self.report_overcommit(node, outcome)
        return outcome is not None

    def report_overcommit(self, node: str, doc: NodeReservations) -> list[ledger.Overcommit]:
        """Log and count every over-committed device of ``doc`` (the ledger
        cannot undo one: a pod must go)."""
        view = self.state.nodes.get(node)
        totals = {i: d.fp.vram_usable_mib for i, d in view.devices.items()} if view else {}
        found = ledger.overcommitted(node, ledger.ledger_slices(doc), totals)
        for o in found:
            OVERCOMMITS.add(1, {"node": node})
            _log.error("device_overcommitted", node=node, device=o.index, detail=o.detail())
        return found

    # -- release / expiry -------------------------------------------------
    async def release(
        self, ref: PodRef, *, reason: str, state: AllocState = "released", node: str | None = None
    ) -> AllocationEvent | None:
        """CAS-remove a pod's reservation; None when it holds none."""
        if node is None:
            found = self.state.find_pod(pods_key(ref))
            if found is None:
                return None
            node = found[0]

        def drop(doc: NodeReservations | None) -> _Change:
            held = doc.reservations if doc is not None else ()
            gone = [r for r in held if _same_pod(r.pod, ref)]
            if gone and doc is not None:
                kept = tuple(r for r in held if not _same_pod(r.pod, ref))
                return _Change(NodeReservations(node=node, reservations=kept), gone[-1])
            return _Change(None, None)  # nothing to drop

        dropped: Reservation | None = await self.batches.submit(node, drop)
        await self._unclaim_quietly(dropped.pod if dropped is not None else ref, node=node)
        if dropped is None:
            return None
        return await self.announce(node, dropped, state=state, reason=reason)

    async def expire(self, *, ttl_s: float) -> int:
        """Expire reservations left ``reserved`` longer than ``ttl_s`` whose pod
        is not bound to their node; one whose pod is turns ``bound`` (the
        Binding was posted, the mark was lost: a crash, a lost write)."""
        now = self.clock()
        count = 0
        for name in list(self.state.nodes):
            doc = self.state.reservations_of(name)
            if doc is None:
                continue
            for stuck in expired(doc, now=now, ttl_s=ttl_s):
                if await self._expire_one(stuck, node=name, ttl_s=ttl_s):
                    count += 1
        return count

    async def _bound_now(self, r: Reservation, *, node: str, unreadable: str) -> bool | None:
        """Whether the pod of ``r`` is bound to ``node`` now, read from the API
        server (``ledger.expiry_verdict``); None when the pod cannot be read
        (logged as ``unreadable``): the caller keeps things as they are."""
        assert self.kube is not None
        try:
            pod = await self.kube.get_pod(r.pod.namespace, r.pod.name)
        except KubeNotFound:
            return False
        except HcsError as exc:
            _log.warning(unreadable, node=node, pod=r.pod.name, error=str(exc))
            return None
        return ledger.expiry_verdict(r, pod, node=node) == "bound"

    async def _expire_one(self, stuck: Reservation, *, node: str, ttl_s: float) -> bool:
        bound = (
            await self._bound_now(stuck, node=node, unreadable="expiry_pod_unreadable")
            if self.kube is not None
            else False
        )
        if bound is None:  # cannot tell: keep the devices, ask again next round
            return False
        if bound:
            _log.warning("reserved_pod_found_bound", node=node, pod=pods_key(stuck.pod))
            if await self.hold_bound(stuck, node=node, reason="pod found bound at expiry"):
                await self.announce(node, stuck, state="bound", reason="pod found bound at expiry")
            return False
        _log.warning("reservation_expired", node=node, pod=stuck.pod.name, ttl_s=ttl_s)
        event = await self.release(
            stuck.pod, reason=f"reserved > {ttl_s}s", state="expired", node=node
        )
        return event is not None

    async def _commit(self, node: str, edits: list[_Edit]) -> list[Any]:
        """Apply a batch of edits to ``node``'s document in order and write it
        once (``group_commit``), with compare-and-set (``hcs_bus.kvcas``) on
        the known document (``known``) first: a lost race reads the document
        and applies the whole batch again, and a batch that writes nothing is
        answered on a fresh read."""

        def apply(doc: NodeReservations | None) -> kvcas.Change[NodeReservations, _Applied]:
            results, changed = [], False
            for edit in edits:
                change = edit(doc)
                if change.doc is not None:
                    doc, changed = change.doc, True
                results.append(change.result)
            if changed and doc is not None:
                return kvcas.Put(doc, (results, True))
            return kvcas.Keep((results, False))

        held = self.known(node)
        try:
            results, wrote = await kvcas.update(
                self.kv,
                subjects.alloc_key(node),
                apply,
                decode=_DOC.decode,
                encode=messages.encode,
                known=kvcas.Read(held.doc, held.revision) if held is not None else None,
                seen=lambda found: self._seen(node, found),
                lost=lambda: CONFLICTS.add(1),
                attempts=MAX_ATTEMPTS,
            )
        except HcsError:
            self._docs.pop(node, None)
            raise
        if wrote:
            WRITES.add(1)
        return results

    async def announce(
        self,
        node: str,
        r: Reservation,
        *,
        state: AllocState,
        reason: str,
        annotations: dict[str, str] | None = None,
    ) -> AllocationEvent:
        event = AllocationEvent(
            node=node,
            pod=r.pod,
            state=state,
            time_s=self.clock(),
            devices=r.devices,
            vendor=r.vendor,
            model=r.model,
            acu=r.acu,
            job=r.job,
            priority=r.priority,
            reason=reason,
            annotations=annotations or {},
        )
        msg_id = f"alloc:{node}:{r.pod.namespace}/{r.pod.name}:{r.pod.uid}:{r.time_s}:{state}"
        try:
            await self.bus.publish(subjects.alloc(node), event, msg_id=msg_id)
        except HcsError as exc:
            _log.error("allocation_event_lost", node=node, pod=r.pod.name, error=str(exc))
        return event


def pods_key(ref: PodRef) -> str:
    return f"{ref.namespace}/{ref.name}"
