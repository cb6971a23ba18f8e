"""The kube-scheduler extender over HTTP (aiohttp): ``POST /filter``,
``/prioritize``, ``/bind``, ``/preempt`` with the exact JSON of
``k8s.io/kube-scheduler/extender/v1``; ``/healthz``, ``/readyz`` (200 only
after the view's replay), ``/metrics``.

Malformed arguments get HTTP 400 with the reason; a pod HCS cannot serve gets
an answer that says why (``Error`` or per-node reasons), never a 500.
Per-node fit and score parts are cached per demand and dropped for a node the
moment the view changes it, so a filter over 5,000 names is dict look-ups.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from aiohttp import web

from hcs_bus.telemetry import logger, meter, metrics_text
from scheduler import extenders as wire
from scheduler import placing
from scheduler.booking import Booker, Kube
from scheduler.caching import NodeCache
from scheduler.pods import BadPod, PlanAnnotation, PodInfo, pod_info, pod_info_from_dict
from scheduler.serving import Planner
from scheduler.viewing import ClusterView

_log = logger("hcs.scheduler.extender")
_meter = meter("hcs.scheduler")
CALLS = _meter.create_counter("hcs_extender_calls", description="extender calls by verb")
MAX_BODY = 64 * 1024 * 1024
_POD_CACHE = 10_000
_DEMAND_CACHES = 64


class Extender:
    def __init__(
        self,
        view: ClusterView,
        *,
        planner: Planner,
        booker: Booker,
        kube: Kube | None,
        weights: placing.Weights,
    ) -> None:
        self.view, self.planner, self.booker, self.kube = view, planner, booker, kube
        self.weights = weights
        self.cache = NodeCache(view.state, weights=weights)
        self.pods: OrderedDict[str, PodInfo] = OrderedDict()
        view.listeners.append(self.cache.changed)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY)
        app.router.add_post("/filter", self._guard("filter", self.filter))
        app.router.add_post("/prioritize", self._guard("prioritize", self.prioritize))
        app.router.add_post("/bind", self._guard("bind", self.bind))
        app.router.add_post("/preempt", self._guard("preempt", self.preempt))
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.router.add_get("/metrics", self.metrics)
        return app

    def _guard(
        self, verb: str, handler: Callable[[bytes], Awaitable[Any]]
    ) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handle(request: web.Request) -> web.Response:
            CALLS.add(1, {"verb": verb})
            body = await request.read()
            try:
                answer = await handler(body)
            except msgspec.MsgspecError as exc:
                _log.warning("bad_extender_args", verb=verb, error=str(exc))
                return web.Response(status=400, text=f"bad {verb} arguments: {exc}")
            except Exception as exc:  # a reason for kube-scheduler, never a bare 500
                _log.error("extender_failed", verb=verb, error=repr(exc), exc_info=exc)
                answer = _failed(verb, f"hcs: {verb} failed: {exc!r}")
                if answer is None:
                    return web.Response(status=503, text=f"hcs: {verb} failed: {exc!r}")
            return web.Response(body=wire.ENCODER.encode(answer), content_type="application/json")

        return handle

    # -- pods -------------------------------------------------------------
    def _remember(self, pod: PodInfo) -> None:
        if pod.ref.uid:
            self.pods[pod.ref.uid] = pod
            self.pods.move_to_end(pod.ref.uid)
            if len(self.pods) > _POD_CACHE:
                self.pods.popitem(last=False)

    async def _demand(self, pod: PodInfo) -> PlanAnnotation | str:
        if not self.view.ready.is_set():
            return "hcs: cluster view not replayed yet"
        return await self.planner.demand(pod)

    # -- verbs ------------------------------------------------------------
    async def filter(self, body: bytes) -> wire.ExtenderFilterResult:
        args = wire.FILTER_ARGS.decode(body)
        names = wire.node_names(args)
        try:
            pod = pod_info(args.pod)
        except BadPod as exc:
            return wire.ExtenderFilterResult(error=str(exc))
        if not pod.wants_devices:
            return wire.ExtenderFilterResult(nodes=args.nodes, node_names=args.node_names)
        self._remember(pod)
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return wire.ExtenderFilterResult(error=demand)
        passed, failed, unresolvable = self.cache.of(demand).filter(names)
        return self._filtered(args, passed, failed, unresolvable)

    def _filtered(
        self,
        args: wire.ExtenderArgs,
        passed: list[str],
        failed: dict[str, str],
        unresolvable: dict[str, str],
    ) -> wire.ExtenderFilterResult:
        if args.node_names is not None or args.nodes is None:
            return wire.ExtenderFilterResult(
                node_names=passed, failed=failed, unresolvable=unresolvable
            )
        keep = set(passed)
        items = [
            raw
            for raw, name in zip(args.nodes.items, wire.node_names(args), strict=True)
            if name in keep
        ]
        nodes = wire.NodeList(items=items, metadata=args.nodes.metadata)
        return wire.ExtenderFilterResult(nodes=nodes, failed=failed, unresolvable=unresolvable)

    async def prioritize(self, body: bytes) -> list[wire.HostPriority] | msgspec.Raw:
        args = wire.FILTER_ARGS.decode(body)
        names = wire.node_names(args)
        try:
            pod = pod_info(args.pod)
        except BadPod:
            pod = None
        if pod is None or not pod.wants_devices:
            return [wire.HostPriority(host=n, score=0) for n in names]
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return [wire.HostPriority(host=n, score=0) for n in names]
        cache = self.cache.of(demand)
        groups = self.cache.job_groups(pod)
        if demand.devices == 1 and groups is None:
            return msgspec.Raw(cache.plain_scores(names))
        return cache.scores(names, job_groups=groups)

    async def bind(self, body: bytes) -> wire.ExtenderBindingResult:
        args = wire.BIND_ARGS.decode(body)
        pod = await self._bound_pod(args)
        if isinstance(pod, str):
            return wire.ExtenderBindingResult(error=pod)
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return wire.ExtenderBindingResult(error=demand)
        error = await self.booker.bind(pod, demand, node=args.node)
        if not error:
            self.pods.pop(pod.ref.uid, None)
        return wire.ExtenderBindingResult(error=error)

    async def _bound_pod(self, args: wire.ExtenderBindingArgs) -> PodInfo | str:
        held = self.pods.get(args.pod_uid)
        if held is not None:
            return held
        if self.kube is None:
            return f"hcs: pod {args.pod_namespace}/{args.pod_name} was never filtered here"
        try:
            pod = pod_info_from_dict(await self.kube.get_pod(args.pod_namespace, args.pod_name))
        except Exception as exc:  # Kube* errors and BadPod alike end this bind
            return f"hcs: cannot read pod {args.pod_namespace}/{args.pod_name}: {exc}"
        if not pod.wants_devices:
            return f"hcs: pod {args.pod_namespace}/{args.pod_name} asks for no ai.compute devices"
        return pod

    async def preempt(self, body: bytes) -> wire.ExtenderPreemptionResult:
        args = wire.PREEMPT_ARGS.decode(body)
        candidates = args.candidates()
        try:
            pod = pod_info(args.pod)
        except BadPod:
            return wire.ExtenderPreemptionResult()
        if not pod.wants_devices:
            return wire.ExtenderPreemptionResult(meta_victims=candidates)
        demand = await self._demand(pod)
        if isinstance(demand, str):
            return wire.ExtenderPreemptionResult()
        out: dict[str, wire.MetaVictims] = {}
        for name, victims in candidates.items():
            node = self.view.state.nodes.get(name)
            if node is None or not node.schedulable:
                continue
            already = {p.uid for p in victims.pods}
            extra = placing.victims_for(
                node,
                self.view.state.reservations_of(name),
                demand,
                priority=pod.priority,
                already=already,
            )
            if extra is None:
                continue
            pods = [
                *victims.pods,
                *(wire.MetaPod(uid=r.pod.uid) for r in extra if r.pod.uid not in already),
            ]
            out[name] = wire.MetaVictims(pods=pods, pdb_violations=victims.pdb_violations)
        return wire.ExtenderPreemptionResult(meta_victims=out)

    # -- probes -----------------------------------------------------------
    async def healthz(self, _request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def readyz(self, _request: web.Request) -> web.Response:
        if self.view.ready.is_set():
            return web.Response(text="ready")
        return web.Response(status=503, text="cluster view still replaying")

    async def metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=metrics_text(), content_type="text/plain")


def _failed(
    verb: str, reason: str
) -> wire.ExtenderFilterResult | wire.ExtenderBindingResult | None:
    """The answer carrying ``reason`` for verbs whose result has an ``Error``."""
    if verb == "filter":
        return wire.ExtenderFilterResult(error=reason)
    if verb == "bind":
        return wire.ExtenderBindingResult(error=reason)
    return None


async def serve(app: web.Application, *, host: str, port: int) -> web.AppRunner:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    _log.info("extender_listening", host=host, port=port)
    return runner
