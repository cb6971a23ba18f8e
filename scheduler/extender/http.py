"""The kube-scheduler extender over HTTP (aiohttp): ``POST /filter``,
``/prioritize``, ``/bind``, ``/preempt`` with the exact JSON of
``k8s.io/kube-scheduler/extender/v1``; ``/healthz``, ``/readyz`` (200 only
after the view's replay and while the ledger's stream has a leader:
``Booker.quorum``), ``/metrics``.

Callers: HTTPS (``server_tls``) where kube-scheduler presents a client
certificate chaining to ``scheduler.extender_client_ca_file`` and naming one
of ``extender_client_names`` (``client_certificates``: 401 without one, 403
for another name; the probes need none). Plain HTTP on loopback only.
Over HTTPS a client that offers HTTP/2 by ALPN (kube-scheduler does) gets it
(``scheduler.extender.http2``, ``scheduler.extender_http2``): every call on
one connection, where HTTP/1.1 cost kube-scheduler's parallel binds a new
mutual-TLS handshake each; the answers are the same either way (``http2``).

Malformed arguments get HTTP 400 with the reason; a pod HCS cannot serve gets
an answer that says why, never a 500. A pod no node could ever hold (it
cannot be read, its plan is refused, it needs more devices than any node
has, its class is absent) gets ``FailedAndUnresolvableNodes`` with the
reason per node; one that could fit after preemption gets ``FailedNodes``;
``Error`` is kept for HCS's own trouble (view not replayed, internal failure).
Per-node fit and score parts are cached per demand and dropped for a node the
moment the view changes it, so a filter over 5,000 names is dict look-ups.

Hostile input: the caches are bounded (``scheduler.extender.caches``); bodies over
``max_body_bytes`` (decoded size, under any ``Content-Encoding``) get 413 with
the limit; undecodable ones (bad gzip, bad JSON) 400, each counted in
``hcs_extender_refusals`` by verb and reason; name lists
and victim maps are walked in chunks of ``CHUNK`` that yield to the event loop,
so plan requests and other calls keep being answered during a 500k-name
filter. A quantity no pod could ask for (``1e400``, ``nan``, an exponent past
any number) is the pod's fault, not the envelope's: kube-scheduler wants
HTTP 200 for that (docs/architecture.md#kubernetes-wire-facts), so filter answers ``FailedAndUnresolvableNodes``
naming the resource, prioritize scores 0, preempt proposes nothing and bind
answers ``Error`` with the reason.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from typing import Any, NamedTuple

import msgspec
from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from hcs_bus import httpbodies, tls, units
from hcs_bus.errors import ConfigError
from hcs_bus.settings import SchedulerSettings
from hcs_bus.telemetry import SECONDS_BUCKETS, TallyCounter, logger, meter, metrics_text
from scheduler.extender import caches as caching
from scheduler.extender import http2, wire
from scheduler.extender import rules as placing
from scheduler.extender.caches import NodeCache, Picks, PodMemo
from scheduler.ledger.reservation_store import Booker, Kube
from scheduler.plan import gang_records as gangs
from scheduler.plan.pods import (
    BadPod,
    PlanAnnotation,
    PodInfo,
    PodObject,
    pod_info,
    pod_info_from_dict,
)
from scheduler.plan.service import Planner
from scheduler.view.follow_loop import ClusterView
from scheduler.view.state import pod_key

_log = logger("hcs.scheduler.extender")
_meter = meter("hcs.scheduler")
CALLS = TallyCounter(
    "hcs_extender_calls", description="extender calls by verb", meter_name="hcs.scheduler"
)
REFUSALS = _meter.create_counter(
    "hcs_extender_refusals", description="extender calls refused (HTTP 4xx), by verb and reason"
)
GANGS_SPARED = _meter.create_counter(
    "hcs_extender_gangs_spared",
    description="preemption candidate nodes dropped: their victims would take part of a gang",
)
SECONDS = _meter.create_histogram(
    "hcs_extender_seconds",
    unit="s",
    description="time to answer one extender call, its body read, by verb",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
MAX_BODY = 32 * 1024 * 1024  # nodeCacheCapable: 5,000 names are ~150 KiB
CHUNK = 4096  # names handled between two yields to the event loop
MAX_PICK_TRIES = 8  # nodes passed over for pods picked there before a filter gives up


class Extender:
    def __init__(
        self,
        view: ClusterView,
        *,
        planner: Planner,
        booker: Booker,
        kube: Kube | None,
        weights: placing.Weights,
        pick_in_filter: bool = False,
    ) -> None:
        self.view, self.planner, self.booker, self.kube = view, planner, booker, kube
        self.weights, self.pick_in_filter = weights, pick_in_filter
        self.cache = NodeCache(view.state, weights=weights)
        self.pods = PodMemo()
        self.picks = Picks()
        view.listeners.append(self.cache.changed)

    def app(self, *, max_body_bytes: int = MAX_BODY) -> web.Application:
        app = web.Application(client_max_size=max_body_bytes)
        for verb, handler in [
            ("filter", self.filter),
            ("prioritize", self.prioritize),
            ("bind", self.bind),
            ("preempt", self.preempt),
        ]:
            app.router.add_post(f"/{verb}", self._guard(verb, handler, limit=max_body_bytes))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        return app

    def _guard(
        self, verb: str, handler: Callable[[bytes], Awaitable[Any]], *, limit: int
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            CALLS.add(1, {"verb": verb})
            started = time.perf_counter()
            try:
                return await self._answer(
                    verb, handler, await httpbodies.read_body(request, limit=limit)
                )
            finally:
                SECONDS.record(time.perf_counter() - started, {"verb": verb})

        return handle

    def http2(
        self, *, allowed: Collection[str] | None
    ) -> Callable[[http2.Request], Awaitable[web.Response]]:
        """The answer to one HTTP/2 request (``scheduler.extender.http2``):
        what the aiohttp application answers the same request, the client
        certificate checked as ``client_certificates`` does (``allowed``;
        None: no check)."""
        verbs = {
            "/filter": ("filter", self.filter),
            "/prioritize": ("prioritize", self.prioritize),
            "/bind": ("bind", self.bind),
            "/preempt": ("preempt", self.preempt),
        }
        probes = {"/healthz": self.healthz, "/readyz": self.readyz, "/metrics": self.metrics}
        wanted = frozenset(allowed) if allowed is not None else None

        async def answer(request: http2.Request) -> web.Response:
            if wanted is not None and request.path not in OPEN_PATHS:
                refused = caller_refusal(request.path, request.peer_names, wanted=wanted)
                if refused is not None:
                    return _refused_response(request.path, request.peer_names, refused)
            verb = verbs.get(request.path)
            if verb is not None and request.method == "POST":
                CALLS.add(1, {"verb": verb[0]})
                started = time.perf_counter()
                try:
                    return await self._answer(verb[0], verb[1], request.body)
                finally:
                    SECONDS.record(time.perf_counter() - started, {"verb": verb[0]})
            probe = probes.get(request.path)
            if probe is not None and request.method == "GET":
                return await probe(None)
            if verb is not None or probe is not None:
                return web.Response(status=405, text=f"{request.method} not allowed here")
            return web.Response(status=404, text="404: Not Found")

        return answer

    async def _answer(
        self,
        verb: str,
        handler: Callable[[bytes], Awaitable[Any]],
        body: bytes | httpbodies.Refusal,
    ) -> web.Response:
        """One verb's answer to a body read (or refused) from either protocol."""
        if isinstance(body, httpbodies.Refusal):
            _log.warning("extender_body_refused", verb=verb, reason=body.reason, error=body.message)
            REFUSALS.add(1, {"verb": verb, "reason": body.reason})
            return body._replace(message=f"hcs: {verb}: {body.message}").response()
        try:
            answer = await handler(body)
        except msgspec.MsgspecError as exc:
            _log.warning("bad_extender_args", verb=verb, error=str(exc))
            REFUSALS.add(1, {"verb": verb, "reason": "bad_arguments"})
            return web.Response(status=400, text=f"bad {verb} arguments: {exc}")
        except Exception as exc:  # a reason for kube-scheduler, never a bare 500
            _log.error("extender_failed", verb=verb, error=repr(exc), exc_info=exc)
            answer = _failed(verb, f"hcs: {verb} failed: {exc!r}")
            if answer is None:
                return web.Response(status=503, text=f"hcs: {verb} failed: {exc!r}")
        return web.Response(body=wire.ENCODER.encode(answer), content_type="application/json")

    # -- pods -------------------------------------------------------------
    def _remember(self, pod: PodInfo) -> None:
        if pod.ref.uid:
            self.pods.put(pod.ref.uid, pod)

    async def _demand(self, pod: PodInfo) -> PlanAnnotation | str:
        if not self.view.ready.is_set():
            return "hcs: cluster view not replayed yet"
        return await self.planner.demand(pod)

    # -- verbs ------------------------------------------------------------
    async def filter(self, body: bytes) -> wire.ExtenderFilterResult:
        args = wire.decode(wire.FILTER_ARGS, body)
        names = await _node_names(args)
        try:
            pod = read_pod(args.pod)
        except BadPod as exc:  # no node will ever hold a pod HCS cannot read
            return self._filtered(args, names, [], {}, nowhere(names, f"hcs: {exc}"))
        if not pod.wants_devices:
            return wire.ExtenderFilterResult(nodes=args.nodes, node_names=args.node_names)
        self._remember(pod)
        if not self.view.ready.is_set():  # ours, not the pod's: kube-scheduler retries
            return wire.ExtenderFilterResult(error="hcs: cluster view not replayed yet")
        demand = await self.planner.demand(pod)
        if isinstance(demand, str):  # a planning refusal: neither capacity nor preemption helps
            return self._filtered(args, names, [], {}, nowhere(names, demand))
        cache = self.cache.of(demand)
        plain = self._plain(pod, demand) and not self._gangs_pledged()
        if self.pick_in_filter and not pod.kube_scores and plain:
            best = cache.best_if_all_fit(names)  # every node fits: the common answer
            if best is not None:
                best = await self._picked(pod, cache, demand, names, best)
                return self._filtered(args, names, [best], {}, {})
        passed: list[str] = []
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        async for part in _chunks(names):
            ok, no, never = cache.filter(part)
            passed += ok
            failed.update(no)
            unresolvable.update(never)
        passed = self._keep_job_together(pod, passed, failed)
        passed = self._gang_room(args.pod, demand, passed, failed)
        if self.pick_in_filter and not pod.kube_scores and passed:
            first = passed[0] if len(passed) == 1 else await self._best(pod, cache, passed)
            passed = [await self._picked(pod, cache, demand, passed, first)]
        return self._filtered(args, names, passed, failed, unresolvable)

    async def _picked(
        self,
        pod: PodInfo,
        cache: caching.DemandCache,
        demand: PlanAnnotation,
        names: list[str],
        first: str,
    ) -> str:
        """``first``; or, when the pods picked for it a moment ago and not
        booked there yet would leave no room for this one, the best of
        ``names`` they leave room on (``first`` again if none). Remembered
        as this pod's pick until it is booked. Under ``spread`` the picks
        count as placed when ``first`` is chosen (``_emptiest_after_picks``)."""
        if self.weights.spread and self._plain(pod, demand):
            first = self._emptiest_after_picks(pod, cache, names, first)
        tried: set[str] = set()
        best = first
        while not self._room_after_picks(pod, best, demand):
            tried.add(best)
            rest = [n for n in names if n not in tried]
            if not rest or len(tried) >= MAX_PICK_TRIES:
                best = first
                break
            best = await self._best(pod, cache, rest)
        self.picks.add(pod.ref.uid, pod_key(pod.ref.namespace, pod.ref.name), best, demand)
        return best

    def _emptiest_after_picks(
        self, pod: PodInfo, cache: caching.DemandCache, names: list[str], first: str
    ) -> str:
        """The node of ``names`` that ranks highest once the pods picked for
        each and not booked yet count as placed there (``first``, the best by
        cached ranks, when none is picked for it). kube-scheduler binds in the
        background and hands each pod the nodes in the same order, so without
        this a burst's pods all go to one emptiest node until their bookings
        land: pack, not spread."""
        top = self._rank_after_picks(pod, cache, first)
        if top == cache.kept_ranks.get(first):
            return first
        best = first
        for name in names:
            cached = cache.kept_ranks.get(name)
            if cached is None or cached <= top or name == first:
                continue  # picks only lower a rank under spread: it cannot win
            found = self._rank_after_picks(pod, cache, name)
            if found > top:
                best, top = name, found
        return best

    def _rank_after_picks(self, pod: PodInfo, cache: caching.DemandCache, name: str) -> float:
        """``name``'s rank (``placing.ranked``) once the pods picked for it count as placed."""
        entry = cache.entry(name)
        node = self.view.state.nodes.get(name)
        if entry.parts is None or node is None:
            return -1.0
        others = self.picks.on(name, besides=pod.ref.uid, booked=node.reservations.__contains__)
        if not others:
            return entry.rank
        parts = placing.with_others(node, entry.parts, cache.demand, others)
        return placing.ranked(parts, weights=self.weights)[1]

    def _room_after_picks(self, pod: PodInfo, name: str, demand: PlanAnnotation) -> bool:
        node = self.view.state.nodes.get(name)
        if node is None:
            return True
        others = self.picks.on(name, besides=pod.ref.uid, booked=node.reservations.__contains__)
        if not others:
            return True
        doc = self.view.state.reservations_of(name)
        return placing.fits_with_picks(node, doc, others, demand)

    async def _best(self, pod: PodInfo, cache: caching.DemandCache, passed: list[str]) -> str:
        """The node ``prioritize`` would score highest (the first of a tie, in
        kube-scheduler's order, which it rotates from pod to pod). Answered
        alone, kube-scheduler takes it without scoring (a single feasible node)
        and never calls prioritize; the other fitting nodes are left out, not
        failed, so no reason is invented for them."""
        if self._plain(pod, cache.demand):
            return cache.best(passed)
        scores = await self._scores(pod, cache, passed)
        return passed[scores.index(max(scores))]

    def _plain(self, pod: PodInfo, demand: PlanAnnotation) -> bool:
        """Whether each node's score for ``pod`` is its cached one: a single
        device, and no job of the pod's placed yet (no links or groups to weigh)."""
        return demand.devices == 1 and self.cache.job_groups(pod) is None

    async def _scores(
        self, pod: PodInfo, cache: caching.DemandCache, names: list[str]
    ) -> list[int]:
        """The score of each of ``names`` for ``pod`` (0..10, as prioritize gives)."""
        groups = self.cache.job_groups(pod)
        if cache.demand.devices == 1 and groups is None:
            out: list[int] = []
            async for part in _chunks(names):
                out += [cache.entry(n).score for n in part]
            return out
        parts: list[placing.Components | None] = []
        async for part in _chunks(names):
            parts += cache.parts_of(part)
        best = caching.best_gbps(parts)
        scored: list[int] = []
        async for start in _chunk_starts(len(names)):
            end = start + CHUNK
            found = cache.scored(
                names[start:end], parts[start:end], best_gbps=best, job_groups=groups
            )
            scored += [h.score for h in found]
        return scored

    def _keep_job_together(
        self, pod: PodInfo, passed: list[str], failed: dict[str, str]
    ) -> list[str]:
        """A job whose pods already run in some network groups keeps to them while
        a node there fits; only when none does may it spill into another group."""
        groups = self.cache.job_groups(pod)
        if not groups:
            return passed
        nodes = self.view.state.nodes
        inside = [n for n in passed if n in nodes and placing.network_group(nodes[n]) in groups]
        if not inside:
            return passed
        where = ", ".join(sorted(groups))
        for name in passed:
            if name not in inside:
                failed[name] = f"hcs: job {pod.job} runs in network group {where}, which has room"
        return inside

    def _gangs_pledged(self) -> bool:
        pledger = self.planner.pledger
        return pledger is not None and any(r.state == "pledged" for r, _ in pledger.gangs.all())

    def _gang_room(
        self,
        raw: PodObject,
        demand: PlanAnnotation,
        passed: list[str],
        failed: dict[str, str],
    ) -> list[str]:
        """A member of a pledged gang passes only on its rank's node; any
        other pod only where it fits beside the ranks pledged gangs planned
        there and have not booked yet (``scheduler.plan.gang_records``)."""
        pledger = self.planner.pledger
        if pledger is None or not passed:
            return passed
        notes = raw.metadata.annotations or {}
        own = gangs.key_of_run(notes[gangs.GANG]) if notes.get(gangs.GANG) else ""
        found = pledger.gangs.get(own) if own else None
        rank = found[0].rank_of(raw.metadata.name) if found is not None else None
        if rank is not None:
            for name in passed:
                if name != rank.node:
                    failed[name] = f"hcs: gang {notes[gangs.GANG]} planned this rank on {rank.node}"
            return [n for n in passed if n == rank.node]
        state = self.view.state
        on: dict[str, list[PlanAnnotation]] = {}
        for record, _ in pledger.gangs.all():
            if record.key == own or record.state != "pledged":
                continue
            for r in record.ranks:
                node = state.nodes.get(r.node)
                if node is not None and pod_key(record.namespace, r.pod) not in node.reservations:
                    on.setdefault(r.node, []).append(gangs.demand_of(r))
        if not on:
            return passed
        kept = []
        for name in passed:
            node, others = state.nodes.get(name), on.get(name)
            if node is None or not others:
                kept.append(name)
            elif placing.fits_with_picks(node, state.reservations_of(name), others, demand):
                kept.append(name)
            else:
                failed[name] = "hcs: the devices left here are planned for a pledged gang"
        return kept

    def _filtered(
        self,
        args: wire.ExtenderArgs,
        names: list[str],
        passed: list[str],
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> wire.ExtenderFilterResult:
        if args.node_names is not None or args.nodes is None:
            return wire.ExtenderFilterResult(
                node_names=passed, failed=failed, unresolvable=unresolvable
            )
        keep = set(passed)
        items = [raw for raw, name in zip(args.nodes.items, names, strict=True) if name in keep]
        nodes = wire.NodeList(items=items, metadata=args.nodes.metadata)
        return wire.ExtenderFilterResult(nodes=nodes, failed=failed, unresolvable=unresolvable)

    async def prioritize(self, body: bytes) -> list[wire.HostPriority] | msgspec.Raw:
        args = wire.decode(wire.FILTER_ARGS, body)
        names = await _node_names(args)
        try:
            pod = read_pod(args.pod)
        except BadPod:
            pod = None
        if pod is None or not pod.wants_devices:
            return [wire.HostPriority(host=n, score=0) for n in names]
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return [wire.HostPriority(host=n, score=0) for n in names]
        cache = self.cache.of(demand)
        if self._plain(pod, demand):
            whole = cache.plain_scores_if_all_fit(names)
            if whole is not None:
                return msgspec.Raw(whole)
            fragments: list[bytes] = []
            async for part in _chunks(names):
                fragments += cache.plain_fragments(part)
            return msgspec.Raw(b"[" + b",".join(fragments) + b"]")
        scores = await self._scores(pod, cache, names)
        return [wire.HostPriority(host=n, score=s) for n, s in zip(names, scores, strict=True)]

    async def bind(self, body: bytes) -> wire.ExtenderBindingResult:
        args = wire.decode(wire.BIND_ARGS, body)
        pod = await self._bound_pod(args)
        if isinstance(pod, str):
            return wire.ExtenderBindingResult(error=pod)
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return wire.ExtenderBindingResult(error=demand)
        error = await self.booker.bind(pod, demand, node=args.node)
        if error:
            self.picks.drop(pod.ref.uid)
        else:  # its pick lasts until the view holds the reservation
            self.pods.pop(pod.ref.uid)
        return wire.ExtenderBindingResult(error=error)

    async def _bound_pod(self, args: wire.ExtenderBindingArgs) -> PodInfo | str:
        held = self.pods.get(args.pod_uid)
        if held is not None:
            return held
        if self.kube is None:
            return f"hcs: pod {args.pod_namespace}/{args.pod_name} was never filtered here"
        try:
            pod = read_pod_dict(await self.kube.get_pod(args.pod_namespace, args.pod_name))
        except Exception as exc:  # Kube* errors and BadPod alike end this bind
            return f"hcs: cannot read pod {args.pod_namespace}/{args.pod_name}: {exc}"
        if not pod.wants_devices:
            return f"hcs: pod {args.pod_namespace}/{args.pod_name} asks for no ai.compute devices"
        return pod

    async def preempt(self, body: bytes) -> wire.ExtenderPreemptionResult:
        args = wire.decode(wire.PREEMPT_ARGS, body)
        candidates = args.candidates()
        try:
            pod = read_pod(args.pod)
        except BadPod:
            return wire.ExtenderPreemptionResult()
        if not pod.wants_devices:
            return wire.ExtenderPreemptionResult(meta_victims=candidates)
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return wire.ExtenderPreemptionResult()
        out: dict[str, wire.MetaVictims] = {}
        members = self._gang_members()
        ganged = {p for pods in members.values() for p in pods}
        for count, (name, victims) in enumerate(candidates.items(), start=1):
            if count % CHUNK == 0:
                await asyncio.sleep(0)
            node = self.view.state.nodes.get(name)
            if node is None or not node.schedulable:
                continue
            doc = self.view.state.reservations_of(name)
            keys = {
                r.pod.uid: f"{r.pod.namespace}/{r.pod.name}"
                for r in (doc.reservations if doc else ())
            }
            already = {p.uid for p in victims.pods}
            extra = placing.victims_for(
                node,
                doc,
                demand,
                priority=pod.priority,
                already=already,
                spared={uid for uid, key in keys.items() if key in ganged},
            )
            if extra is None:
                continue
            pods = [
                *victims.pods,
                *(wire.MetaPod(uid=r.pod.uid) for r in extra if r.pod.uid not in already),
            ]
            split = placing.split_gang({keys[p.uid] for p in pods if p.uid in keys}, members)
            if split:
                GANGS_SPARED.add(1)
                _log.info("preemption_would_split_gang", node=name, gang=split, pod=pod.ref.name)
                continue
            out[name] = wire.MetaVictims(pods=pods, pdb_violations=victims.pdb_violations)
        return wire.ExtenderPreemptionResult(meta_victims=out)

    def _gang_members(self) -> dict[str, frozenset[str]]:
        """The member pods (namespace/name) of each pledged gang, by its key."""
        pledger = self.planner.pledger
        if pledger is None:
            return {}
        return {
            record.key: frozenset(f"{record.namespace}/{r.pod}" for r in record.ranks)
            for record, _ in pledger.gangs.all()
            if record.state == "pledged"
        }

    # -- probes -----------------------------------------------------------
    async def healthz(self, _request: web.Request | None) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _request: web.Request | None) -> web.Response:
        if not self.view.ready.is_set():
            return web.Response(status=503, text="cluster view still replaying")
        if refusal := self.booker.quorum_lost():
            return web.Response(status=503, text=refusal)
        return web.Response(text="ready")

    async def metrics(self, _request: web.Request | None) -> web.Response:
        return web.Response(body=metrics_text(), content_type="text/plain")


def read_pod(pod: PodObject) -> PodInfo:
    """``pod_info``, with every way a quantity can be absurd (an exponent past
    what ``decimal`` holds among them) a ``BadPod`` naming the resource."""
    try:
        return pod_info(pod)
    except ArithmeticError as exc:
        raise BadPod(_out_of_range(pod)) from exc


def read_pod_dict(pod: dict[str, Any]) -> PodInfo:
    try:
        return pod_info_from_dict(pod)
    except ArithmeticError as exc:
        raise BadPod(_out_of_range(msgspec.convert(pod, PodObject, strict=False))) from exc


def _out_of_range(pod: PodObject) -> str:
    """Which ``ai.compute/*`` quantity of ``pod`` no number can hold, in words."""
    spec = pod.spec
    for field, items in (("initContainers", spec.init_containers), ("containers", spec.containers)):
        for index, container in enumerate(items):
            for part, amounts in (container.resources or {}).items():
                for key, value in (amounts if isinstance(amounts, dict) else {}).items():
                    if _overflows(value):
                        where = f"spec.{field}[{index}].resources.{part}.{key}"
                        return f"{where}: {value!r:.60} is out of range for a quantity"
    return "a quantity in the pod's ai.compute requests is out of range"


def _overflows(value: object) -> bool:
    try:
        units.parse_quantity(value)  # type: ignore[arg-type]  # any JSON may be here
    except ArithmeticError:
        return True
    except Exception:  # not a quantity at all: someone else's reason
        return False
    return False


async def _chunk_starts(total: int) -> AsyncIterator[int]:
    """0, CHUNK, 2×CHUNK… below ``total``, yielding to the event loop between them."""
    for start in range(0, total, CHUNK):
        if start:
            await asyncio.sleep(0)
        yield start


async def _chunks(names: list[str]) -> AsyncIterator[list[str]]:
    async for start in _chunk_starts(len(names)):
        yield names[start : start + CHUNK]


async def _node_names(args: wire.ExtenderArgs) -> list[str]:
    """``wire.node_names`` without holding the loop over a long ``Nodes`` list."""
    if args.node_names is not None or args.nodes is None:
        return wire.node_names(args)
    items = args.nodes.items
    names: list[str] = []
    async for start in _chunk_starts(len(items)):
        names += wire.raw_node_names(items[start : start + CHUNK])
    return names


def nowhere(names: list[str], reason: str) -> dict[str, str]:
    """``FailedAndUnresolvableNodes`` for a pod no node could ever hold: the
    reason on every node, so kube-scheduler neither preempts for it nor calls
    it an error (the pod stays Pending with the reason in its event)."""
    return dict.fromkeys(names, reason)


def _failed(
    verb: str, reason: str
) -> wire.ExtenderFilterResult | wire.ExtenderBindingResult | None:
    """The answer carrying ``reason`` for verbs whose result has an ``Error``."""
    if verb == "filter":
        return wire.ExtenderFilterResult(error=reason)
    if verb == "bind":
        return wire.ExtenderBindingResult(error=reason)
    return None


# -- serving: HTTPS, and kube-scheduler's client certificate -------------------
OPEN_PATHS = frozenset({"/healthz", "/readyz"})  # the kubelet's probes carry no certificate
VERBS = frozenset({"filter", "prioritize", "bind", "preempt", "metrics"})


def server_tls(cfg: SchedulerSettings) -> tls.ReloadingTls | None:
    """The extender's HTTPS context from ``cfg`` (its client CA too), or None
    for plain HTTP, which only a loopback ``extender_host`` may serve: off
    loopback a server certificate and a client CA are required."""
    pair = (cfg.extender_cert_file, cfg.extender_key_file)
    if any(pair) and not all(pair):
        raise ConfigError("scheduler.extender_cert_file and extender_key_file go together")
    if cfg.extender_client_names and not cfg.extender_client_ca_file:
        raise ConfigError(
            "scheduler.extender_client_names needs extender_client_ca_file "
            "(the CA that signs kube-scheduler's client certificate)"
        )
    if cfg.extender_client_ca_file and not all(pair):
        raise ConfigError("scheduler.extender_client_ca_file needs extender_cert_file (HTTPS)")
    if not tls.is_loopback(cfg.extender_host) and not cfg.extender_client_ca_file:
        raise ConfigError(
            f"scheduler.extender_host {cfg.extender_host} is not loopback: the extender "
            "takes binds there only over mutual TLS (set extender_cert_file, "
            "extender_key_file and extender_client_ca_file)"
        )
    if cfg.extender_cert_file and cfg.extender_key_file:
        return tls.server_context(
            cfg.extender_cert_file,
            cfg.extender_key_file,
            client_ca_file=cfg.extender_client_ca_file,
            settings="scheduler.extender_cert_file, extender_key_file, extender_client_ca_file",
        )
    return None


def client_certificates(*, allowed: Collection[str]) -> Middleware:
    """Only a caller with a verified client certificate (``server_tls``
    checked its chain) that names one of ``allowed`` (any, when empty)
    reaches a verb or ``/metrics``; the probes stay open. A caller without
    one gets 401, one with another name 403: each logged and counted in
    ``hcs_extender_refusals``."""
    wanted = frozenset(allowed)

    @web.middleware
    async def admit(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        transport = request.transport
        names = tls.peer_names(transport.get_extra_info("peercert") if transport else None)
        refused = caller_refusal(request.path, names, wanted=wanted)
        if refused is not None:
            return _refused_response(request.path, names, refused, peer=request.remote)
        return await handler(request)

    return admit


class CallerRefusal(NamedTuple):
    status: int
    reason: str
    text: str


def caller_refusal(
    path: str, names: Collection[str], *, wanted: frozenset[str]
) -> CallerRefusal | None:
    """Why a caller whose verified client certificate names ``names`` may
    not call ``path`` (401: none, 403: none of ``wanted``), or None."""
    if path in OPEN_PATHS:
        return None
    if not names:
        text = (
            "hcs: the extender serves kube-scheduler only: present its client "
            "certificate (tlsConfig certFile and keyFile of the extender entry)"
        )
        return CallerRefusal(401, "no_client_certificate", text)
    if wanted and not set(names) & wanted:
        text = (
            f"hcs: client certificate for {sorted(names)} is not one of "
            f"scheduler.extender_client_names {sorted(wanted)}"
        )
        return CallerRefusal(403, "client_not_allowed", text)
    return None


def _refused_response(
    path: str, names: Collection[str], refused: CallerRefusal, *, peer: str | None = None
) -> web.Response:
    """The refusal's answer, logged once and counted in ``hcs_extender_refusals``."""
    verb = path.strip("/")
    verb = verb if verb in VERBS else "other"
    _log.warning(
        "extender_caller_refused", verb=verb, reason=refused.reason, peer=peer, names=sorted(names)
    )
    REFUSALS.add(1, {"verb": verb, "reason": refused.reason})
    return web.Response(status=refused.status, text=refused.text)


async def serve(
    app: web.Application,
    *,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    http2_answer: http2.Answer | None = None,
    max_body_bytes: int = MAX_BODY,
) -> web.AppRunner:
    """Serve ``app``; over TLS with ``http2_answer`` (``Extender.http2``) a
    client that offers HTTP/2 (kube-scheduler) is served on it."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site: web.TCPSite
    if http2_answer is not None and ssl_context is not None:
        site = http2.Http2Site(
            runner,
            host,
            port,
            ssl_context=ssl_context,
            answer=http2_answer,
            max_body_bytes=max_body_bytes,
        )
    else:
        site = web.TCPSite(runner, host, port, ssl_context=ssl_context)
    await site.start()
    scheme = "https" if ssl_context is not None else "http"
    if ssl_context is None:
        _log.warning("extender_plain_http", host=host, port=port, note="loopback only")
    _log.info(
        "extender_listening",
        host=host,
        port=port,
        scheme=scheme,
        http2=isinstance(site, http2.Http2Site),
    )
    return runner
