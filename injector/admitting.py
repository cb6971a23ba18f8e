"""One admission: AdmissionReview body in, answer out.

CREATE of a pod asking for ``ai.compute/*``: guard (reserved annotations;
privileged containers and host PID/IPC, unless the pod's service account is in
``settings.privileged_service_accounts``), ask the planner within the budget,
patch. UPDATE: only HCS may change reserved annotations. Anything else passes
untouched; a pod that mentions neither ``ai.compute/`` nor ``hcs.io/`` is
answered after a byte scan, without decoding the pod, unless its JSON escapes
a character those words are made of (``hcs.io\\u002fplan``): then only
decoding can tell, and the pod is decoded.

The planner is injected (the bus in production, anything in tests); failure
to plan follows ``settings.failure_policy``.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple

import msgspec

from hcs_bus import demands, jobs, vocabulary
from hcs_bus.demands import Demand, DemandError
from hcs_bus.errors import BadMessage, BusTimeout, BusUnavailable
from hcs_bus.messages import Plan, PlanRequest
from hcs_bus.settings import InjectorSettings
from hcs_bus.telemetry import current_traceparent, logger, span
from injector import fitting, guarding, originals, plans, reviews, sidecars, worlds
from injector import mutations as mutating
from injector import rebinds as rebinding
from injector.guarding import PLAN
from injector.mutations import Context
from injector.owning import Owners
from injector.reviews import Answer, BadReview, Request

Planner = Callable[[PlanRequest, float], Awaitable[Plan]]
_log = logger("hcs.injector")
_MAX_REJECTIONS = 12
# a JSON escape of "/", "." or an ASCII letter: "hcs.io\u002fplan", "ai.compute\/vram"
_ESCAPED_NAME_CHAR = re.compile(rb"\\(?:/|u00(?:2[eEfF]|[4-7][0-9a-fA-F]))")


class Admitter:
    def __init__(
        self,
        *,
        settings: InjectorSettings,
        planner: Planner,
        ctx: Context,
        keys: Callable[[], Sequence[bytes]],
        owners: Owners | None = None,
    ) -> None:
        self.settings = settings
        self.planner = planner
        self.ctx = ctx
        self.keys = keys
        self.owners = owners  # the pods' owning Jobs (a cluster only): gang sizes

    async def admit(self, body: bytes, *, budget_s: float) -> Answer:
        try:
            request = reviews.decode(body)
        except BadReview as exc:
            _log.info("admission_bad_request", error=str(exc))
            return reviews.bad(exc)
        try:
            attributes = {"hcs.operation": request.operation, "hcs.namespace": request.namespace}
            with span("hcs.admission", attributes=attributes):
                return await self._route(request, budget_s=budget_s)
        except DemandError as exc:
            _log.info("admission_refused", uid=request.uid, error=str(exc))
            return reviews.deny(request.uid, str(exc), reason="bad_pod", code=400)
        except Exception as exc:  # never a 500: an answer per failure policy
            _log.error("admission_failed", uid=request.uid, error=repr(exc), exc_info=exc)
            return self._cannot_plan(request.uid, f"internal error in the HCS injector: {exc!r}")

    async def _route(self, request: Request, *, budget_s: float) -> Answer:
        raw = bytes(request.object)
        if request.operation == "CREATE":
            if not _mentions(raw, b"ai.compute/", b"hcs.io/"):
                return reviews.allow(request.uid)
            return await self._create(request, _pod(raw, what="object"), budget_s=budget_s)
        if request.operation == "UPDATE":
            old = bytes(request.old_object)
            if not _mentions(raw, b"hcs.io/") and not _mentions(old, b"hcs.io/"):
                return reviews.allow(request.uid)
            return self._update(request, _pod(raw, what="object"), _pod(old, what="oldObject"))
        return reviews.allow(request.uid)

    def _trusted(self, request: Request) -> bool:
        return guarding.is_hcs(request.user_info.username, self.settings.service_accounts)

    def _update(self, request: Request, pod: dict[str, Any], old: dict[str, Any]) -> Answer:
        if self._trusted(request):
            return reviews.allow(request.uid)
        changed = guarding.reserved_changes(
            demands.annotations_of(pod), demands.annotations_of(old)
        )
        if changed:
            _log.warning(
                "reserved_annotation_change",
                uid=request.uid,
                keys=changed,
                user=request.user_info.username,
            )
            return reviews.deny(
                request.uid,
                guarding.reserved_message(changed, username=request.user_info.username),
                reason="reserved_annotation",
            )
        return reviews.allow(request.uid)

    async def _create(self, request: Request, pod: dict[str, Any], *, budget_s: float) -> Answer:
        uid, trusted = request.uid, self._trusted(request)
        annotations = demands.annotations_of(pod)
        demand = demands.read(pod)
        note = self._own_note(request, annotations, demand, trusted=trusted, pod=_identity(pod))
        if not trusted:
            own = set(guarding.WRITTEN_AT_CREATE) if note else set()
            if not self._own_copy(request, annotations, pod):
                own.discard(originals.SUBMITTED)
            foreign = [k for k in guarding.reserved(annotations) if k not in own]
            if foreign:
                _log.warning(
                    "reserved_annotation_set",
                    uid=uid,
                    keys=foreign,
                    user=request.user_info.username,
                )
                return reviews.deny(
                    uid,
                    guarding.reserved_message(foreign, username=request.user_info.username),
                    reason="reserved_annotation",
                )
        sidecar = sidecars.inject(pod, namespace=request.namespace, settings=self.settings)
        if demand is None:
            return reviews.allow(uid, ops=sidecar)
        refused = self._privileged(request, pod)
        if refused is not None:
            return refused
        choice = rebinding.choose(annotations, self.ctx.rebinding)
        warnings: list[str] = []
        pledge = annotations.get(guarding.PLEDGE, "") if note is not None else ""
        job = await self.owners.job_of(request.namespace, pod) if self.owners else None
        group = await self.owners.pod_group_of(request.namespace, pod) if self.owners else None
        gang = gang_of(pod, namespace=request.namespace, job=job, pod_group=group)
        if note is None:
            planned = await self._plan(request, pod, demand, choice, budget_s=budget_s, gang=gang)
            if isinstance(planned, Answer):
                return planned
            note, warnings = plans.note_of(planned), _plan_warnings(planned)
            pledge = planned.pledge
        values = plans.note_annotations(
            note,
            namespace=request.namespace,
            demand=demand,
            key=self.keys()[0],
            pledge=pledge,
            pod=_identity(pod),
        )
        traceparent = current_traceparent()  # the bind continues this trace
        if traceparent and vocabulary.TRACEPARENT not in annotations:  # kept on reinvocation
            values[vocabulary.TRACEPARENT] = traceparent
        warnings += self._keep_submitted(request, annotations, pod, values)
        if gang is not None:
            values[vocabulary.GANG], values[vocabulary.GANG_SIZE] = gang[0], str(gang[1])
        mutation = mutating.mutate(
            pod, demand=demand, note=note, plan_annotations=values, choice=choice, ctx=self.ctx
        )
        if gang is not None:
            mutation.ops.extend(gate_ops(pod))
            mutation.ops.extend(
                world_ops(
                    pod,
                    gang,
                    made=mutation.ops,
                    namespace=request.namespace,
                    job=job,
                    pod_group=group,
                )
            )
        _log.debug(  # one a pod: the pod's hcs.io annotations say as much
            "admission_patched",
            uid=uid,
            vendor=note.vendor,
            model=note.model,
            devices=note.devices,
            ops=len(mutation.ops),
            dry_run=bool(request.dry_run),
        )
        ops = sidecars.after(mutation.ops, sidecar)
        return reviews.allow(uid, ops=ops, warnings=warnings + mutation.warnings)

    def _privileged(self, request: Request, pod: dict[str, Any]) -> Answer | None:
        """The refusal of a pod that would reach past its device share, unless
        its service account is allow-listed; None when it may go on."""
        found = guarding.privileges(pod)
        if not found:
            return None
        metadata = pod.get("metadata") or {}
        namespace = request.namespace or str(metadata.get("namespace") or "")
        account = guarding.service_account(pod, namespace=namespace)
        if account in self.settings.privileged_service_accounts:
            return None
        _log.warning("privileged_pod_refused", uid=request.uid, account=account, fields=found)
        message = guarding.privileged_message(found, account=account)
        return reviews.deny(request.uid, message, reason="privileged")

    def _own_copy(self, request: Request, annotations: dict[str, str], pod: dict[str, Any]) -> bool:
        """The pod's ``hcs.io/submitted`` is one this injector made for it (reinvocation)."""
        return originals.verified(
            annotations, namespace=request.namespace, name=_identity(pod), keys=self.keys()
        )

    def _keep_submitted(
        self,
        request: Request,
        annotations: dict[str, str],
        pod: dict[str, Any],
        values: dict[str, str],
    ) -> list[str]:
        """Add ``hcs.io/submitted`` to ``values`` for a pod that asks to be
        re-created (not again on reinvocation); warnings."""
        if not originals.wanted(annotations) or originals.SUBMITTED in annotations:
            return []
        kept = originals.record(
            pod, namespace=request.namespace, name=_identity(pod), key=self.keys()[0]
        )
        if kept is None:
            return [
                f"hcs: the pod is too large to keep a copy for re-creation "
                f"({vocabulary.REPLAN}: {vocabulary.REPLAN_RECREATE} is ignored)"
            ]
        values[originals.SUBMITTED] = kept
        return []

    def _own_note(
        self,
        request: Request,
        annotations: dict[str, str],
        demand: Demand | None,
        *,
        trusted: bool,
        pod: str,
    ) -> plans.PlanNote | None:
        """The plan note HCS already put on this pod (reinvocation), if any: one
        copied from another pod (another name, another pledge) is not."""
        if demand is None or PLAN not in annotations:
            return None
        note = plans.verified(
            annotations, namespace=request.namespace, demand=demand, keys=self.keys(), pod=pod
        )
        if note is None and trusted:
            note = plans.decode(annotations[PLAN])
        return note

    async def _plan(
        self,
        request: Request,
        pod: dict[str, Any],
        demand: Demand,
        choice: rebinding.Choice | None,
        *,
        budget_s: float,
        gang: GangOf | None = None,
    ) -> Plan | Answer:
        policy = demand.policy
        if choice is not None:
            vendors = rebinding.restrict(policy.vendors, choice, self.ctx.rebinding)
            policy = msgspec.structs.replace(policy, vendors=vendors)
        metadata = pod.get("metadata") or {}
        plan_request = PlanRequest(
            namespace=request.namespace,
            requests=demand.requests,
            policy=policy,
            pod_name=str(metadata.get("name") or metadata.get("generateName") or ""),
            generate_name="" if metadata.get("name") else str(metadata.get("generateName") or ""),
            dry_run=bool(request.dry_run),
            admission_uid=request.uid,
            gang_key=gang[0] if gang is not None else "",
            gang_size=gang[1] if gang is not None else 0,
            gang_min=gang.least if gang is not None else 0,
            priority=_priority(pod),
        )
        try:
            async with asyncio.timeout(budget_s):
                plan = await self.planner(plan_request, budget_s)
        except (BusTimeout, BusUnavailable, TimeoutError) as exc:
            return self._cannot_plan(
                request.uid,
                f"the HCS placement service did not answer within {budget_s:g}s "
                f"({exc.__class__.__name__})",
            )
        except BadMessage as exc:
            return self._cannot_plan(
                request.uid, f"the HCS placement service answered badly: {exc}"
            )
        if not plan.ok:
            _log.info("plan_refused", uid=request.uid, reason=plan.reason)
            return reviews.deny(
                request.uid, refusal(plan, asked=demand.amounts), reason="plan_refused"
            )
        if not plan.vendor or not plan.model or plan.devices < 1:
            return self._cannot_plan(
                request.uid,
                "the HCS placement service sent an incomplete plan "
                f"({plan.vendor}/{plan.model} x{plan.devices})",
            )
        where = f"{plan.vendor}/{plan.model}"
        too_big = fitting.refusal(demand, node_capacity=plan.node_capacity, where=where)
        if too_big:
            _log.info("admission_refused", uid=request.uid, error=too_big)
            return reviews.deny(request.uid, too_big, reason="too_big", code=422)
        return plan

    def _cannot_plan(self, uid: str, why: str) -> Answer:
        _log.warning("plan_unavailable", uid=uid, why=why, policy=self.settings.failure_policy)
        if self.settings.failure_policy == "fail-open":
            return reviews.allow(
                uid, warnings=[f"hcs: admitted WITHOUT accelerator injection (fail-open): {why}"]
            )
        return reviews.deny(
            uid,
            f"{why}; pod not admitted (failure policy fail-closed), retry shortly",
            reason="plan_unavailable",
            code=503,
        )


def _pod(raw: bytes, *, what: str) -> dict[str, Any]:
    try:
        pod = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise DemandError(f"request.{what} is not JSON: {exc}") from exc
    except (ValueError, RecursionError) as exc:  # invalid UTF-8, deep nesting
        raise DemandError(f"request.{what} is not JSON: {exc!r:.200}") from exc
    if pod is None:
        return {}
    if not isinstance(pod, dict):
        raise DemandError(f"request.{what} is not a Pod object")
    if not isinstance(pod.get("metadata", {}), dict):
        raise DemandError(f"request.{what}.metadata is not an object")
    return pod


class GangOf(NamedTuple):
    """The gang a pod is a member of: its run key, its size (the most members
    it runs with) and, for an elastic gang, the fewest (0: fixed)."""

    key: str
    size: int
    least: int = 0


def gang_of(
    pod: dict[str, Any],
    *,
    namespace: str,
    job: dict[str, Any] | None = None,
    pod_group: dict[str, Any] | None = None,
) -> GangOf | None:
    """The gang the pod is a member of: a job of more than one pod; None for
    a pod of no gang. Its size is the job's size, else its most size, else
    its least size; a least size below that makes it elastic (it starts with
    at least that many members and grows towards its size).
    ``job``: the pod's owning Job when it was looked up (its parallelism).
    ``JobError`` when the pod's job is unreadable (the pod is refused)."""
    identity = jobs.read(pod, namespace=namespace or None, job=job, pod_group=pod_group)
    if identity is None:
        return None
    size = identity.size or identity.max_size or identity.min_size or 0
    if size <= 1:
        return None
    least = identity.min_size or 0
    return GangOf(identity.run_key, size, least if 0 < least < size else 0)


def world_ops(
    pod: dict[str, Any],
    gang: GangOf,
    *,
    made: list[dict[str, Any]],
    namespace: str,
    job: dict[str, Any] | None = None,
    pod_group: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """The JSON patch that tells every container of a member of ``gang`` its
    job and world size (``injector.worlds``), after the operations ``made``."""
    member = jobs.read(pod, namespace=namespace or None, job=job, pod_group=pod_group)
    if member is None:  # gang_of read this job: never
        return []
    least = gang.least or gang.size
    return worlds.env_ops(pod, identity=member, least=least, most=gang.size, made=made)


def gate_ops(pod: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that puts HCS's gang gate on ``pod`` (none when it has it)."""
    gates = (pod.get("spec") or {}).get("schedulingGates")
    gate = {"name": vocabulary.GANG_GATE}
    if not isinstance(gates, list) or not gates:
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [gate]}]
    if any(isinstance(g, dict) and g.get("name") == vocabulary.GANG_GATE for g in gates):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": gate}]


def _priority(pod: dict[str, Any]) -> int:
    """The pod's ``spec.priority`` (0 when absent or not a whole number)."""
    found = (pod.get("spec") or {}).get("priority")
    return found if isinstance(found, int) and not isinstance(found, bool) else 0


def _identity(pod: dict[str, Any]) -> str:
    """The pod's name, or its generateName when it has none yet."""
    meta = pod.get("metadata") or {}
    return str(meta.get("name") or meta.get("generateName") or "")


def _mentions(raw: bytes, *words: bytes) -> bool:
    """Whether the JSON ``raw`` may hold one of ``words`` once decoded."""
    return any(word in raw for word in words) or _ESCAPED_NAME_CHAR.search(raw) is not None


def refusal(plan: Plan, *, asked: Mapping[str, Decimal] | None = None) -> str:
    """Why no class takes the pod, naming what it asked for (node units: VRAM in bytes)."""
    what = ", ".join(f"{key}={amount}" for key, amount in sorted((asked or {}).items()))
    head = (
        f"no accelerator class can take this pod ({what})"
        if what
        else "no accelerator class can take this pod"
    )
    parts = [f"{head}: {plan.reason or 'refused'}"]
    if not plan.quota.ok and plan.quota.reason:
        parts.append(f"quota: {plan.quota.reason}")
    shown = [f"{r.vendor}/{r.model}: {r.reason}" for r in plan.rejected[:_MAX_REJECTIONS]]
    if shown:
        more = len(plan.rejected) - len(shown)
        parts.append("rejected: " + "; ".join(shown) + (f"; and {more} more" if more else ""))
    return ". ".join(parts)


def _plan_warnings(plan: Plan) -> list[str]:
    if plan.substituted_from:
        return [f"hcs: {plan.vendor}/{plan.model} substituted for {plan.substituted_from}"]
    return []
