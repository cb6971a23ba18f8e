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
* pledged, and a member behind HCS's gate came after the pledge (the gang's
  members were replaced: the healer restarted it): back to pinned, its
  pledges dropped, so it is pledged again whole (``records.restarted``);
* its members all gone or finished (a pinned record ``grace_s`` after it was
  made, so a gang whose pods are still being created keeps it): deleted.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import msgspec
from nats.js.kv import KeyValue

from hcs_bus import kvcas
from hcs_bus.errors import HcsError, KubeInvalid, KubeNotFound
from hcs_bus.messages import Policy
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger, meter, zero_init
from scheduler.ledger.pledge_rules import Held
from scheduler.plan import gang_records as records
from scheduler.plan import gang_rules as ganging
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.gang_service import GangPins
from scheduler.plan.service import Planner
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
)
FINISHED = ("Succeeded", "Failed")


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
        starvation_s: float = 300.0,
        grace_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube, self.kv, self.state, self.known = kube, kv, state, known
        self.held, self.reserved, self.profiles = held, reserved, profiles
        self.selector = f"spec.schedulerName={scheduler_name}"
        self.every_s, self.starvation_s, self.grace_s = every_s, starvation_s, grace_s
        self.clock = clock
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
        for pod in pods:
            key = records.gang_key_of(pod)
            if key and not _finished(pod):
                members.setdefault(key, []).append(pod)
        ready: list[_Ready] = []
        for record, revision in self.known.all():
            live = members.get(record.key, [])
            if not live:
                await self._release(record, revision)
            elif records.restarted(record, live):
                await self._reset(record, revision)
            elif record.state == "pledged":
                await self._ungate(record, live)
            else:
                found = await self._ready(record, revision, live)
                if found is not None:
                    ready.append(found)
        return await self._admit(ready, members) if ready else 0

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
        if len(gated) < record.size or record.requests is None:
            await self._note(record, live, f"{len(gated)} of its {record.size} members exist")
            return None
        chosen = sorted(gated, key=_rank_of)[: record.size]
        pinned = msgspec.structs.replace(
            record.policy or Policy(),
            vendors=(record.vendor,),
            models=(record.model,),
            substitution="deny",
            job=None,
        )
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
        admission = ganging.admit_order(
            (r.gang for r in ready),
            state=state,
            now=self.clock(),
            starvation_s=self.starvation_s,
            held=held,
            profiles=self.profiles,
        )
        by_key = {r.gang.name: r for r in ready}
        won = 0
        for plan in admission.start:
            if await self._pledge(by_key[plan.gang], plan, members.get(plan.gang, [])):
                won += 1
        for plan in (*admission.waiting, *admission.refused):
            found = by_key[plan.gang]
            GANGS.add(1, {"outcome": "waiting"})
            await self._note(found.record, members.get(plan.gang, []), plan.reason)
        return won

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

    # -- restarted gangs --------------------------------------------------
    async def _reset(self, record: GangRecord, revision: int) -> None:
        """A pledged gang whose members were replaced waits again, whole."""

        def decide(found: GangRecord | None) -> kvcas.Change[GangRecord, bool]:
            if found is None or found != record:
                return kvcas.Keep(False)
            return kvcas.Put(records.reset(found), True)

        done = await kvcas.update(
            self.kv,
            record.key,
            decide,
            decode=records.DECODER.decode,
            encode=records.ENCODER.encode,
            known=kvcas.Read(record, revision),
            seen=lambda read: self._seen(record.key, read),
        )
        if done:
            GANGS.add(1, {"outcome": "restarted"})
            _log.info("gang_restarted", gang=record.key, vendor=record.vendor, model=record.model)
            self._told.pop(record.key, None)

    # -- ended gangs ------------------------------------------------------
    async def _release(self, record: GangRecord, revision: int) -> None:
        if record.state == "pinned" and self.clock() - record.time_s < self.grace_s:
            return  # its members may still be coming

        def decide(found: GangRecord | None) -> kvcas.Change[GangRecord, bool]:
            if found is None or found != record:
                return kvcas.Keep(False)
            return kvcas.Delete(True)

        gone = await kvcas.update(
            self.kv,
            record.key,
            decide,
            decode=records.DECODER.decode,
            encode=records.ENCODER.encode,
            known=kvcas.Read(record, revision),
        )
        if gone:
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
    return phase in FINISHED or bool(meta.get("deletionTimestamp"))


def _rank_of(pod: Mapping[str, Any]) -> tuple[int, str]:
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    index = notes.get("batch.kubernetes.io/job-completion-index")
    rank = int(index) if isinstance(index, str) and index.isdigit() else 1 << 30
    return rank, _name(pod)


def _event(pod: Mapping[str, Any], *, message: str, now: float) -> dict[str, Any]:
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
        "type": "Warning",
        "reason": "GangWaiting",
        "message": message[:1024],
        "source": {"component": REPORTER},
        "reportingComponent": REPORTER,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def of_replica(*, kube: Any, kv: KeyValue, planner: Planner, scheduler_name: str) -> GangLoop:
    """The gang loop of one replica: its view, its pledges and gang records."""
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
    )


def pins_of(*, kv: KeyValue, planner: Planner) -> GangPins:
    """The gang pins of one replica's plan service (``Planner.gangs``)."""
    assert planner.pledger is not None
    return GangPins(
        kv=kv,
        state=planner.state,
        profiles=planner.profiles,
        known=planner.pledger.gangs,
        held=planner.held,
        plan=planner.plan,
    )
