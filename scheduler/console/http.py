"""The read-only web console of the compute pool, served by each scheduler
replica on a port of its own (``scheduler.console_port``; ``app`` builds it).

Every request needs the console's bearer token (``scheduler.console_token``
or ``console_token_file``): ``Authorization: Bearer <token>``, or the cookie
``hcs_console_token`` that opening ``/console/?token=<token>`` once sets
(HttpOnly, SameSite=Strict; the page then drops the token from the address
bar). Without it: 401 with a message saying how to pass it (JSON under
/api/), logged and counted in ``hcs_console_refusals`` by reason.

    GET /console/                 the page (static files in scheduler/console/static)
    GET /api/overview             classes, nodes, jobs, namespaces, alerts (panels.overview)
    GET /api/nodes?offset&limit   node rows, those needing a look first
    GET /api/nodes/{name}         one node: devices, reservations, labels
    GET /api/alerts?limit&node&severity
    GET /api/history?window_s     samples for the plots
    GET /api/queue                the shared pool's queue: what ``hcs queue --json``
                                  prints (``scheduler.quota.queue_view``)
    GET /api/events               Server-Sent Events: ``overview`` on every change,
                                  at most once per ``push_every_s`` (longer on
                                  a large fleet, see LOOP_SHARE)

What it reads: the replica's ``ClusterView`` (nodes, devices, verdicts,
reservations), its own follower of ``HCS_HEALTH`` (alerts, replayed for
``alerts_replay_s``), KV ``hcs_ckpt`` for the jobs holding devices and the
quota source, both refreshed every ``refresh_every_s``; for the queue, the
pledger's pledges and gang records (its KV watch) and the quota source at
each request. A bad query is a 4xx
whose JSON body names the reason; so is an unknown path or method under /api/.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import hmac
import ssl
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.typedefs import Middleware

from hcs_bus import checkpoint, tasks, tls
from hcs_bus.bus import Bus, Delivery, Follower
from hcs_bus.errors import HcsError
from hcs_bus.messages import CheckpointEvent, HealthEvent
from hcs_bus.profiles import ProfileDB
from hcs_bus.settings import SchedulerSettings
from hcs_bus.telemetry import logger, meter
from scheduler.console import panels
from scheduler.ledger.pledge_store import Pledger
from scheduler.plan.rules import QuotaLimits, summarise
from scheduler.quota import queue_view
from scheduler.quota.source import QuotaSource
from scheduler.view.follow_loop import ClusterView, health_follower

_log = logger("hcs.scheduler.console")
REFUSALS = meter("hcs.scheduler").create_counter(
    "hcs_console_refusals", description="console requests refused (HTTP 401), by reason"
)
TOKEN_COOKIE = "hcs_console_token"
PAGE_PATHS = frozenset({"/console", "/console/"})  # where ?token= is taken
DATA = Path(__file__).with_name("static")
PAGE_POLICY = "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:"
_ENCODER = msgspec.json.Encoder()
# The console shares the replica's event loop with the extender: each of its
# periodic jobs waits at least its last duration / LOOP_SHARE before running
# again (5,000 nodes: an overview takes ~0.15 s here, so one every ~3 s).
LOOP_SHARE = 0.05
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Console:
    """The console's state beside the view: alerts, checkpoints, quota limits,
    history; and a pulse that wakes the live feeds on every change. The
    queue is read from ``pledger`` (None: no pledge and no gang is known)."""

    def __init__(
        self,
        view: ClusterView,
        *,
        bus: Bus,
        profiles: ProfileDB,
        quotas: QuotaSource | None,
        pledger: Pledger | None = None,
        clock: Callable[[], float] = time.time,
        push_every_s: float = 1.0,
        heartbeat_s: float = 15.0,
        sample_every_s: float = 5.0,
        refresh_every_s: float = 3.0,
        history_keep: int = 720,
        alerts_keep: int = 500,
        alerts_replay_s: float = 3600.0,
    ) -> None:
        self.view, self.bus, self.profiles, self.quotas = view, bus, profiles, quotas
        self.pledger = pledger
        self.clock = clock
        self.push_every_s, self.heartbeat_s = push_every_s, heartbeat_s
        self.sample_every_s, self.refresh_every_s = sample_every_s, refresh_every_s
        self.alerts_replay_s = alerts_replay_s
        self.alerts: deque[HealthEvent] = deque(maxlen=alerts_keep)
        self.checkpoints: dict[str, CheckpointEvent] = {}
        self.limits: dict[str, QuotaLimits | None] = {}
        self.history = panels.History(keep=history_keep)
        self.version = 0
        self.build_s = 0.0  # how long the last overview took to build
        self._pulse = asyncio.Event()
        self._closing = asyncio.Event()
        self._cached: tuple[int, bytes] = (-1, b"")
        self._health: Follower[HealthEvent] | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        view.listeners.append(self.changed)

    # -- lifetime -----------------------------------------------------------
    async def start(self) -> None:
        since = dt.datetime.fromtimestamp(self.clock() - self.alerts_replay_s, dt.UTC)
        self._health = health_follower(self.bus, since=since, handle=self._on_health)
        await self._health.start()
        self._tasks = [  # a loop that crashes (a bus error) is started again
            tasks.supervise(self._sampling, name="console:history"),
            tasks.supervise(self._refreshing, name="console:refresh"),
        ]

    def close(self) -> None:
        """End every live feed (at shutdown, before the server waits on them)."""
        self._closing.set()
        self.changed()

    async def stop(self) -> None:
        self.close()
        await tasks.stop(*self._tasks)
        self._tasks = []
        if self._health is not None:
            await self._health.stop()
            self._health = None
        with contextlib.suppress(ValueError):
            self.view.listeners.remove(self.changed)

    def changed(self, _node: str | None = None) -> None:
        self.version += 1
        pulse, self._pulse = self._pulse, asyncio.Event()
        pulse.set()

    # -- inputs ---------------------------------------------------------------
    def _on_health(self, item: Delivery[HealthEvent]) -> None:
        if panels.is_alert(item.value):
            self.alerts.append(item.value)
            self.changed()

    async def _sampling(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            began = loop.time()
            self.history.record(self.view.state, time_s=self.clock())
            took = loop.time() - began
            await asyncio.sleep(max(self.sample_every_s, took / LOOP_SHARE))

    async def _refreshing(self) -> None:
        while True:
            if await self.refresh():
                self.changed()
            await asyncio.sleep(self.refresh_every_s)

    async def refresh(self) -> bool:
        """Read the checkpoints of jobs holding devices (and of those shown
        already) and the quotas of namespaces holding devices; True on a change."""
        state = self.view.state
        jobs = {f"{ns}/{job}" for ns, job in panels.job_keys(state)} | set(self.checkpoints)
        changed = False
        for key in sorted(jobs):
            namespace, _, job = key.partition("/")
            try:
                last = await checkpoint.latest(self.bus, namespace=namespace, job=job)
            except (HcsError, OSError, TimeoutError) as exc:
                _log.warning("console_checkpoint_unread", job=key, error=str(exc))
                continue
            if last is None:
                changed |= self.checkpoints.pop(key, None) is not None
            elif self.checkpoints.get(key) != last:
                self.checkpoints[key] = last
                changed = True
        if self.quotas is not None:
            namespaces = {r["namespace"] for r in panels.namespace_rows(state, limits={})}
            for namespace in sorted(namespaces):
                limit = await self.quotas.limits(namespace)
                changed |= self.limits.get(namespace) != limit or namespace not in self.limits
                self.limits[namespace] = limit
        return changed

    # -- documents ------------------------------------------------------------
    def overview(self) -> dict[str, Any]:
        return panels.overview(
            self.view.state,
            profiles=self.profiles,
            alerts=self.alerts,
            checkpoints=self.checkpoints,
            limits=self.limits,
            now_s=self.clock(),
            ready=self.view.ready.is_set(),
        )

    async def queue(self) -> dict[str, Any]:
        """The shared pool's queue as ``hcs queue --json`` prints it, from this
        replica's memory: the view's reservations, the pledger's pledges and
        gang records, the fleet's classes and the namespaces' quotas."""
        state = self.view.state
        ledger = state.ledger()
        pledged = self.pledger.known() if self.pledger is not None else {}
        gangs = [r for r, _ in self.pledger.gangs.all()] if self.pledger is not None else []
        classes = dict(summarise(state.schedulable()).classes)
        seen = queue_view.namespaces_of(ledger, pledged.values(), gangs)
        limits: dict[str, QuotaLimits | None] = {ns: None for ns in seen}
        if self.quotas is not None:
            for namespace in sorted(seen | self.quotas.named()):
                limits[namespace] = await self.quotas.limits(namespace)
        return queue_view.view(
            ledger,
            pledged.values(),
            limits=limits,
            pool=queue_view.pool_of(classes),
            now=self.clock(),
            gangs=gangs,
            classes=classes,
        )

    def push_pause_s(self) -> float:
        """The least time between two pushes to one live feed."""
        return max(self.push_every_s, self.build_s / LOOP_SHARE)

    def overview_bytes(self) -> bytes:
        version, body = self._cached
        if version != self.version:
            loop = asyncio.get_running_loop()
            began = loop.time()
            body = _ENCODER.encode(self.overview())
            self._cached = (self.version, body)
            self.build_s = loop.time() - began
        return body

    # -- handlers -------------------------------------------------------------
    async def get_overview(self, _request: web.Request) -> web.Response:
        return _json_body(self.overview_bytes())

    async def get_nodes(self, request: web.Request) -> web.Response:
        offset, limit = panels.page_query(request.query)
        return _json(panels.nodes_page(self.view.state, offset=offset, limit=limit))

    async def get_node(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        if request.query:
            raise panels.QueryError(
                f"/api/nodes/{{name}} takes no parameters, got {list(request.query)}"
            )
        node = self.view.state.nodes.get(name)
        if node is None:
            return refuse(404, f"unknown node {name!r}")
        return _json(panels.node_detail(node))

    async def get_alerts(self, request: web.Request) -> web.Response:
        keep = self.alerts.maxlen or len(self.alerts) or 1
        query = panels.alert_query(request.query, keep=keep)
        if query.node is not None and query.node not in self.view.state.nodes:
            return refuse(404, f"unknown node {query.node!r}")
        picked = [e for e in self.alerts if query.admits(e)][-query.limit :]
        return _json({"alerts": [panels.alert_row(e) for e in reversed(picked)]})

    async def get_history(self, request: web.Request) -> web.Response:
        most_s = int(self.history.keep * self.sample_every_s)
        window_s = panels.history_query(request.query, most_s=max(most_s, 1))
        series = self.history.series(since_s=self.clock() - window_s)
        return _json({"sample_every_s": self.sample_every_s, **series})

    async def get_queue(self, request: web.Request) -> web.Response:
        if request.query:
            raise panels.QueryError(f"/api/queue takes no parameters, got {list(request.query)}")
        return _json(await self.queue())

    async def get_events(self, request: web.Request) -> web.StreamResponse:
        if request.query:
            raise panels.QueryError(f"/api/events takes no parameters, got {list(request.query)}")
        response = web.StreamResponse(
            headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        )
        await response.prepare(request)
        with contextlib.suppress(ConnectionError):
            await self._feed(response)
        return response

    async def _feed(self, response: web.StreamResponse) -> None:
        while not self._closing.is_set():
            pulse = self._pulse
            body = self.overview_bytes()
            await response.write(b"event: overview\ndata: " + body + b"\n\n")
            with contextlib.suppress(TimeoutError):  # at most one push per pause
                async with asyncio.timeout(self.push_pause_s()):
                    await self._closing.wait()
            with contextlib.suppress(TimeoutError):  # then the next change, or a heartbeat
                async with asyncio.timeout(self.heartbeat_s):
                    await pulse.wait()

    async def page(self, _request: web.Request) -> web.StreamResponse:
        response = web.FileResponse(DATA / "index.html")
        response.headers["Content-Security-Policy"] = PAGE_POLICY
        return response


CONSOLE = web.AppKey("console", Console)


def _json(doc: Any, *, status: int = 200) -> web.Response:
    return _json_body(_ENCODER.encode(doc), status=status)


def _json_body(body: bytes, *, status: int = 200) -> web.Response:
    return web.Response(body=body, status=status, content_type="application/json")


def refuse(status: int, reason: str) -> web.Response:
    """A 4xx whose JSON body says why."""
    return _json({"error": reason, "status": status}, status=status)


@web.middleware
async def _json_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Under /api/ every refusal is JSON with its reason; elsewhere untouched."""
    if not request.path.startswith("/api/"):
        return await handler(request)
    try:
        return await handler(request)
    except panels.QueryError as exc:
        return refuse(400, str(exc))
    except web.HTTPMethodNotAllowed:
        return refuse(405, f"{request.method} is not allowed: the console API is read-only (GET)")
    except web.HTTPNotFound:
        return refuse(404, f"no console API at {request.path}")


def read_token(cfg: SchedulerSettings) -> str | None:
    """The console's token: ``console_token``, else the first line of
    ``console_token_file``; None (every request refused) when neither gives one."""
    if cfg.console_token:
        return cfg.console_token
    if not cfg.console_token_file:
        _log.warning("console_without_token", setting="scheduler.console_token_file")
        return None
    try:
        lines = Path(cfg.console_token_file).read_text().splitlines()
    except OSError as exc:
        _log.warning("console_token_unread", file=cfg.console_token_file, error=str(exc))
        return None
    token = lines[0].strip() if lines else ""
    if not token:
        _log.warning("console_token_empty", file=cfg.console_token_file)
    return token or None


def app(console: Console, *, token: str | None, secure: bool) -> web.Application:
    """The console's own application: every route behind ``token``
    (``secure``: served over HTTPS, so the cookie is Secure too)."""
    application = web.Application(middlewares=[_authenticated(token, secure=secure)])
    mount(application, console)
    return application


def _authenticated(token: str | None, *, secure: bool) -> Middleware:
    @web.middleware
    async def check(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = _offered(request)
        if token is None:
            return _unauthorized(
                request,
                reason="no_token_configured",
                text="the console has no token configured (scheduler.console_token_file, "
                "Secret hcs-console-token): it serves no one",
            )
        if given is None:
            return _unauthorized(
                request,
                reason="no_token",
                text="the console needs its token: open /console/?token=TOKEN once, "
                "or send the header Authorization: Bearer TOKEN",
            )
        if not hmac.compare_digest(given.encode(), token.encode()):
            return _unauthorized(request, reason="wrong_token", text="the console token is wrong")
        response = await handler(request)
        if request.path in PAGE_PATHS and "token" in request.query:
            response.set_cookie(
                TOKEN_COOKIE, token, path="/", httponly=True, samesite="Strict", secure=secure
            )
        return response

    return check


def _offered(request: web.Request) -> str | None:
    """The token a request carries: its bearer header, ``?token=`` on the
    page, or the cookie; None for none."""
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    if request.path in PAGE_PATHS and request.query.get("token"):
        return request.query["token"]
    return request.cookies.get(TOKEN_COOKIE) or None


def _unauthorized(request: web.Request, *, reason: str, text: str) -> web.Response:
    _log.warning("console_refused", reason=reason, path=request.path, peer=request.remote)
    REFUSALS.add(1, {"reason": reason})
    headers = {"WWW-Authenticate": 'Bearer realm="hcs-console"'}
    if request.path.startswith("/api/"):
        response = refuse(401, text)
        response.headers.update(headers)
        return response
    return web.Response(status=401, text=f"hcs: {text}\n", headers=headers)


def mount(app: web.Application, console: Console) -> None:
    """Serve the console from ``app``; its inputs start and stop with the app."""
    app[CONSOLE] = console
    app.middlewares.append(_json_errors)
    app.router.add_get("/console", _to_page)
    app.router.add_get("/console/", console.page)
    app.router.add_static("/console/static", DATA, append_version=False)
    app.router.add_get("/api/overview", console.get_overview)
    app.router.add_get("/api/nodes", console.get_nodes)
    app.router.add_get("/api/nodes/{name}", console.get_node)
    app.router.add_get("/api/alerts", console.get_alerts)
    app.router.add_get("/api/history", console.get_history)
    app.router.add_get("/api/queue", console.get_queue)
    app.router.add_get("/api/events", console.get_events)
    app.cleanup_ctx.append(_lifetime)
    app.on_shutdown.append(_closing)


async def _to_page(request: web.Request) -> web.Response:
    query = f"?{request.query_string}" if request.query_string else ""
    raise web.HTTPPermanentRedirect(f"/console/{query}")


async def _lifetime(app: web.Application) -> AsyncIterator[None]:
    console = app[CONSOLE]
    await console.start()
    yield
    await console.stop()


async def _closing(app: web.Application) -> None:
    app[CONSOLE].close()


async def serve(
    application: web.Application, *, host: str, port: int, ssl_context: ssl.SSLContext | None
) -> web.AppRunner:
    runner = web.AppRunner(application, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
    scheme = "https" if ssl_context is not None else "http"
    if ssl_context is None and not tls.is_loopback(host):
        _log.warning("console_plain_http", host=host, port=port, note="its token crosses in clear")
    _log.info("console_listening", host=host, port=port, scheme=scheme)
    return runner
