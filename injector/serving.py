"""The webhook server: HTTPS ``/mutate`` (AdmissionReview v1), ``/healthz``,
``/readyz`` (bus connected) and ``/metrics``.

``Injector(bus, settings).start()`` serves on ``settings.injector.host:port``
with the certificate files ``cert_file``/``key_file``, reloaded when they
change. Plans come over the bus: ``hcs.place`` (pledging) or ``hcs.place.dry``
(an admission dry run). Never answers 500: bad
envelopes and bodies that are not what their ``Content-Encoding`` says get 400
with a text message, oversized bodies (decoded size included) 413, everything
else an AdmissionReview. Every refusal, of a body or of a pod, is counted in
``hcs_injector_refusals`` by reason.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
import time
from typing import Any

from aiohttp import web

from hcs_bus import httpbodies, subjects, tasks
from hcs_bus.bus import Bus
from hcs_bus.errors import ConfigError
from hcs_bus.kube import Kube
from hcs_bus.messages import Plan, PlanRequest
from hcs_bus.settings import Settings
from hcs_bus.telemetry import SECONDS_BUCKETS, TallyCounter, logger, meter, metrics_text, zero_init
from injector import rebinds as rebinding
from injector import runtimes
from injector.admitting import Admitter, Planner
from injector.mutations import Context
from injector.owning import Owners
from injector.reviews import Answer
from injector.tls import ReloadingTls

_log = logger("hcs.injector")
_meter = meter("hcs.injector")
ADMISSIONS = zero_init(
    TallyCounter(
        "hcs_injector_admissions", description="admission answers", meter_name="hcs.injector"
    ),
    {"result": "allowed"},
)
REFUSALS = zero_init(
    _meter.create_counter(
        "hcs_injector_refusals", description="admissions refused (pods and bodies), by reason"
    ),
    {"reason": "privileged"},
    {"reason": "reserved_annotation"},
    {"reason": "plan_unavailable"},  # no plan within the budget (503 under fail-closed)
)
LATENCY = _meter.create_histogram(
    "hcs_injector_admission_seconds",
    unit="s",
    description="time to answer one admission",
    explicit_bucket_boundaries_advisory=SECONDS_BUCKETS,
)
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m)$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0}
API_SERVER_MARGIN_S = 0.5


def bus_planner(bus: Bus) -> Planner:
    async def plan(request: PlanRequest, timeout_s: float) -> Plan:
        subject = subjects.place(dry_run=request.dry_run)  # hcs.place pledges, .dry does not
        return await bus.request(subject, request, Plan, timeout_s=timeout_s)

    return plan


class Injector:
    """The admission webhook; ``start()`` then ``stop()``."""

    def __init__(
        self,
        bus: Bus | None,
        settings: Settings,
        *,
        planner: Planner | None = None,
        ssl_context: ssl.SSLContext | None = None,
        reload_interval_s: float = 2.0,
        kube: Kube | None = None,
    ) -> None:
        if planner is None and bus is None:
            raise ConfigError("the injector needs a bus (or a planner)")
        self.bus = bus
        self.settings = settings
        self.reload_interval_s = reload_interval_s
        conf = settings.injector
        self.tls: ReloadingTls | None = None
        if conf.cert_file and conf.key_file:
            self.tls = ReloadingTls(conf.cert_file, conf.key_file)
        elif ssl_context is None:
            raise ConfigError("injector.cert_file and injector.key_file are required (HTTPS)")
        self.ssl_context = ssl_context or (self.tls.context if self.tls else None)
        self._fallback_key = [os.urandom(32)]
        ctx = Context(
            runtimes=runtimes.load(),
            rebinding=rebinding.load(),
            scheduler_name=conf.scheduler_name,
            interceptor_host_path=conf.interceptor_host_path,
        )
        self.admitter = Admitter(
            settings=conf,
            planner=planner or bus_planner(bus),  # type: ignore[arg-type]
            ctx=ctx,
            keys=self._keys,
            owners=(
                Owners(kube.get_job, get_pod_group=kube.get_pod_group, clock=time.monotonic)
                if kube is not None
                else None
            ),
        )
        self.runner: web.AppRunner | None = None
        self._watch: asyncio.Task[Any] | None = None
        self.url = ""

    def _keys(self) -> list[bytes]:
        return self.tls.keys if self.tls else self._fallback_key

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.settings.injector.max_body_bytes)
        app.router.add_post("/mutate", self._mutate)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        app.router.add_get("/metrics", self._metrics)
        return app

    async def start(self) -> None:
        conf = self.settings.injector
        self.runner = web.AppRunner(self.app(), access_log=None, handle_signals=False)
        await self.runner.setup()
        site = web.TCPSite(self.runner, conf.host, conf.port, ssl_context=self.ssl_context)
        await site.start()
        host, port = self.runner.addresses[0][:2]
        self.url = f"https://{host if ':' not in host else f'[{host}]'}:{port}/mutate"
        if self.tls is not None:
            self._watch = tasks.start(
                self.tls.watch(interval_s=self.reload_interval_s), name="injector-tls-reload"
            )
        _log.info("injector_started", url=self.url, failure_policy=conf.failure_policy)

    async def stop(self) -> None:
        if self._watch is not None:
            await tasks.stop(self._watch)
            self._watch = None
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None

    def budget_s(self, request: web.Request) -> float:
        """The plan budget: the setting, cut to the API server's own timeout."""
        budget = self.settings.injector.plan_timeout_s
        match = _DURATION.match(request.query.get("timeout", ""))
        if match:
            server_s = float(match.group(1)) * _UNIT_S[match.group(2)]
            budget = min(budget, max(0.1, server_s - API_SERVER_MARGIN_S))
        return budget

    async def _mutate(self, request: web.Request) -> web.Response:
        loop = asyncio.get_running_loop()
        started = loop.time()
        answer = await self._answer(request)
        LATENCY.record(loop.time() - started, {"result": answer.result})
        ADMISSIONS.add(1, {"result": answer.result})
        if answer.reason:
            REFUSALS.add(1, {"reason": answer.reason})
        response = web.Response(
            status=answer.status, body=answer.body, content_type=answer.content_type
        )
        if answer.close:
            response.force_close()
        return response

    async def _answer(self, request: web.Request) -> Answer:
        limit = self.settings.injector.max_body_bytes
        body = await httpbodies.read_body(request, limit=limit, setting="injector.max_body_bytes")
        if isinstance(body, httpbodies.Refusal):
            _log.warning(
                "admission_body_refused", reason=body.reason, status=body.status, error=body.message
            )
            return Answer(
                body.status,
                f"{body.message}\n".encode(),
                "too_large" if body.status == 413 else "bad_request",
                "text/plain",
                reason=body.reason,
                close=body.close,
            )
        return await self.admitter.admit(body, budget_s=self.budget_s(request))

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.bus is not None and not self.bus.connected:
            return web.Response(status=503, text="bus not connected\n")
        return web.Response(text="ready\n")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=metrics_text(), content_type="text/plain")


async def serve(
    bus: Bus | None,
    settings: Settings,
    *,
    ssl_context: ssl.SSLContext | None = None,
    planner: Planner | None = None,
) -> Injector:
    """Start the webhook; the caller ``await injector.stop()``s it."""
    injector = Injector(bus, settings, ssl_context=ssl_context, planner=planner)
    await injector.start()
    return injector
