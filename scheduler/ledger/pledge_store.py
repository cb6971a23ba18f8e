"""Pledges in KV ``hcs_alloc`` (rules and key layout in ``scheduler.ledger.pledge_rules``):
made when a non-dry-run plan is given, spent at bind (under a quota; without
one the reservation carrying its id retires it), swept when expired or done,
released when the pod is deleted.

A namespace with a ComputeQuota: plan and pledge are one step per namespace.
The namespace's document is read (or taken from the last write), the plan is
computed with every outstanding pledge counted, and the pledge is written
with compare-and-set on the document's revision (``hcs_bus.kvcas``); a lost
race re-plans against the winner's document, and a batch that pledges
nothing is answered on a document just read. One lock per namespace keeps a
replica from racing itself.

A namespace without one: each pledge is created under its own key and
counted here at once (before the create is answered), so the next plan of a
burst already sees it; bind writes nothing to it (the reservation carries
its id, and the sweep deletes it once the view shows that reservation).

Other replicas' pledges (for class room) come from the view's KV watch
(``apply``), and so do this replica's own once written.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
from nats.errors import Error as NatsError
from nats.js.kv import KeyValue

from hcs_bus import kvcas, tasks
from hcs_bus.errors import BusUnavailable, HcsError
from hcs_bus.messages import Plan, PlanRequest, PodRef
from hcs_bus.telemetry import TallyCounter, logger
from scheduler.ledger import pledge_rules as pledges
from scheduler.ledger.group_commit import Batches
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge
from scheduler.plan import gang_records
from scheduler.plan import rules as planning
from scheduler.plan.pods import PlanAnnotation as Sizing

_log = logger("hcs.scheduler.pledging")
PLEDGES = TallyCounter(
    "hcs_scheduler_pledges", description="pledge outcomes", meter_name="hcs.scheduler"
)
MAX_ATTEMPTS = 50  # writes of one key tried before giving up (``hcs_bus.kvcas``)
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(NamespacePledges)
_ONE = msgspec.json.Decoder(Pledge)

PlanFn = Callable[[PlanRequest, planning.Summary], Awaitable[Plan]]


class _Held(msgspec.Struct):
    doc: NamespacePledges | None
    revision: int | None


@dataclass(slots=True)
class _Own:
    """A pledge under its own key, and the key's revision (None: created by
    this replica, the create not answered yet)."""

    pledge: Pledge
    revision: int | None


_Version = tuple[int | None, int]  # (document revision, change count of the own keys)


@dataclass(frozen=True, slots=True)
class _Tally:
    version: _Version
    ids: frozenset[str]
    by_class: dict[str, pledges.Held]
    total: pledges.Held
    count: int


_R = TypeVar("_R")
_Waiting = tuple[PlanRequest, PlanFn, bool]  # a request, its planner, whether quoted
_Result = Plan | BaseException
# a batch planned: (plans, (index, pledge) made, what they hold per class, in all)
_Planned = tuple[list[Plan], list[tuple[int, Pledge]], dict[str, pledges.Held], pledges.Held]


@dataclass(frozen=True, slots=True)
class _Spent:
    """What a spend at bind decided: ``refusal`` ("" when the pod may
    reserve), the pledge id to record, the outcome to count ("" none) and why
    the pod was re-planned ("" when it was not)."""

    refusal: str
    pledge: str
    outcome: str = ""
    why: str = ""


class Pledger:
    """One replica's pledges: the documents and own keys it knows, and the writes."""

    def __init__(
        self,
        *,
        kv: KeyValue,
        summary: Callable[[], planning.Summary],
        clock: Callable[[], float] = time.time,
        ttl_s: float = 300.0,
        grace_s: float = 30.0,
        pods: Callable[[str], Awaitable[list[dict[str, Any]]]] | None = None,
        orphan_after_s: float = 30.0,
    ) -> None:
        self.kv, self.summary, self.clock = kv, summary, clock
        self.ttl_s, self.grace_s = ttl_s, grace_s
        # a namespace's pods (with a cluster): pledges no pod carries are orphans
        self.pods, self.orphan_after_s = pods, orphan_after_s
        self.docs: dict[str, _Held] = {}  # namespaces with a quota
        self.keyed: dict[str, dict[str, _Own]] = {}  # namespaces without: id -> pledge
        self._changes: dict[str, int] = {}  # per namespace: changes of ``keyed``
        self._locks: dict[str, asyncio.Lock] = {}
        self._tallies: dict[str, _Tally] = {}
        # per namespace: requests that arrive during a write are planned together
        self._batches: Batches[str, _Waiting, Plan] = Batches(self._commit)
        self._ids: frozenset[str] = frozenset()  # pledges the last summary saw reserved
        self._listed: dict[str, float] = {}  # per namespace: when its pods were last listed
        self.gangs = gang_records.Records()  # gang records: their rank pledges count too

    # -- documents and own keys --------------------------------------------
    def apply(self, key: str, value: bytes | None, revision: int) -> None:
        """A KV watch entry for a pledge key (None/empty: deleted); other
        non-node keys of the ledger (pod claims, gangs) are not pledges."""
        if gang_records.is_gang_key(key):
            self._apply_gang(key, value, revision)
            return
        if not pledges.is_pledge_key(key):
            return
        ns, pledge_id = pledges.parse_key(key)
        if pledge_id:
            self._apply_own(ns, pledge_id, value, revision)
            return
        held = self.docs.get(ns)
        if held is not None and held.revision is not None and held.revision >= revision:
            return
        if not value:
            self.docs[ns] = _Held(None, revision)
            return
        try:
            self.docs[ns] = _Held(_DECODER.decode(value), revision)
        except msgspec.MsgspecError as exc:
            _log.error("bad_pledge_doc", key=key, rev=revision, error=str(exc))

    def _apply_gang(self, key: str, value: bytes | None, revision: int) -> None:
        """A gang record's entry: a pledged gang's rank pledges count as the namespace's."""
        try:
            changed = self.gangs.apply(key, value, revision)
        except msgspec.MsgspecError as exc:
            _log.error("bad_gang_record", key=key, rev=revision, error=str(exc))
            return
        if changed:
            self._changed(gang_records.namespace_of(key))

    def _apply_own(self, ns: str, pledge_id: str, value: bytes | None, revision: int) -> None:
        pledge = None
        if value:
            try:
                pledge = _ONE.decode(value)
            except msgspec.MsgspecError as exc:
                key = pledges.key_for(ns, pledge_id)
                _log.error("bad_pledge", key=key, rev=revision, error=str(exc))
                return
        self._remember_own(ns, pledge_id, pledge, revision)

    def _remember_own(self, ns: str, pledge_id: str, pledge: Pledge | None, revision: int) -> None:
        """One pledge's key at ``revision`` (None: deleted), unless a later one is known."""
        mine = self.keyed.setdefault(ns, {})
        known = mine.get(pledge_id)
        if known is not None and known.revision is not None and known.revision >= revision:
            return
        if pledge is None:
            if known is not None:
                del mine[pledge_id]
                self._dropped(ns, pledge_id)
            return
        if known is not None and known.pledge == pledge:
            known.revision = revision  # our own create, seen back: nothing to count anew
            return
        mine[pledge_id] = _Own(pledge, revision)
        self._changed(ns)

    def _changed(self, ns: str) -> None:
        self._changes[ns] = self._changes.get(ns, 0) + 1

    def _dropped(self, ns: str, pledge_id: str) -> None:
        """A pledge's own key is gone. The sweep drops those whose reservation
        the view shows, hundreds a round under a burst: the tally, which never
        counted a reserved pledge, stays as it is for them."""
        cached = self._tallies.get(ns)
        if cached is not None and cached.version == self._version(ns) and pledge_id in cached.ids:
            return
        self._changed(ns)

    def _version(self, ns: str) -> _Version:
        held = self.docs.get(ns)
        return (held.revision if held is not None else None), self._changes.get(ns, 0)

    def _all(self, ns: str) -> NamespacePledges | None:
        """Everything known of the namespace: its document and its own keys."""
        held, mine = self.docs.get(ns), self.keyed.get(ns)
        ganged = self.gangs.pledges(ns)
        if not mine and not ganged:
            return held.doc if held is not None else None
        before = held.doc.pledges if held is not None and held.doc is not None else ()
        kept = (o.pledge for o in (mine or {}).values())
        return NamespacePledges(namespace=ns, pledges=(*before, *kept, *ganged))

    def known(self) -> dict[str, NamespacePledges]:
        """Every namespace's pledges this replica knows: its document and its
        own keys (the ranks of pledged gangs aside), as KV holds them."""
        out = {}
        for ns in sorted(self.docs.keys() | self.keyed.keys()):
            held, mine = self.docs.get(ns), self.keyed.get(ns) or {}
            doc = held.doc if held is not None else None
            if doc is not None or mine:
                before = doc.pledges if doc is not None else ()
                kept = tuple(o.pledge for o in mine.values())
                out[ns] = NamespacePledges(namespace=ns, pledges=(*before, *kept))
        return out

    async def read(self, namespace: str) -> _Held:
        """The namespace's document as KV holds it now (kept in ``docs``)."""
        found = await kvcas.read(self.kv, pledges.key_for(namespace), decode=_DECODER.decode)
        self._seen(namespace, found)
        return _Held(found.value, found.revision)

    async def _update(
        self,
        namespace: str,
        decide: kvcas.Decide[NamespacePledges, _R],
        *,
        known: _Held | None = None,
    ) -> _R:
        """Compare-and-set the namespace's document (``hcs_bus.kvcas``), every
        version read or written kept in ``docs`` before ``decide`` sees it."""
        return await kvcas.update(
            self.kv,
            pledges.key_for(namespace),
            decide,
            decode=_DECODER.decode,
            encode=_ENCODER.encode,
            known=kvcas.Read(known.doc, known.revision) if known is not None else None,
            seen=lambda found: self._seen(namespace, found),
            attempts=MAX_ATTEMPTS,
        )

    def _seen(self, namespace: str, found: kvcas.Read[NamespacePledges]) -> None:
        if found.revision is not None:
            self._remember(namespace, _Held(found.value, found.revision))

    def _remember(self, namespace: str, held: _Held) -> None:
        now = self.docs.get(namespace)
        if now is None or now.revision is None or (held.revision or 0) >= now.revision:
            self.docs[namespace] = held

    async def _write_own(self, ns: str, pledge: Pledge) -> int:
        """Create one pledge's key (its id is fresh: a conflict is ``CasConflict``)."""
        key = pledges.key_for(ns, pledge.id)
        written = await kvcas.write(self.kv, key, _ENCODER.encode(pledge), revision=None)
        assert written is not None  # a put answers its revision
        return written

    async def _delete_own(self, ns: str, pledge_id: str, *, revision: int | None) -> bool:
        """Delete one pledge's key (at ``revision`` when given); False when it
        changed meanwhile (spent, say): it is left for the next look."""
        key = pledges.key_for(ns, pledge_id)
        try:
            await self.kv.delete(key, last=revision)
        except NatsError as exc:
            if kvcas.lost_race(exc):
                return False
            raise BusUnavailable(f"hcs: cannot delete {key}: {exc!r}") from exc
        mine = self.keyed.get(ns, {})
        if mine.pop(pledge_id, None) is not None:
            self._dropped(ns, pledge_id)
        return True

    def lock(self, namespace: str) -> asyncio.Lock:
        found = self._locks.get(namespace)
        if found is None:
            found = self._locks[namespace] = asyncio.Lock()
        return found

    # -- counting ---------------------------------------------------------
    def _tally(self, ns: str, ids: frozenset[str]) -> _Tally:
        """What the namespace's outstanding pledges hold (cached per version)."""
        version = self._version(ns)
        cached = self._tallies.get(ns)
        if cached is not None and cached.version == version and cached.ids is ids:
            return cached
        by_class, total, count = pledges.tallied(pledges.outstanding(self._all(ns), reserved=ids))
        tally = _Tally(version, ids, by_class, total, count)
        self._tallies[ns] = tally
        return tally

    def _tally_more(
        self,
        ns: str,
        *,
        was: _Version,
        by_class: dict[str, pledges.Held],
        total: pledges.Held,
        count: int,
    ) -> None:
        """After our own write at version ``was``: the tally grows by what was
        added, without counting the namespace again (O(added), not O(held))."""
        cached = self._tallies.get(ns)
        if cached is None or cached.version != was:
            return
        merged = dict(cached.by_class)
        for key, value in by_class.items():
            merged[key] = merged[key].add(value) if key in merged else value
        self._tallies[ns] = _Tally(
            self._version(ns), cached.ids, merged, cached.total.add(total), cached.count + count
        )

    def _namespaces(self) -> list[str]:
        return list(self.docs.keys() | self.keyed.keys() | self.gangs.namespaces())

    def charged(self, summary: planning.Summary) -> planning.Summary:
        """The view's summary with every known outstanding pledge counted."""
        self._ids = summary.pledge_ids
        by_class: dict[str, pledges.Held] = {}
        by_ns: dict[str, pledges.Held] = {}
        for ns in self._namespaces():
            tally = self._tally(ns, summary.pledge_ids)
            if not tally.count:
                continue
            by_ns[ns] = tally.total
            for key, value in tally.by_class.items():
                by_class[key] = by_class[key].add(value) if key in by_class else value
        if not by_ns:
            return summary
        return planning.charged(summary, by_class=by_class, by_namespace=by_ns)

    def by_namespace(self, *, fresh: bool = False) -> dict[str, tuple[pledges.Held, int]]:
        """Per namespace: what its outstanding pledges hold, and how many,
        against the reservations of the view's summary (``fresh``, in the
        event loop) or of the last one seen (from a metrics callback)."""
        ids = self._ids = self.summary().pledge_ids if fresh else self._ids
        out: dict[str, tuple[pledges.Held, int]] = {}
        for ns in self._namespaces():
            tally = self._tally(ns, ids)
            if tally.count:
                out[ns] = (tally.total, tally.count)
        return out

    # -- make -------------------------------------------------------------
    async def place(self, request: PlanRequest, plan: PlanFn, *, quoted: bool = True) -> Plan:
        """Plan ``request`` with the pledges counted and, when it is a plan,
        record its pledge; the Plan carries the pledge id. ``quoted``: the
        namespace has a quota (its pledges go into its document). Requests of
        one namespace that arrive while a write is on its way are planned one
        after the other against the pledges before them and written together."""
        return await self._batches.submit(request.namespace, (request, plan, quoted))

    async def _commit(self, ns: str, batch: list[_Waiting]) -> list[_Result]:
        if any(quoted for _r, _p, quoted in batch):
            return list(await self._plan_batch(ns, batch))
        return await self._plan_own(ns, batch)

    async def _plan_all(self, ns: str, batch: list[_Waiting], base: planning.Summary) -> _Planned:
        """Plan the batch in order, each against the pledges before it:
        (plans, (index, pledge) made, what they hold per class, in all)."""
        made: list[tuple[int, Pledge]] = []
        by_class: dict[str, pledges.Held] = {}
        total = pledges.Held()
        out: list[Plan] = []
        for index, (request, plan, _quoted) in enumerate(batch):
            summary = base
            if made:
                summary = planning.charged(base, by_class=by_class, by_namespace={ns: total})
            found = await plan(request, summary)
            if not found.ok or found.devices < 1:
                out.append(found)
                continue
            pledge = self._pledge(request, found)
            made.append((index, pledge))
            by_class[pledge.key] = by_class.get(pledge.key, pledges.Held()).plus(pledge)
            total = total.plus(pledge)
            out.append(msgspec.structs.replace(found, pledge=pledge.id))
        return out, made, by_class, total

    async def _plan_batch(self, ns: str, batch: list[_Waiting]) -> list[Plan]:
        """A namespace with a quota: the batch's pledges join its document,
        planned against the document known (the last one read or written, or
        the watch's); a lost race re-plans against the winner's, and a batch
        that pledges nothing is answered on a document just read."""
        was: _Version = self._version(ns)

        async def plan_all(
            doc: NamespacePledges | None,
        ) -> kvcas.Change[NamespacePledges, _Planned]:
            nonlocal was
            planned = await self._plan_all(ns, batch, self.charged(self.summary()))
            made = planned[1]
            if not made:
                return kvcas.Keep(planned)
            was = self._version(ns)  # the version the tally was counted at
            before = doc.pledges if doc is not None else ()
            added = NamespacePledges(namespace=ns, pledges=(*before, *(p for _i, p in made)))
            return kvcas.Put(added, planned)

        out, made, by_class, total = await self._update(ns, plan_all, known=self.docs.get(ns))
        _count_refused(len(out) - len(made))
        if made:
            self._tally_more(ns, was=was, by_class=by_class, total=total, count=len(made))
            PLEDGES.add(len(made), {"outcome": "made"})
        return out

    async def _plan_own(self, ns: str, batch: list[_Waiting]) -> list[_Result]:
        """A namespace without a quota: each pledge is created under its own
        key, and counted here before the creates are answered."""
        out, made, by_class, total = await self._plan_all(ns, batch, self.charged(self.summary()))
        _count_refused(len(out) - len(made))
        if not made:
            return list(out)
        mine = self.keyed.setdefault(ns, {})
        was = self._version(ns)
        for _index, pledge in made:
            mine[pledge.id] = _Own(pledge, None)
        self._changed(ns)
        self._tally_more(ns, was=was, by_class=by_class, total=total, count=len(made))
        written = await asyncio.gather(
            *(self._write_own(ns, pledge) for _i, pledge in made),
            return_exceptions=True,
        )
        results: list[_Result] = list(out)
        for (index, pledge), rev in zip(made, written, strict=True):
            own = mine.get(pledge.id)
            if isinstance(rev, BaseException):
                if own is not None and own.revision is None:
                    del mine[pledge.id]
                    self._changed(ns)
                results[index] = rev
            elif own is not None and (own.revision is None or own.revision < rev):
                own.revision = rev
        PLEDGES.add(
            sum(1 for r in written if not isinstance(r, BaseException)), {"outcome": "made"}
        )
        return results

    def _pledge(self, request: PlanRequest, plan: Plan) -> Pledge:
        return Pledge(
            id=secrets.token_hex(8),
            vendor=plan.vendor,
            model=plan.model,
            devices=plan.devices,
            vram_mib_per_device=plan.vram_mib_per_device,
            whole_device=plan.whole_device,
            acu_per_device=plan.acu_per_device,
            time_s=self.clock(),
            name="" if request.generate_name else request.pod_name,
            generate_name=request.generate_name,
            admission=request.admission_uid,
        )

    # -- spend at bind ----------------------------------------------------
    async def spend(
        self, ref: PodRef, pledge_id: str, *, sizing: Sizing, quota: planning.QuotaLimits | None
    ) -> tuple[str, str]:
        """Turn the pod's pledge into the right to reserve: ("", id) when it may
        (the id to record on its reservation), or (why not, "").

        Without a quota nothing is written: capacity is bind's compare-and-set,
        and the reservation that carries the id retires the pledge. Under one,
        a pledge another pod spent, made for another pod, expired or never
        made: the pod is re-planned here, in its planned class, against the
        quota with every pledge counted (a fresh pledge, spent at once)."""
        ns = ref.namespace
        if quota is None:  # nothing to hold a copied note to: the reservation
            return "", pledge_id  # carries the id, which retires the pledge
        if self._gang_rank(ref, pledge_id):  # held by its gang's record, counted
            return "", pledge_id  # there until the reservation carrying it retires it
        refused: pledges.Spend | None = None
        if pledge_id:
            own = await self._spend_own(ref, pledge_id)
            if isinstance(own, str):
                return "", own
            refused = own

        def spend(doc: NamespacePledges | None) -> kvcas.Change[NamespacePledges, _Spent]:
            verdict = refused or pledges.spend_verdict(doc, pledge_id, ref=ref)
            if verdict.outcome == "again":
                return kvcas.Keep(_Spent("", pledge_id))
            if verdict.outcome == "spend" and doc is not None:
                spent = pledges.spent(doc, pledge_id, ref=ref, now=self.clock())
                return kvcas.Put(spent, _Spent("", pledge_id, "spent"))
            why = _why(verdict, pledge_id)
            refusal = self._over_quota(ns, sizing=sizing, quota=quota)
            if refusal:
                said = f"hcs: {ns}/{ref.name}: {why}; re-planned: {refusal}"
                return kvcas.Keep(_Spent(said, "", "bind_refused", why))
            fresh = self._fresh(ref, sizing)
            added = pledges.with_pledge(doc, fresh, namespace=ns)
            return kvcas.Put(added, _Spent("", fresh.id, "spent", why))

        async with self.lock(ns):
            done = await self._update(ns, spend)
        if done.why and pledge_id:
            _log.warning("pledge_replanned", pod=f"{ns}/{ref.name}", why=done.why)
        if done.outcome:
            PLEDGES.add(1, {"outcome": done.outcome})
        return done.refusal, done.pledge

    def _gang_rank(self, ref: PodRef, pledge_id: str) -> bool:
        """Whether ``pledge_id`` is the rank pledge a pledged gang's record made
        for this pod (the gang loop pledged it under the quota already)."""
        if not pledge_id:
            return False
        found = next((p for p in self.gangs.pledges(ref.namespace) if p.id == pledge_id), None)
        return found is not None and pledges.verdict(found, ref=ref).outcome in ("spend", "again")

    async def _spend_own(self, ref: PodRef, pledge_id: str) -> str | pledges.Spend | None:
        """Spend a pledge kept under its own key: its id when spent (or
        already spent by this pod), the refusing verdict (another pod's), or
        None when there is no such key (the namespace's document may hold it)."""
        ns = ref.namespace
        own = self.keyed.get(ns, {}).get(pledge_id)

        def spend(
            found: Pledge | None,
        ) -> kvcas.Change[Pledge, tuple[str | pledges.Spend | None, bool]]:
            if found is None:
                return kvcas.Keep((None, False))
            verdict = pledges.verdict(found, ref=ref)
            if verdict.outcome == "again":
                return kvcas.Keep((pledge_id, False))
            if verdict.outcome != "spend":
                return kvcas.Keep((verdict, False))
            return kvcas.Put(pledges.spent_by(found, ref=ref, now=self.clock()), (pledge_id, True))

        def seen(found: kvcas.Read[Pledge]) -> None:
            if found.value is not None and found.revision is not None:
                self._remember_own(ns, pledge_id, found.value, found.revision)

        answer, spent = await kvcas.update(
            self.kv,
            pledges.key_for(ns, pledge_id),
            spend,
            decode=_ONE.decode,
            encode=_ENCODER.encode,
            known=kvcas.Read(own.pledge, own.revision) if own is not None else None,
            seen=seen,
            attempts=MAX_ATTEMPTS,
        )
        if spent:
            PLEDGES.add(1, {"outcome": "spent"})
        return answer

    def _over_quota(self, namespace: str, *, sizing: Sizing, quota: planning.QuotaLimits) -> str:
        size = planning.Sizing(
            sizing.devices,
            sizing.vram_mib_per_device,
            sizing.whole_device,
            sizing.acu_per_device,
            0.0,
            "",
        )
        summary = self.charged(self.summary())
        verdict = planning.check_quota(namespace, sizing=size, summary=summary, quota=quota)
        return verdict.reason

    def _fresh(self, ref: PodRef, sizing: Sizing) -> Pledge:
        now = self.clock()
        return Pledge(
            id=secrets.token_hex(8),
            vendor=sizing.vendor,
            model=sizing.model,
            devices=sizing.devices,
            vram_mib_per_device=sizing.vram_mib_per_device,
            whole_device=sizing.whole_device,
            acu_per_device=sizing.acu_per_device,
            time_s=now,
            name=ref.name,
            spent_s=now,
            uid=ref.uid,
            pod=ref.name,
        )

    # -- release / sweep --------------------------------------------------
    async def release(self, namespace: str, pledge_id: str, *, reason: str) -> bool:
        """Drop a pledge (its pod was deleted); True when it was there."""
        if pledge_id in self.keyed.get(namespace, {}):
            gone = await self._delete_own(namespace, pledge_id, revision=None)
            PLEDGES.add(1, {"outcome": reason})
            return gone

        def pick(doc: NamespacePledges) -> list[Pledge]:
            return [p for p in doc.pledges if p.id == pledge_id]

        return bool(await self._drop(namespace, pick, reason=reason))

    async def sweep(self) -> int:
        """Drop expired pledges and spent ones whose reservation is in the view."""
        ids = self._ids = self.summary().pledge_ids
        now, count = self.clock(), 0

        def pick(doc: NamespacePledges) -> list[Pledge]:
            expired, done = pledges.sweep(
                doc, now=now, ttl_s=self.ttl_s, grace_s=self.grace_s, reserved=ids
            )
            for p in expired:
                _log.warning("pledge_expired", namespace=doc.namespace, pledge=p.id, name=p.name)
            return expired + done

        for ns in list(self.docs):
            count += await self._drop(ns, pick, reason="sweep")
        for ns in list(self.keyed):
            count += await self._drop_own(ns, pick, reason="sweep")
        for ns in self._namespaces():
            count += await self._drop_orphans(ns, now=now)
        return count

    async def _drop_orphans(self, ns: str, *, now: float) -> int:
        known = self._all(ns)
        if self.pods is None or known is None:
            return 0
        if not pledges.orphans(known, referenced=(), now=now, after_s=self.orphan_after_s):
            return 0  # none old enough: no need to list the pods
        if now - self._listed.get(ns, float("-inf")) < self.orphan_after_s:
            return 0  # listed lately: an orphan goes within twice the window
        self._listed[ns] = now
        try:
            found = await self.pods(ns)
        except HcsError as exc:
            _log.warning("pledge_pods_unreadable", namespace=ns, error=str(exc))
            return 0
        carried = {pledges.pledge_of(p) for p in found}

        def pick(doc: NamespacePledges) -> list[Pledge]:
            gone = pledges.orphans(doc, referenced=carried, now=now, after_s=self.orphan_after_s)
            for p in gone:
                _log.warning("pledge_orphaned", namespace=ns, pledge=p.id, name=p.name)
            return gone

        count = await self._drop(ns, pick, reason="orphan") if ns in self.docs else 0
        return count + await self._drop_own(ns, pick, reason="orphan")

    async def _drop_own(
        self,
        ns: str,
        pick: Callable[[NamespacePledges], list[Pledge]],
        *,
        reason: str,
    ) -> int:
        """Delete the picked pledges kept under their own keys, each at the
        revision it was picked at (one spent meanwhile is left alone)."""
        mine = self.keyed.get(ns)
        if not mine:
            return 0
        revisions = {pid: own.revision for pid, own in mine.items()}
        picked = pick(
            NamespacePledges(namespace=ns, pledges=tuple(o.pledge for o in mine.values()))
        )
        count = 0
        for p in picked:
            if await self._delete_own(ns, p.id, revision=revisions.get(p.id)):
                count += 1
        if count:
            PLEDGES.add(count, {"outcome": reason})
        return count

    async def _drop(
        self,
        namespace: str,
        pick: Callable[[NamespacePledges], list[Pledge]],
        *,
        reason: str,
    ) -> int:
        """Drop the picked pledges from the namespace's document; how many."""

        def drop(doc: NamespacePledges | None) -> kvcas.Change[NamespacePledges, int]:
            gone = pick(doc) if doc is not None else []
            if doc is None or not gone:
                return kvcas.Keep(0)
            return kvcas.Put(pledges.without(doc, [p.id for p in gone]), len(gone))

        async with self.lock(namespace):
            count = await self._update(namespace, drop)
        if count:
            PLEDGES.add(count, {"outcome": reason})
        return count


def _count_refused(count: int) -> None:
    if count:
        PLEDGES.add(count, {"outcome": "refused"})


def _why(verdict: pledges.Spend, pledge_id: str) -> str:
    if not pledge_id:
        return "no pledge (admitted without one)"
    if verdict.outcome == "used" and verdict.pledge is not None:
        return (
            f"pledge {pledge_id} was already used by pod {verdict.pledge.pod} (a copied plan note)"
        )
    if verdict.outcome == "foreign" and verdict.pledge is not None:
        made = verdict.pledge.made_for
        return f"pledge {pledge_id} was made for pod {made} (a copied plan note)"
    return f"pledge {pledge_id} is gone (expired or released)"


async def sweep_loop(pledger: Pledger, *, every_s: float = 5.0) -> None:
    """Sweep forever; a failed round is logged and tried again. (The delete
    markers swept keys leave are purged by the operator's ``hcs bus
    compact``: no part may purge a stream.)"""
    loop = asyncio.get_running_loop()
    took = 0.0
    while True:
        await asyncio.sleep(tasks.spacing_s(took, every_s=every_s))
        began = loop.time()
        try:
            await pledger.sweep()
        except HcsError as exc:
            _log.warning("pledge_sweep_failed", error=str(exc))
        took = loop.time() - began
