"""The plan of a gang member at admission (``hcs.place`` with ``gang_key``):
the gang's class, pinned in its record (``scheduler.plan.gang_records``) by
the first member with a compare-and-set create, read by every later one.
Given the namespaces' ComputeQuotas, a gang that fits whole on several
classes now is pinned to the one its start leaves fairest
(``scheduler.quota.gang_pool.Pool.fairest``).
No pledge is made here: the gang loop pledges the whole gang at once.

A gang that can never fit (larger than the fleet, or only across collective
libraries it did not opt in to), a member that asks differently from the
first, or a size that disagrees with the record's, is refused by name.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Protocol

import msgspec
from nats.js.kv import KeyValue

from hcs_bus import kvcas
from hcs_bus.messages import Plan, PlanRequest
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import logger, meter, zero_init
from scheduler.ledger.pledge_rules import Held
from scheduler.plan import gang_records as records
from scheduler.plan.gang_records import GangRecord
from scheduler.plan.rules import QuotaLimits, summarise
from scheduler.quota import gang_pool
from scheduler.quota.share_rules import Job
from scheduler.view.state import ClusterState

_log = logger("hcs.scheduler.gangs")
PINS = zero_init(
    meter("hcs.scheduler").create_counter(
        "hcs_scheduler_gang_pins", description="gang members planned at admission, by outcome"
    ),
    {"outcome": "pinned"},
    {"outcome": "joined"},
    {"outcome": "refused"},
)
ATTEMPTS = 20


class Quotas(Protocol):
    async def limits(self, namespace: str) -> QuotaLimits | None: ...


class GangPins:
    """Pins each gang's class at its first member's admission."""

    def __init__(
        self,
        *,
        kv: KeyValue,
        state: ClusterState,
        profiles: ProfileDB,
        known: records.Records,
        held: Callable[[], Mapping[str, Held]],
        plan: Callable[[PlanRequest], Awaitable[Plan]],
        clock: Callable[[], float] = time.time,
        quotas: Quotas | None = None,
    ) -> None:
        self.kv, self.state, self.profiles, self.known = kv, state, profiles, known
        self.held, self.plan, self.clock, self.quotas = held, plan, clock, quotas

    async def place(self, request: PlanRequest) -> Plan:
        """The member's plan on its gang's class (no pledge), or a refusal."""
        key = records.key_of_run(request.gang_key)
        namespace, job, run = _parts(request.gang_key)
        if namespace != request.namespace or not job or request.gang_size < 1:
            return _refused(
                f"hcs: gang {request.gang_key!r} of size {request.gang_size} is not a gang "
                f"of namespace {request.namespace}"
            )
        if request.gang_min and not 0 < request.gang_min < request.gang_size:
            return _refused(
                f"hcs: gang {request.gang_key!r}: its least size {request.gang_min} is not "
                f"between 1 and its size {request.gang_size}"
            )
        fewest = request.gang_min or request.gang_size
        gang = records.gang_of(key, size=fewest, requests=request.requests, policy=request.policy)

        made = False
        held = self.known.get(key)
        prefer = await self._fairest(key, request, fewest) if held is None else None

        def decide(found: GangRecord | None) -> kvcas.Change[GangRecord, GangRecord | str]:
            nonlocal made
            made = False
            if found is not None:
                return kvcas.Keep(found)
            pin = records.pin(
                self.state, gang, held=self.held(), profiles=self.profiles, prefer=prefer
            )
            if pin.refusal:
                return kvcas.Keep(pin.refusal)
            record = GangRecord(
                namespace=namespace,
                job=job,
                run=run,
                size=request.gang_size,
                least=request.gang_min,
                vendor=pin.vendor,
                model=pin.model,
                library=pin.library,
                time_s=self.clock(),
                priority=request.priority,
                requests=request.requests,
                policy=request.policy,
            )
            made = True
            return kvcas.Put(record, record)

        found = await kvcas.update(
            self.kv,
            key,
            decide,
            decode=records.DECODER.decode,
            encode=records.ENCODER.encode,
            known=kvcas.Read(held[0], held[1]) if held is not None else None,
            seen=lambda read: self._seen(key, read),
            attempts=ATTEMPTS,
        )
        if isinstance(found, str):
            return _refused(f"hcs: {found}")
        problem = _disagrees(found, request)
        if problem:
            return _refused(f"hcs: gang {request.gang_key}: {problem}")
        pinned = msgspec.structs.replace(
            request.policy, vendors=(found.vendor,), models=(found.model,), substitution="deny"
        )
        plan = await self.plan(
            msgspec.structs.replace(request, policy=pinned, dry_run=True, gang_key="")
        )
        PINS.add(1, {"outcome": "pinned" if made else "joined"})
        _log.info(
            "gang_member_planned",
            gang=request.gang_key,
            pod=request.pod_name,
            vendor=found.vendor,
            model=found.model,
            ok=plan.ok,
        )
        return msgspec.structs.replace(_queued_at_ceiling(plan, size=found.fewest), pledge="")

    async def _fairest(
        self, key: str, request: PlanRequest, fewest: int
    ) -> Callable[[Sequence[str]], str] | None:
        """With the namespaces' quotas: of the classes a new gang fits on now,
        the one its start leaves fairest (``gang_pool.Pool.fairest``)."""
        if self.quotas is None:
            return None
        known = [r for r, _ in self.known.all()]
        names = sorted({r.namespace for r in known} | {request.namespace})
        limits = {ns: await self.quotas.limits(ns) for ns in names}
        classes = summarise(self.state.schedulable()).classes
        pool = gang_pool.Pool.of(classes=classes.values(), limits=limits, pledged=known)
        waiting = [
            gang_pool.waiting_job(r, priority=r.priority)
            for r in known
            if r.state == "pinned" and r.class_key in pool.classes
        ]
        job = Job(
            key=key,
            namespace=request.namespace,
            ranks=fewest,
            devices_per_rank=max(1, request.requests.devices or 1),
            priority=request.priority,
        )
        free = {k: c.idle_devices for k, c in classes.items()}
        return lambda able: pool.fairest(job, able, free=free, waiting=waiting)

    def _seen(self, key: str, read: kvcas.Read[GangRecord]) -> None:
        if read.value is not None and read.revision is not None:
            self.known.apply(key, records.ENCODER.encode(read.value), read.revision)


def _queued_at_ceiling(plan: Plan, *, size: int) -> Plan:
    """A member refused only because its namespace's ceiling is full now is
    admitted: the gang loop keeps its gang waiting at the ceiling (the
    reason says so). Still refused when ``size`` ranks alone are above the
    ceiling: that gang never fits."""
    verdict = plan.quota
    if plan.ok or verdict is None or verdict.ok or not plan.vendor:
        return plan
    devices = size * plan.devices
    vram, acu = devices * plan.vram_mib_per_device, devices * plan.acu_per_device
    if (verdict.vram_mib_hard is not None and vram > verdict.vram_mib_hard) or (
        verdict.acu_hard is not None and acu > verdict.acu_hard + 1e-6
    ):
        return msgspec.structs.replace(
            plan, reason=f"{plan.reason}; the gang's {size} ranks alone are above the ceiling"
        )
    return msgspec.structs.replace(
        plan, ok=True, reason=f"the gang waits at its namespace's ceiling ({verdict.reason})"
    )


def _parts(run_key: str) -> tuple[str, str, str]:
    namespace, _, rest = run_key.partition("/")
    job, _, run = rest.partition("/")
    return namespace, job, run


def _disagrees(record: GangRecord, request: PlanRequest) -> str:
    """Why a later member cannot join the gang its record describes ("" when it can)."""
    if record.size != request.gang_size:
        return (
            f"this pod says the gang has {request.gang_size} members, its first member "
            f"said {record.size}"
        )
    if record.least != request.gang_min:
        return (
            f"this pod says the gang runs with at least {request.gang_min or request.gang_size} "
            f"members, its first member said {record.fewest}"
        )
    if record.requests is not None and record.requests != request.requests:
        return (
            "this pod asks differently from the gang's first member; every member of a "
            "gang must ask the same"
        )
    if record.policy is not None and record.policy != request.policy:
        return "this pod's placement policy differs from the gang's first member's"
    return ""


def _refused(reason: str) -> Plan:
    PINS.add(1, {"outcome": "refused"})
    _log.info("gang_refused", reason=reason)
    return Plan(ok=False, reason=reason)
