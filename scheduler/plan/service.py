"""The plan service and explicit releases (``hcs.release``), all core
request-reply in the queue group of every scheduler replica.

Plans that pledge come on ``hcs.place`` (only the injector may publish
there), dry runs on ``hcs.place.dry``; a request whose ``dry_run`` disagrees
with the subject it came on is refused (logged, counted in
``hcs_scheduler_plan_refusals``), never planned: NATS permissions can then
say who may pledge. Answers go only to inboxes (``hcs_bus.bus.Bus.serve``).

``Planner`` keeps the class summary of the view (recomputed at most every
``max_age_s`` after a change, so plans stay O(classes), not O(nodes); a
summary that costs more to build is rebuilt less often, so building never
takes more than ``SUMMARY_SHARE`` of the replica's time, however large the
fleet or busy the machine).

Every plan is answered within ``PLAN_BUDGET_S``, well inside what the
injector waits (``injector.plan_timeout_s``): one that runs past it (its
pledge's write queued behind a burst, a first quota read) is answered on the
summary held, every pledge counted, pledging nothing (bind then spends a
fresh pledge within the quota), counted in ``hcs_scheduler_plan_shortcuts``;
the pledge the late plan makes is released. What the shortcut plan gave is
held in this replica's summary until its pod is booked (or as long as a
pledge lives), so the plans after it count it. An overloaded replica
admits pods on a conservative plan rather than failing their creation.

A plan request says how long the injector still waits (``Hcs-Wait-S``,
``hcs_bus.bus``): one that queued here past that is dropped unplanned, so an
overloaded replica spends its time on admissions still waiting rather than
on pledges for ones already refused; one that queued for part of it gets
half of what is left as its budget (``plan_budget``).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from hcs_bus import plannotes, subjects, tasks
from hcs_bus.bus import Bus, time_left
from hcs_bus.messages import AllocationEvent, Plan, PlanRequest, PodRef, ReleaseRequest
from hcs_bus.profiles import ProfileDB
from hcs_bus.telemetry import SECONDS_BUCKETS, logger, meter, zero_init
from scheduler.ledger.pledge_rules import Held, Pledge
from scheduler.ledger.pledge_store import Pledger
from scheduler.ledger.reservation_store import Booker
from scheduler.plan import fleet_summary, gang_records
from scheduler.plan import rules as planning
from scheduler.plan.gang_service import GangPins
from scheduler.plan.pods import PlanAnnotation, PodInfo
from scheduler.plan.shortcut_holds import Hold, ShortcutHolds
from scheduler.quota.source import QuotaSource
from scheduler.view.state import ClusterState, pod_key

_log = logger("hcs.scheduler.serving")
PLAN_SECONDS = meter("hcs.scheduler").create_histogram(
    "hcs_scheduler_plan_seconds",
    unit="s",
    description="time to answer one plan request (hcs.place)",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
PLAN_REFUSALS = zero_init(
    meter("hcs.scheduler").create_counter(
        "hcs_scheduler_plan_refusals",
        description="plan requests refused unplanned: dry_run disagrees with the subject,"
        " or the bus lost its quorum",
    ),
    {"reason": "dry_run_on_pledging_subject"},
    {"reason": "pledge_on_dry_subject"},
    {"reason": "quorum_lost"},
)


PLAN_SHORTCUTS = zero_init(
    meter("hcs.scheduler").create_counter(
        "hcs_scheduler_plan_shortcuts",
        description="plans answered on the summary held, unpledged: the full plan ran past "
        "PLAN_BUDGET_S",
    ),
    {"reason": "over_budget"},
)

PLACE_CONCURRENCY = 64
PLAN_BUDGET_S = 0.8  # every plan answered within this; the injector waits 4 s (plan_timeout_s)
SUMMARY_SHARE = 0.2  # rebuilding the summary takes at most this share of the replica's time
QUICK_QUOTA_S = 0.05  # a shortcut plan waits this long for a namespace's quota, never more
SHORTCUT_HOLD_S = 300.0  # without a pledger: a shortcut plan's room is held at most this long


class Planner:
    def __init__(
        self,
        state: ClusterState,
        *,
        profiles: ProfileDB,
        quotas: QuotaSource,
        max_age_s: float = 0.5,
        spread: bool = False,
    ) -> None:
        self.state = state
        self.spread = spread  # ``placement: spread``: classes by free share
        self.profiles = profiles
        self.quotas = quotas
        self.max_age_s = max_age_s
        self._summary: planning.Summary | None = None
        self._parts = fleet_summary.Parts()
        self._at = float("-inf")  # when the summary held was built (its build's end)
        self._cost_s = 0.0  # what building it took
        self._dirty = True
        self._late: set[asyncio.Task[Any]] = set()  # plans answered past their budget
        self._holds = ShortcutHolds()  # what shortcut plans hold until their pods are booked
        self._charged: tuple[planning.Summary, int, planning.Summary] | None = None
        self.pledger: Pledger | None = None  # set by the replica: pledges counted and made
        self.gangs: GangPins | None = None  # set by the replica: gang members' classes

    def changed(self, node: str) -> None:
        self._parts.changed(node)
        self._dirty = True

    def usage(self) -> dict[str, planning.Usage]:
        """Per namespace: what its reservations hold now, every node counted
        (``Parts.usage``; ComputeQuota ``status.used``). The nodes changed
        since the last summary are taken in here, once: the next summary
        finds them done."""
        return self._parts.usage(self.state.nodes)

    def classes(self) -> dict[str, planning.ClassStats]:
        """The schedulable fleet's classes now, with nothing pledged or held
        counted (what the quotas' guarantees are judged against)."""
        return self._parts.summary(self.state.nodes).classes

    def summary(self) -> planning.Summary:
        """The cluster summary plans are made on: rebuilt on a change at most
        every ``max_age_s``, except while the one held has no class at all (a
        replica that just started, its fleet's first fingerprints arriving):
        every pod would be refused on it."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        held = self._summary
        if held is None or (
            self._dirty and (now - self._at >= self._spacing() or not held.classes)
        ):
            self._dirty = False
            self._summary = held = self._parts.summary(self.state.nodes)
            self._at = loop.time()
            self._cost_s = self._at - now
            self._drop_booked(now=self._at)
        return self._held_too(held)

    def _held_too(self, summary: planning.Summary) -> planning.Summary:
        """``summary`` with what the shortcut plans not booked yet hold: from
        their running sums, and the same object again while neither it nor
        the holds have changed."""
        self._holds.expire(asyncio.get_running_loop().time())
        if not self._holds:
            return summary
        known = self._charged
        if known is not None and known[0] is summary and known[1] == self._holds.version:
            return known[2]
        out = planning.charged(
            summary, by_class=self._holds.by_class, by_namespace=self._holds.by_namespace
        )
        self._charged = (summary, self._holds.version, out)
        return out

    def _drop_booked(self, *, now: float) -> None:
        """Keep only the holds still standing: not expired, their pod not
        booked in the view."""
        if not self._holds:
            return
        booked = {key for node in self.state.nodes.values() for key in node.reservations}
        self._holds.keep(
            lambda h: h.until > now and not (h.pod and pod_key(h.namespace, h.pod) in booked)
        )

    def _spacing(self) -> float:
        """How long a summary is kept after a change: ``max_age_s``, or longer
        when building it costs more than ``SUMMARY_SHARE`` of that (a fold
        of a large fleet on a busy machine): else every plan of a burst
        would build one, each taking longer than the budget of the plans
        behind it. 0 (``max_age_s`` 0): rebuilt at every change."""
        if self.max_age_s <= 0:
            return 0.0
        return max(self.max_age_s, self._cost_s * (1 - SUMMARY_SHARE) / SUMMARY_SHARE)

    def held(self, *, waiting: bool = False) -> dict[str, Held]:
        """What outstanding pledges (a pledged gang's ranks too) hold, per
        class; ``waiting``: and what gangs pinned but not pledged yet will
        take (``gang_records.waiting_held``: what a new gang's pin counts)."""
        summary = self.summary()
        if self.pledger is not None:
            summary = self.pledger.charged(summary)
        out = {key: stats.pledged for key, stats in summary.classes.items()}
        if waiting and self.pledger is not None:
            pinned = [record for record, _rev in self.pledger.gangs.all()]
            more = gang_records.waiting_held(pinned, summary.classes, self.profiles)
            for key, held in more.items():
                out[key] = out[key].add(held) if key in out else held
        return out

    async def plan(self, request: PlanRequest) -> Plan:
        """A plan with every outstanding pledge counted; records nothing."""
        summary = self.summary()
        if self.pledger is not None:
            summary = self.pledger.charged(summary)
        return await self._plan(request, summary)

    async def quick(self, request: PlanRequest) -> Plan:
        """The plan an overloaded replica answers: on the summary held (not
        rebuilt), every known pledge counted, the quota only if known within
        ``QUICK_QUOTA_S`` (bind checks it again); it pledges nothing."""
        held = self._summary
        summary = self.summary() if held is None else self._held_too(held)
        if self.pledger is not None:
            summary = self.pledger.charged(summary)
        quota = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(QUICK_QUOTA_S):  # the read itself goes on (shielded)
                quota = await self.quotas.limits(request.namespace)
        plan = planning.plan(
            request, summary=summary, profiles=self.profiles, quota=quota, spread=self.spread
        )
        if plan.ok and plan.devices >= 1 and not request.dry_run:
            # as long as a pledge would be: pods of a burst may wait minutes for bind
            ttl_s = self.pledger.ttl_s if self.pledger is not None else SHORTCUT_HOLD_S
            until = asyncio.get_running_loop().time() + ttl_s
            name = "" if request.generate_name else request.pod_name
            hold = Pledge(
                id="",
                vendor=plan.vendor,
                model=plan.model,
                devices=plan.devices,
                vram_mib_per_device=plan.vram_mib_per_device,
                whole_device=plan.whole_device,
                acu_per_device=plan.acu_per_device,
            )
            self._holds.add(Hold(until, request.namespace, name, hold))
        return plan

    async def within_budget(self, request: PlanRequest, *, budget_s: float) -> Plan:
        """``place`` if it is done within ``budget_s``, else ``quick``; a
        pledge the late ``place`` makes is then released. A gang member's
        plan is always the full one (its class is the gang's)."""
        if request.gang_key:
            return await self.place(request)
        full = asyncio.ensure_future(self.place(request))
        try:
            return await asyncio.wait_for(asyncio.shield(full), budget_s)
        except TimeoutError:
            pass
        self._late.add(full)
        full.add_done_callback(lambda done: self._release_late(request, done))
        PLAN_SHORTCUTS.add(1, {"reason": "over_budget"})
        _log.info(
            "plan_over_budget",
            namespace=request.namespace,
            pod=request.pod_name[:256],
            budget_s=budget_s,
        )
        return await self.quick(request)

    def _release_late(self, request: PlanRequest, done: asyncio.Task[Plan]) -> None:
        self._late.discard(done)
        if done.cancelled() or done.exception() is not None or self.pledger is None:
            return
        pledge = done.result().pledge
        if pledge:
            task = tasks.start(
                self.pledger.release(request.namespace, pledge, reason="late"),
                name=f"pledge-release-late:{pledge}",
            )
            self._late.add(task)
            task.add_done_callback(self._late.discard)

    async def settle(self, *, timeout_s: float = 5.0) -> None:
        """Wait for the plans answered past their budget and their releases;
        those still running after ``timeout_s`` are cancelled."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self._late and loop.time() < deadline:
            await asyncio.wait(list(self._late), timeout=max(deadline - loop.time(), 0.0))
        await tasks.stop(*self._late)

    async def place(self, request: PlanRequest) -> Plan:
        """The admission's plan: a non-dry-run one also makes its pledge."""
        if request.gang_key and not request.dry_run and self.gangs is not None:
            return await self.gangs.place(request)
        if request.dry_run or self.pledger is None:
            return await self.plan(request)
        quoted = await self.quotas.limits(request.namespace) is not None
        return await self.pledger.place(request, self._plan, quoted=quoted)

    async def _plan(self, request: PlanRequest, summary: planning.Summary) -> Plan:
        quota = await self.quotas.limits(request.namespace)
        return planning.plan(
            request, summary=summary, profiles=self.profiles, quota=quota, spread=self.spread
        )

    async def spend(self, pod: PodInfo, demand: PlanAnnotation) -> tuple[str, str]:
        """At bind: the pod's pledge spent (or a fresh one within its quota);
        ("", pledge id) or (the refusal, "")."""
        if self.pledger is None:
            return "", ""
        quota = await self.quotas.limits(pod.ref.namespace)
        return await self.pledger.spend(pod.ref, pod.pledge, sizing=demand, quota=quota)

    async def demand(self, pod: PodInfo) -> PlanAnnotation | str:
        """The pod's device demand: its ``hcs.io/plan`` annotation, or a plan
        computed from its ``ai.compute/*`` requests; a string is a refusal."""
        if pod.annotation is not None:
            return pod.annotation
        assert pod.requests is not None
        request = PlanRequest(
            namespace=pod.ref.namespace,
            requests=pod.requests,
            policy=pod.policy,
            pod_name=pod.ref.name,
            dry_run=True,
        )
        found = await self.plan(request)
        if not found.ok:
            return f"hcs: no plan for {pod.ref.namespace}/{pod.ref.name}: {found.reason}"
        return plannotes.note_of(found)


class PlanService:
    """Answers ``hcs.place``, ``hcs.place.dry`` and ``hcs.release`` for one replica."""

    def __init__(self, bus: Bus, *, planner: Planner, booker: Booker) -> None:
        self.bus, self.planner, self.booker = bus, planner, booker
        self._subs: list[Any] = []

    async def start(self) -> None:
        self._subs = [
            await self.bus.serve(
                subjects.PLACE,
                PlanRequest,
                self._pledging,
                queue=subjects.PLACE_QUEUE,
                on_bad=lambda reason: Plan(ok=False, reason=reason),
                concurrency=PLACE_CONCURRENCY,  # admissions wait on their pledge's write
                expires=True,  # a pledge for an admission already refused would sit unclaimed
            ),
            await self.bus.serve(
                subjects.PLACE_DRY,
                PlanRequest,
                self._dry,
                queue=subjects.PLACE_QUEUE,
                on_bad=lambda reason: Plan(ok=False, reason=reason),
                concurrency=PLACE_CONCURRENCY,
                expires=True,
            ),
            await self.bus.serve(
                subjects.RELEASE,
                ReleaseRequest,
                self._release,
                queue=subjects.PLACE_QUEUE,
                on_bad=_bad_release,
            ),
        ]

    async def stop(self) -> None:
        for sub in self._subs:
            await sub.unsubscribe()
        self._subs = []
        await self.planner.settle()

    async def _pledging(self, request: PlanRequest) -> Plan:
        if request.dry_run:
            return _refuse(request, "dry_run_on_pledging_subject", subject=subjects.PLACE)
        if not request.admission_uid or not (request.pod_name or request.generate_name):
            return _unbound(request)
        return await self._place(request)

    async def _dry(self, request: PlanRequest) -> Plan:
        if not request.dry_run:
            return _refuse(request, "pledge_on_dry_subject", subject=subjects.PLACE_DRY)
        return await self._place(request)

    async def _place(self, request: PlanRequest) -> Plan:
        if refusal := self.booker.quorum_lost():  # the ledger cannot be written or trusted
            PLAN_REFUSALS.add(1, {"reason": "quorum_lost"})  # logged once, by the watch
            return Plan(ok=False, reason=refusal)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            plan = await self.planner.within_budget(request, budget_s=plan_budget(time_left()))
        except Exception as exc:  # a plan request must always get an answer
            _log.error("plan_failed", namespace=request.namespace, error=repr(exc), exc_info=exc)
            plan = Plan(ok=False, reason=f"hcs: planning failed: {exc!r}")
        PLAN_SECONDS.record(loop.time() - started, {"ok": str(plan.ok).lower()})
        return plan

    async def _release(self, request: ReleaseRequest) -> AllocationEvent:
        event = await self.booker.release(request.pod, reason=request.reason or "release request")
        if event is None:
            return AllocationEvent(
                node="",
                pod=request.pod,
                state="released",
                time_s=0.0,
                reason="no reservation held for this pod",
            )
        return event


def plan_budget(left_s: float | None) -> float:
    """How long a full plan may run: ``PLAN_BUDGET_S``, or half of what its
    asker still waits when that is less (a request that queued behind a
    burst), the other half left for the shortcut plan and the answer's way
    back."""
    if left_s is None:
        return PLAN_BUDGET_S
    return max(min(PLAN_BUDGET_S, left_s / 2), 0.0)


def _refuse(request: PlanRequest, reason: str, *, subject: str) -> Plan:
    """A plan request on the wrong subject for its ``dry_run``: refused, unplanned."""
    PLAN_REFUSALS.add(1, {"reason": reason})
    _log.warning(
        "plan_request_refused",
        subject=subject,
        reason=reason,
        dry_run=request.dry_run,
        namespace=request.namespace[:128],
        pod=request.pod_name[:256],
    )
    right = subjects.place(dry_run=request.dry_run)
    kind = "a dry run" if request.dry_run else "a plan that pledges (dry_run false)"
    return Plan(ok=False, reason=f"hcs: {kind} is asked on {right}, not on {subject}")


def _unbound(request: PlanRequest) -> Plan:
    """A pledging plan that names no admission or no pod: a pledge must be
    tied to the admission of one pod (released within
    ``pledge_unclaimed_s`` when that pod never appears), so it is refused."""
    PLAN_REFUSALS.add(1, {"reason": "pledge_without_admission"})
    _log.warning(
        "plan_request_refused",
        subject=subjects.PLACE,
        reason="pledge_without_admission",
        namespace=request.namespace[:128],
        pod=request.pod_name[:256],
    )
    return Plan(
        ok=False,
        reason="hcs: a plan that pledges must name its admission (admission_uid) and its pod "
        "(pod_name or generate_name)",
    )


def _bad_release(reason: str) -> AllocationEvent:
    return AllocationEvent(
        node="", pod=PodRef(namespace="", name=""), state="released", time_s=0.0, reason=reason
    )


async def ask_plan(bus: Bus, request: PlanRequest, *, timeout_s: float) -> Plan:
    """Ask any scheduler replica for a plan (``hcs place``: a dry run, on
    ``hcs.place.dry``; a pledging one goes to ``hcs.place``)."""
    subject = subjects.place(dry_run=request.dry_run)
    return await bus.request(subject, request, Plan, timeout_s=timeout_s)
