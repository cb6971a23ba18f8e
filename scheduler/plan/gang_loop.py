"""The gang loop: pledges each waiting gang whole, or holds nothing for it.

While it knows a gang record, every round (``2 * every_s`` after the last,
or ``every_s`` when a view change wakes it) lists the pods of HCS's
scheduler (from the API server's watch cache) and, per gang record
(``scheduler.plan.gang_records``):

* **pinned**, every member there and none held by another controller's gate
  (Kueue's ``kueue.x-k8s.io/admission``, say: planned only once every other
  gate is gone): the gangs are taken in ``admit_order``'s order (priority,
  age, the starvation rule), each planned whole on its pinned class with
  every held pledge and every planned, unbooked rank of other gangs counted.
  One that fits is pledged in ONE compare-and-set of its record (a pledge
  per rank, each naming its member pod and node): of several replicas only
  the writer wins, and only it lifts the gates. One that does not fit holds
  nothing: an Event (reason ``GangWaiting``) on each member says what is
  missing, once per reason;
* **pledged**: each member still behind HCS's gate is patched (gate lifted,
  ``hcs.io/pledge`` its rank's pledge). The patch tests the gate first, so
  it lands once whoever sends it;
* **the shared pool** (given the namespaces' ComputeQuotas): the ready
  gangs are taken in the pool's queue order instead (priority, the
  weighted dominant share of ACU and VRAM the namespace has once the gang
  runs, or has now for a gang waiting past ``starvation_s``, age:
  ``scheduler.quota.gang_pool``), the starvation rule unchanged; a gang
  that would take its namespace above its ceiling, or borrow capacity a
  namespace below its guarantee waits for, waits (the reason says which).
  When a gang waits for room, room is taken back for it
  (``gang_pool.Pool.reclaim``): for a gang of a namespace below its
  guarantee, the newest pledged gangs of namespaces above theirs; else
  elastic ranks above their least size lent back; else a fair reclaim from
  namespaces whose share stays above the waiting gang's (never a
  namespace below its own guarantee; within ``reclaim_acu_per_min``). An
  elastic victim giving ranks has them dropped from its record, any other
  victim's record is deleted, in ONE compare-and-set (of several replicas
  only the writer acts; the room is no longer held for it), then its
  members are evicted (the checkpoint sidecar's periodic checkpoints are
  what they resume from) and both sides get an Event (``Reclaimed`` on the
  victim's members, ``ReclaimedFor`` on the waiting gang's; the message
  names the kind: reclaimed for a guarantee, lent back or fair reclaim)
  and one alert goes on the bus (``UsageAlert`` kind ``reclaim`` on
  ``hcs.usage.<victim's namespace>``, core NATS: lost when no one
  listens). Members still on their nodes whose gang holds no pledge are
  leaving: their devices count as being freed, so one shortfall is
  reclaimed once. Members the victim's controller makes again are admitted
  behind the gate and wait like any gang;
* pledged, and a member behind HCS's gate came after the pledge (the gang's
  members were replaced: the healer restarted it): back to pinned, its
  pledges dropped, so it is pledged again whole (``records.restarted``);
* its members all gone or finished (a pinned record ``grace_s`` after it was
  made, so a gang whose pods are still being created keeps it): deleted.
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from nats.js.kv import KeyValue

from hcs_bus import kvcas, messages, plannotes, subjects, vocabulary
from hcs_bus.errors import HcsError, KubeConflict, KubeInvalid, KubeNotFound
from hcs_bus.messages import Policy, UsageAlert
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger, meter, zero_init
from scheduler.ledger import audit_rules as ledger_rules
from scheduler.ledger.pledge_rules import Held
from scheduler.plan import gang_records as records
from scheduler.plan import gang_rules as ganging
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.gang_service import GangPins, Quotas
from scheduler.plan.rules import summarise
from scheduler.plan.service import Planner
from scheduler.quota import gang_pool
from scheduler.quota import share_rules as sharing
from scheduler.view.state import ClusterState

_log = logger("hcs.scheduler.gangs")
REPORTER = "hcs-scheduler"
GANGS = zero_init(
    meter("hcs.scheduler").create_counter(
        "hcs_scheduler_gangs", description="gang decisions of the gang loop, by outcome"
    ),
    {"outcome": "pledged"},
    {"outcome": "waiting"},
    {"outcome": "lost_race"},
    {"outcome": "released"},
    {"outcome": "restarted"},
    {"outcome": "reclaimed"},
    {"outcome": "grown"},
    {"outcome": "shrunk"},
)


class Kube(Protocol):
    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        cached: bool = False,
    ) -> list[dict[str, Any]]: ...

    async def patch_pod(
        self, namespace: str, name: str, ops: list[dict[str, Any]]
    ) -> dict[str, Any]: ...

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]: ...

    async def evict_pod(
        self, namespace: str, name: str, *, dry_run: bool = False, uid: str | None = None
    ) -> dict[str, Any]: ...


@dataclass(frozen=True, slots=True)
class _Ready:
    record: GangRecord
    revision: int
    gang: ganging.Gang


class GangLoop:
    def __init__(
        self,
        *,
        kube: Kube,
        kv: KeyValue,
        state: ClusterState,
        known: records.Records,
        held: Callable[[], Mapping[str, Held]],
        reserved: Callable[[], frozenset[str]],
        profiles: ProfileDB,
        scheduler_name: str,
        every_s: float = 1.0,
        starvation_s: float = gang_pool.STARVATION_S,
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
        reclaim_acu_per_min: float = float("inf"),
        publish: Callable[[str, bytes], Awaitable[None]] | None = None,
        checkpoint: Callable[[str, str, str], Awaitable[bool]] | None = None,
        reclaim_share_per_min: float = 1.0,
    ) -> None:
        self.kube, self.kv, self.state, self.known = kube, kv, state, known
        self.held, self.reserved, self.profiles = held, reserved, profiles
        self.selector = f"spec.schedulerName={scheduler_name}"
        self.every_s, self.starvation_s, self.grace_s = every_s, starvation_s, grace_s
        self.clock, self.quotas, self.reclaim_acu_per_min = clock, quotas, reclaim_acu_per_min
        self._reclaimed: list[tuple[float, float]] = []  # (time, ACU) of this replica's reclaims
        self.publish = publish
        # asks a job (namespace, job, reason) to checkpoint before a reclaim
        # evicts it; True when a newer checkpoint came in time
        self.checkpoint = checkpoint
        self.reclaim_share_per_min = reclaim_share_per_min  # of the pool's ACU
        self._evicting: set[asyncio.Task[None]] = set()
        self._hungry = False  # a ready gang waits for room: no elastic gang grows
        self._leaving: dict[str, int] = {}  # class -> devices of members leaving (this round)
        self._deferred = ""  # the last reclaim refused, logged once
        self._wake = asyncio.Event()
        self._told: dict[str, str] = {}  # gang key -> the reason its members were told

    def wake(self, _node: str = "") -> None:
        """A view change or a new member: look again (at most every ``every_s``)."""
        self._wake.set()

    async def run(self, *, ready: asyncio.Event) -> None:
        await ready.wait()
        while True:
            try:
                await self.once()
            except HcsError as exc:
                _log.warning("gang_round_failed", error=str(exc))
            await asyncio.sleep(self.every_s)
            try:
                async with asyncio.timeout(self.every_s):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()

    async def once(self) -> int:
        """One round; how many gangs were pledged by this replica."""
        if not self.known.all():
            return 0  # no gang: nothing to list
        pods = await self.kube.list_pods(field_selector=self.selector, cached=True)
        members: dict[str, list[dict[str, Any]]] = {}
        on_nodes: list[tuple[str, dict[str, Any]]] = []  # gang members on a node
        for pod in pods:
            key = records.gang_key_of(pod)
            if key and not _finished(pod):
                members.setdefault(key, []).append(pod)
            if key and (pod.get("spec") or {}).get("nodeName") and not _ended(pod):
                on_nodes.append((key, pod))
        self._leaving = self._unpledged(on_nodes)
        ready: list[_Ready] = []
        growing: list[tuple[GangRecord, int, list[dict[str, Any]]]] = []
        for record, revision in self.known.all():
            live = members.get(record.key, [])
            if not live:
                await self._release(record, revision)
            elif records.restarted(record, live):
                await self._reset(record, revision)
            elif record.state == "pledged":
                gone = records.lost(record, live) if record.elastic else ()
                if gone:
                    await self._drop(record, revision, gone)
                    continue
                await self._ungate(record, live)
                more = records.extras(record, live)
                if more and len(record.ranks) < record.size:
                    growing.append((record, revision, more))
            else:
                found = await self._ready(record, revision, live)
                if found is not None:
                    ready.append(found)
        self._hungry = False
        won = await self._admit(ready, members) if ready else 0
        if not self._hungry:
            await self._grow(growing, most=True)
        else:  # room goes to waiting gangs first; a gang below its least size is restored
            await self._grow([g for g in growing if len(g[0].ranks) < g[0].least], most=False)
        return won

    # -- waiting gangs ----------------------------------------------------
    async def _ready(
        self, record: GangRecord, revision: int, live: list[dict[str, Any]]
    ) -> _Ready | None:
        """The gang, planned on its pinned class, when every member is there
        and none waits on another controller's gate; else None (told why)."""
        gated = [p for p in live if records.GATE in records.gates_of(p)]
        foreign = sorted({g for p in gated for g in records.gates_of(p) if g != records.GATE})
        if foreign:
            await self._note(record, live, f"waits for the gates {', '.join(foreign)} to go")
            return None
        if len(gated) < record.fewest or record.requests is None:
            await self._note(record, live, f"{len(gated)} of its {record.fewest} members exist")
            return None
        chosen = sorted(gated, key=records.rank_order)[: record.fewest]
        pinned = _pinned(record)
        gang = ganging.Gang(
            name=record.key,
            members=tuple(
                ganging.Member(name=_name(p), requests=record.requests, policy=pinned)
                for p in chosen
            ),
            priority=max(int((p.get("spec") or {}).get("priority") or 0) for p in chosen),
            since_s=record.time_s,
        )
        return _Ready(record, revision, gang)

    async def _admit(self, ready: list[_Ready], members: dict[str, list[dict[str, Any]]]) -> int:
        reserved = self.reserved()
        placed = records.outstanding_ranks((r for r, _ in self.known.all()), reserved=reserved)
        state = records.with_placed(self.state, placed)
        held = records.without(self.held(), placed)
        by_key = {r.gang.name: r for r in ready}
        pool = await self._pool(ready)
        jobs = {
            r.gang.name: gang_pool.waiting_job(r.record, priority=r.gang.priority) for r in ready
        }
        now = self.clock()
        rank = (
            pool.rank(list(jobs.values()), now=now, starvation_s=self.starvation_s)
            if pool is not None
            else None
        )
        hungry = frozenset(r.record.namespace for r in ready)
        shut: dict[str, str] = {}  # gang -> why the pool keeps it waiting
        while True:
            admission = ganging.admit_order(
                (r.gang for r in ready if r.gang.name not in shut),
                state=state,
                now=now,
                starvation_s=self.starvation_s,
                held=held,
                profiles=self.profiles,
                rank=rank,
            )
            over = _over_share(pool, admission.start, jobs=jobs, hungry=hungry)
            if over is None:
                break
            shut[over[0]] = over[1]
        won = 0
        for plan in admission.start:
            if await self._pledge(by_key[plan.gang], plan, members.get(plan.gang, [])):
                won += 1
        why = {p.gang: p.reason for p in (*admission.waiting, *admission.refused)} | shut
        self._hungry = bool(admission.waiting) or bool(shut)
        for key, reason in why.items():
            GANGS.add(1, {"outcome": "waiting"})
            await self._note(by_key[key].record, members.get(key, []), reason)
        if pool is not None and rank is not None:
            room = [p.gang for p in admission.waiting if p.gang not in shut]
            short = sorted((jobs[k] for k in room), key=lambda j: rank[j.key])
            started = [_on_class(jobs[p.gang]) for p in admission.start]
            await self._reclaim(
                pool,
                short,
                state=state,
                members=members,
                started=started,
                hungry=hungry,
                claim=admission.claim,
            )
        return won

    # -- the shared pool --------------------------------------------------
    async def _pool(self, ready: list[_Ready]) -> gang_pool.Pool | None:
        """The pool's figures, when there are quotas to read."""
        if self.quotas is None:
            return None
        known = [r for r, _ in self.known.all()]
        names = sorted({r.namespace for r in known} | {r.record.namespace for r in ready})
        limits = {ns: await self.quotas.limits(ns) for ns in names}
        return gang_pool.Pool.of(
            classes=summarise(self.state.schedulable()).classes.values(),
            limits=limits,
            pledged=known,
        )

    async def _reclaim(
        self,
        pool: gang_pool.Pool,
        waiting: list[sharing.Job],
        *,
        state: ClusterState,
        members: dict[str, list[dict[str, Any]]],
        started: list[sharing.Job],
        hungry: frozenset[str],
        claim: ganging.Claim | None,
    ) -> None:
        """Take back room for a waiting gang: borrowed room for the first
        owed its guarantee, else elastic ranks lent back, else a fair
        reclaim (``gang_pool.Pool.reclaim``)."""
        if not waiting:
            return
        now = self.clock()
        self._reclaimed = [(t, a) for t, a in self._reclaimed if now - t < 60.0]
        free = {k: c.idle_devices for k, c in summarise(state.schedulable()).classes.items()}
        found = pool.reclaim(
            waiting,
            free=free,
            freeing=self._leaving,
            budget_acu=min(self.reclaim_acu_per_min, self.reclaim_share_per_min * pool.total.acu)
            - sharing.spent_last_minute(self._reclaimed, now=now),
            started=started,
            hungry=hungry,
            head=claim.gang if claim is not None else "",
            kept={k: claim.devices for k in claim.classes} if claim is not None else None,
        )
        if found is None:
            return
        job, reclaim = found.job, found.reclaim
        if not reclaim.ok:
            if self._deferred != reclaim.reason:
                self._deferred = reclaim.reason
                _log.info("gang_reclaim_refused", gang=job.key, reason=reclaim.reason)
            return
        for victim in reclaim.victims:
            await self._take(victim, taking=found, members=members)

    def known_record(self, key: str) -> GangRecord:
        found = self.known.get(key)
        assert found is not None
        return found[0]

    def _unpledged(self, on_nodes: list[tuple[str, dict[str, Any]]]) -> dict[str, int]:
        """Devices per class (their plan notes) of gang members on nodes whose
        gang holds no pledge (taken back, leaving): reclaimed already."""
        out: dict[str, int] = {}
        for key, pod in on_nodes:
            found = self.known.get(key)
            if found is not None and found[0].state == "pledged":
                if found[0].rank_of(_name(pod)) is not None:
                    continue  # a rank it holds (a shrunk elastic gang's dropped ones leave)
            notes = (pod.get("metadata") or {}).get("annotations") or {}
            try:
                note = plannotes.decode(str(notes.get(vocabulary.PLAN) or ""))
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # no plan: nothing HCS counts for it
            out[note.key] = out.get(note.key, 0) + note.devices
        return out

    async def _take(
        self,
        victim: sharing.Taken,
        *,
        taking: gang_pool.Taking,
        members: dict[str, list[dict[str, Any]]],
    ) -> None:
        """One victim: its record deleted (an elastic gang giving up only some
        ranks: those ranks dropped from it) in one compare-and-set (the writer
        alone goes on); its members (ranks) asked to checkpoint, evicted, and
        both sides told (of the reclaim's kind)."""
        job, reclaim = taking.job, taking.reclaim
        found = self.known.get(victim.key)
        if found is None:
            return
        record, revision = found
        if record.state != "pledged":
            return
        live = members.get(record.key, [])
        if not victim.whole and record.elastic and victim.ranks < len(record.ranks):
            smaller, dropped = records.shrunk(record, ranks=victim.ranks, live=live)
            if not dropped or not await self._replace_unchanged(record, revision, smaller):
                return
            names = {r.pod for r in dropped}
            victims = [p for p in live if _name(p) in names]
            what = f"its ranks {', '.join(sorted(names))} (it runs on with {len(smaller.ranks)})"
            GANGS.add(1, {"outcome": "shrunk"})
        else:
            if not await self._delete_unchanged(record, revision):
                return
            victims, what = live, "evicted"
            GANGS.add(1, {"outcome": "reclaimed"})
        self._reclaimed.append((self.clock(), victim.amount.acu))
        waiting = self.known_record(job.key)
        _log.warning(
            "gang_reclaimed",
            gang=record.key,
            namespace=record.namespace,
            acu=victim.amount.acu,
            vram_mib=victim.amount.vram_mib,
            cls=reclaim.cls,
            ranks=victim.ranks,
            whole=victim.whole,
            reclaimed_for=job.key,
            kind=taking.kind,
        )
        took = f"{victim.amount.acu:g} ACU/{victim.amount.vram_mib // 1024} GiB of {reclaim.cls}"
        gone = f"{record.namespace}/{record.job}"
        to = f"{waiting.namespace}/{waiting.job}"
        await self._tell(
            members.get(job.key, []),
            reason="ReclaimedFor",
            message=f"hcs: {took} taken back from gang {gone} for this gang, "
            f"{taking.kind} ({reclaim.reason})",
        )
        await self._alert(
            UsageAlert(
                namespace=record.namespace,
                resource="acu",
                share=0.0,
                threshold=0.0,
                time_s=self.clock(),
                held_devices=victim.ranks * gang_pool.devices_per_rank(record),
                held_vram_mib=victim.amount.vram_mib,
                held_acu=victim.amount.acu,
                message=f"gang {gone} taken back ({took}) for gang {to}, {taking.kind}: "
                f"{reclaim.reason}",
                kind="reclaim",
                gang=gone,
                reclaimed_for=to,
            )
        )
        message = f"hcs: gang {gone}: {took} taken back for gang {to}, {_why(taking)}: {what}"
        if self.checkpoint is None or not any(map(_checkpointed, victims)):
            await self._leave(victims, record=record, message=message, saved=None)
            return
        task = asyncio.create_task(self._saved_then_leave(victims, record=record, message=message))
        self._evicting.add(task)
        task.add_done_callback(self._evicting.discard)

    async def _saved_then_leave(
        self, victims: list[dict[str, Any]], *, record: GangRecord, message: str
    ) -> None:
        """Ask the job to checkpoint (within the asker's wait), then evict."""
        assert self.checkpoint is not None
        saved = False
        try:
            saved = await self.checkpoint(
                record.namespace, record.job, f"capacity reclaimed by the shared pool ({message})"
            )
        except Exception as exc:  # the reclaim stands: evicted from its last checkpoint
            _log.warning("gang_reclaim_checkpoint_failed", gang=record.key, error=repr(exc))
        await self._leave(victims, record=record, message=message, saved=saved)

    async def _leave(
        self,
        victims: list[dict[str, Any]],
        *,
        record: GangRecord,
        message: str,
        saved: bool | None,
    ) -> None:
        for pod in victims:
            await self._evict(pod)
        if saved is None:
            then = "it resumes from its last checkpoint"
        elif saved:
            then = "it checkpointed first and resumes from that checkpoint"
        else:
            then = "no checkpoint came in time: it resumes from its last one"
        await self._tell(victims, reason="Reclaimed", message=f"{message}; {then}")

    async def _alert(self, alert: UsageAlert) -> None:
        if self.publish is None:
            return
        try:
            await self.publish(subjects.usage(alert.namespace), messages.encode(alert))
        except Exception as exc:  # nats raises several unrelated types; the reclaim stands
            _log.warning("gang_reclaim_alert_lost", namespace=alert.namespace, error=repr(exc))

    async def _evict(self, pod: Mapping[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "")
        try:
            await self.kube.evict_pod(namespace, _name(pod), uid=str(meta.get("uid") or "") or None)
        except (KubeNotFound, KubeConflict):
            pass  # gone, or replaced by a new incarnation
        except HcsError as exc:
            _log.warning("gang_evict_failed", pod=_name(pod), error=str(exc))

    async def _tell(
        self, pods: list[dict[str, Any]], *, reason: str, message: str, kind: str = "Warning"
    ) -> None:
        for pod in pods:
            meta = pod.get("metadata") or {}
            try:
                event = _event(pod, message=message, now=self.clock(), reason=reason, kind=kind)
                await self.kube.create_event(str(meta.get("namespace") or "default"), event)
            except HcsError as exc:
                _log.info("gang_event_failed", pod=_name(pod), error=str(exc))

    async def _pledge(
        self, ready: _Ready, plan: ganging.GangPlan, live: list[dict[str, Any]]
    ) -> bool:
        """Write the gang's pledges in one compare-and-set; the winner lifts the gates."""
        pods = {m.name: m.name for m in ready.gang.members}
        ids = [secrets.token_hex(8) for _ in plan.ranks]

        def decide(found: GangRecord | None) -> kvcas.Change[GangRecord, GangRecord | None]:
            if found is None or found.state != "pinned" or found.run != ready.record.run:
                return kvcas.Keep(None)
            done = records.pledged(found, plan, pods=pods, ids=ids, now=self.clock())
            return kvcas.Put(done, done)

        written = await kvcas.update(
            self.kv,
            ready.record.key,
            decide,
            decode=records.DECODER.decode,
            encode=records.ENCODER.encode,
            known=kvcas.Read(ready.record, ready.revision),
            seen=lambda read: self._seen(ready.record.key, read),
        )
        if written is None:
            GANGS.add(1, {"outcome": "lost_race"})
            return False
        GANGS.add(1, {"outcome": "pledged"})
        _log.info("gang_pledged", gang=written.key, reason=plan.reason, group=written.group)
        self._told.pop(written.key, None)
        await self._ungate(written, live)
        return True

    def _seen(self, key: str, read: kvcas.Read[GangRecord]) -> None:
        if read.value is not None and read.revision is not None:
            self.known.apply(key, records.ENCODER.encode(read.value), read.revision)

    # -- pledged gangs ----------------------------------------------------
    async def _ungate(self, record: GangRecord, live: list[dict[str, Any]]) -> None:
        for pod in live:
            rank = record.rank_of(_name(pod))
            if rank is None:
                continue
            ops = records.ungate_ops(pod, pledge=rank.pledge.id)
            if not ops:
                continue
            try:
                await self.kube.patch_pod(record.namespace, _name(pod), ops)
            except (KubeInvalid, KubeNotFound):
                pass  # lifted by another replica meanwhile, or gone
            except HcsError as exc:
                _log.warning("gang_ungate_failed", pod=_name(pod), error=str(exc))

    # -- elastic gangs ---------------------------------------------------
    async def _grow(
        self, growing: list[tuple[GangRecord, int, list[dict[str, Any]]]], *, most: bool
    ) -> None:
        """One elastic gang (the oldest that can) grows by as many of its
        waiting members as fit in its network group on its class, within its
        namespace's ceiling: towards its size (``most``: no ready gang waits
        for room), else back to its least size (ranks whose members went)."""
        if not growing:
            return
        reserved = self.reserved()
        placed = records.outstanding_ranks((r for r, _ in self.known.all()), reserved=reserved)
        state = records.with_placed(self.state, placed)
        held = records.without(self.held(), placed)
        pool = await self._pool([])
        for record, revision, more in sorted(growing, key=lambda g: (g[0].time_s, g[0].key)):
            if record.requests is None:
                continue
            top = record.size if most else record.least
            found = self._grow_plan(
                record, more[: top - len(record.ranks)], state=state, held=held, pool=pool
            )
            if found is None:
                continue
            plan, pods = found
            ids = [secrets.token_hex(8) for _ in plan.ranks]
            bigger = records.grown(record, plan, pods=pods, ids=ids, now=self.clock())
            if not await self._replace_unchanged(record, revision, bigger):
                return
            GANGS.add(1, {"outcome": "grown"})
            _log.info(
                "gang_grown",
                gang=record.key,
                ranks=len(bigger.ranks),
                most=record.size,
                added=[r.pod for r in bigger.ranks[len(record.ranks) :]],
            )
            await self._ungate(bigger, more)
            await self._tell(
                more[: len(plan.ranks)],
                reason="GangGrown",
                message=f"hcs: elastic gang {record.namespace}/{record.job} grows to "
                f"{len(bigger.ranks)} of at most {record.size} ranks with idle capacity",
                kind="Normal",
            )
            return

    def _grow_plan(
        self,
        record: GangRecord,
        more: list[dict[str, Any]],
        *,
        state: ClusterState,
        held: Mapping[str, Held],
        pool: gang_pool.Pool | None,
    ) -> tuple[ganging.GangPlan, dict[str, str]] | None:
        """The most of ``more`` that fit in the record's group (and ceiling)."""
        assert record.requests is not None
        within = records.group_state(state, record)
        policy = _pinned(record)
        want = min(len(more), record.size - len(record.ranks))
        for k in range(want, 0, -1):
            if pool is not None:
                ask = dataclasses.replace(
                    gang_pool.waiting_job(record, priority=record.priority), ranks=k
                )
                if pool.refusal(ask, used=pool.used, hungry=frozenset()):
                    continue
            chosen = more[:k]
            gang = ganging.Gang(
                name=record.key,
                members=tuple(
                    ganging.Member(name=_name(p), requests=record.requests, policy=policy)
                    for p in chosen
                ),
            )
            plan = ganging.plan_gang(within, gang, held=held, profiles=self.profiles)
            if plan.ok:
                return plan, {_name(p): _name(p) for p in chosen}
        return None

    async def _drop(self, record: GangRecord, revision: int, gone: tuple[Any, ...]) -> None:
        """An elastic gang whose ranks' members are gone runs on with the rest
        (it holds their room no longer); below its least size it grows back
        first, before any waiting gang is given room."""
        smaller = records.without_lost(record, gone)
        if await self._replace_unchanged(record, revision, smaller):
            GANGS.add(1, {"outcome": "shrunk"})
            _log.info(
                "gang_ranks_gone",
                gang=record.key,
                ranks=len(smaller.ranks),
                gone=[r.pod for r in gone],
            )

    async def _replace_unchanged(
        self, record: GangRecord, revision: int, value: GangRecord
    ) -> bool:
        """Write ``value`` over the gang's record in one compare-and-set if it
        still is ``record``; True for the one replica whose write landed."""

        def decide(found: GangRecord | None) -> kvcas.Change[GangRecord, bool]:
            return kvcas.Put(value, True) if found == record else kvcas.Keep(False)

        done: bool = await kvcas.update(
            self.kv,
            record.key,
            decide,
            decode=records.DECODER.decode,
            encode=records.ENCODER.encode,
            known=kvcas.Read(record, revision),
            seen=lambda read: self._seen(record.key, read),
        )
        return done

    # -- restarted gangs --------------------------------------------------
    async def _reset(self, record: GangRecord, revision: int) -> None:
        """A pledged gang whose members were replaced waits again, whole."""
        if await self._replace_unchanged(record, revision, records.reset(record)):
            GANGS.add(1, {"outcome": "restarted"})
            _log.info("gang_restarted", gang=record.key, vendor=record.vendor, model=record.model)
            self._told.pop(record.key, None)

    # -- ended gangs ------------------------------------------------------
    async def _delete_unchanged(self, record: GangRecord, revision: int) -> bool:
        """Delete the gang's record in one compare-and-set if it still is
        ``record``; True for the one replica whose delete landed."""

        def decide(found: GangRecord | None) -> kvcas.Change[GangRecord, bool]:
            return kvcas.Delete(True) if found == record else kvcas.Keep(False)

        deleted: bool = await kvcas.update(
            self.kv,
            record.key,
            decide,
            decode=records.DECODER.decode,
            encode=records.ENCODER.encode,
            known=kvcas.Read(record, revision),
        )
        return deleted

    async def _release(self, record: GangRecord, revision: int) -> None:
        if record.state == "pinned" and self.clock() - record.time_s < self.grace_s:
            return  # its members may still be coming
        if await self._delete_unchanged(record, revision):
            GANGS.add(1, {"outcome": "released"})
            _log.info("gang_released", gang=record.key, state=record.state)
            self._told.pop(record.key, None)

    # -- telling ----------------------------------------------------------
    async def _note(self, record: GangRecord, live: list[dict[str, Any]], reason: str) -> None:
        """An Event on each member saying why the gang waits (once per reason)."""
        if self._told.get(record.key) == reason:
            return
        self._told[record.key] = reason
        _log.info("gang_waiting", gang=record.key, reason=reason)
        message = f"hcs: gang {record.namespace}/{record.job} holds nothing yet: {reason}"
        for pod in live:
            try:
                event = _event(pod, message=message, now=self.clock())
                await self.kube.create_event(record.namespace, event)
            except HcsError as exc:
                _log.info("gang_event_failed", pod=_name(pod), error=str(exc))


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _finished(pod: Mapping[str, Any]) -> bool:
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return phase in vocabulary.POD_FINISHED or bool(meta.get("deletionTimestamp"))


_ended = ledger_rules.finished


def _over_share(
    pool: gang_pool.Pool | None,
    start: tuple[ganging.GangPlan, ...],
    *,
    jobs: Mapping[str, sharing.Job],
    hungry: frozenset[str],
) -> tuple[str, str] | None:
    """The first gang of ``start`` (in order) the pool refuses, and why."""
    if pool is None:
        return None
    used = dict(pool.used)
    for plan in start:
        job = jobs[plan.gang]
        why = pool.refusal(job, used=used, hungry=hungry)
        if why:
            return plan.gang, why
        used[job.namespace] = used.get(job.namespace, sharing.NONE) + pool.ask(job)
    return None


def _on_class(job: sharing.Job) -> sharing.Job:
    """A waiting gang as it runs once started (on its pinned class)."""
    return dataclasses.replace(job, cls=job.classes[0] if job.classes else "")


def _why(taking: gang_pool.Taking) -> str:
    """Why a victim gives room, by the reclaim's kind."""
    if taking.kind == gang_pool.LENT_BACK:
        return "lent back (elastic ranks above its least size are lent capacity)"
    if taking.kind == gang_pool.FAIR:
        return (
            "fair reclaim (its namespace's weighted dominant share stays above the "
            "waiting gang's once that runs)"
        )
    return (
        "reclaimed for a guarantee (it borrowed beyond its namespace's guarantee; the "
        "waiting gang runs within its own)"
    )


def _checkpointed(pod: Mapping[str, Any]) -> bool:
    """Whether the pod runs the checkpoint sidecar (it names a checkpoint directory)."""
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return bool(notes.get(vocabulary.CHECKPOINT_DIR))


def _pinned(record: GangRecord) -> Policy:
    """Every member's policy held to the gang's pinned class."""
    return msgspec.structs.replace(
        record.policy or Policy(),
        vendors=(record.vendor,),
        models=(record.model,),
        substitution="deny",
        job=None,
    )


def _event(
    pod: Mapping[str, Any],
    *,
    message: str,
    now: float,
    reason: str = "GangWaiting",
    kind: str = "Warning",
) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace") or "default")
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{_name(pod)}.gang-", "namespace": namespace},
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "namespace": namespace,
            "name": _name(pod),
            "uid": str(meta.get("uid") or ""),
        },
        "type": kind,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": REPORTER},
        "reportingComponent": REPORTER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def of_replica(
    *,
    kube: Any,
    kv: KeyValue,
    planner: Planner,
    scheduler_name: str,
    publish: Callable[[str, bytes], Awaitable[None]] | None = None,
    checkpoint: Callable[[str, str, str], Awaitable[bool]] | None = None,
    reclaim_share_per_min: float = 1.0,
) -> GangLoop:
    """The gang loop of one replica: its view, its pledges and gang records
    (``publish``: core NATS, for its reclaim alerts; ``checkpoint``: asks a
    job to checkpoint before a reclaim evicts it)."""
    assert planner.pledger is not None
    return GangLoop(
        kube=kube,
        kv=kv,
        state=planner.state,
        known=planner.pledger.gangs,
        held=planner.held,
        reserved=lambda: planner.summary().pledge_ids,
        profiles=planner.profiles,
        scheduler_name=scheduler_name,
        quotas=planner.quotas,
        publish=publish,
        checkpoint=checkpoint,
        reclaim_share_per_min=reclaim_share_per_min,
    )


def pins_of(*, kv: KeyValue, planner: Planner) -> GangPins:
    """The gang pins of one replica's plan service (``Planner.gangs``)."""
    assert planner.pledger is not None
    return GangPins(
        kv=kv,
        state=planner.state,
        profiles=planner.profiles,
        known=planner.pledger.gangs,
        held=lambda: planner.held(waiting=True),
        plan=planner.plan,
        quotas=planner.quotas,
    )
