"""One scheduler replica: the view, the plan service, the extender, the
console, the release watcher, the Node label watcher and the expiry loop,
wired together. The extender (``extender_host:extender_port``, mutual TLS off
loopback) and the console (``console_host:console_port``, behind its token)
are two servers of the same replica."""

from __future__ import annotations

import asyncio
import os
import socket
import weakref
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from aiohttp import web
from opentelemetry.metrics import CallbackOptions, Observation

from hcs_bus import checkpoint, streams
from hcs_bus.bus import Bus
from hcs_bus.errors import ConfigError, HcsError
from hcs_bus.profiles import ProfileDB
from hcs_bus.profiles import load as load_profiles
from hcs_bus.quorum import LeaderWatch
from hcs_bus.settings import SchedulerSettings, Settings
from hcs_bus.telemetry import logger, meter
from hcs_bus.tls import ReloadingTls, server_context
from scheduler.console import http as console
from scheduler.extender import rules as placing
from scheduler.extender.http import Extender, client_certificates, serve, server_tls
from scheduler.ledger import pledge_store as pledging
from scheduler.ledger import release_loop as watching
from scheduler.ledger.pledge_store import Pledger
from scheduler.ledger.reservation_store import Booker
from scheduler.plan import gang_loop as ganging
from scheduler.plan.service import Planner, PlanService
from scheduler.quota.source import QuotaSource, StatusKube, UsedWriter, used_by_namespace
from scheduler.replan import loop as stranding
from scheduler.replan.pending_pods import PendingPods
from scheduler.report import skew_loop as skew
from scheduler.view import gauge_meters as gauging
from scheduler.view.follow_loop import ClusterView
from scheduler.view.state import ClusterState


class ReplicaKube(StatusKube, skew.Kube, Protocol):
    """Every Kube call one scheduler replica makes."""


_log = logger("hcs.scheduler")
TYPICAL_REQUEST_MIB = 8192
SETTLE_S = 5.0  # longest a stopping replica spends writing its deferred marks
TLS_RELOAD_S = 2.0  # how often the servers look for rotated certificate files
_states: weakref.WeakSet[ClusterState] = weakref.WeakSet()


def _fragmentation(_options: CallbackOptions) -> Iterable[Observation]:
    for state in list(_states):
        nodes = state.nodes.values()
        yield Observation(placing.fragmentation(nodes, piece_mib=TYPICAL_REQUEST_MIB))


meter("hcs.scheduler").create_observable_gauge(
    "hcs_scheduler_fragmentation_ratio",
    callbacks=[_fragmentation],
    description=f"share of free VRAM in pieces under {TYPICAL_REQUEST_MIB} MiB",
)


@dataclass
class Scheduler:
    view: ClusterView
    planner: Planner
    booker: Booker
    service: PlanService
    extender: Extender
    runner: web.AppRunner | None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)
    strands: stranding.Stranding | None = None  # with a cluster only
    console_runner: web.AppRunner | None = None

    @property
    def port(self) -> int | None:
        """The extender's port."""
        return _port(self.runner)

    @property
    def console_port(self) -> int | None:
        return _port(self.console_runner)

    async def stop(self) -> None:
        from hcs_bus import tasks

        running, self.tasks = self.tasks, []
        await tasks.stop(*running)
        await self.service.stop()
        for runner in (self.console_runner, self.runner):
            if runner is not None:
                await runner.cleanup()
        self.runner = self.console_runner = None
        try:  # the marks of pods bound last: written now, not left to expiry
            async with asyncio.timeout(SETTLE_S):
                await self.booker.settle()
        except (TimeoutError, HcsError) as exc:
            _log.warning("marks_not_settled", error=repr(exc))
        await self.view.stop()


def _port(runner: web.AppRunner | None) -> int | None:
    if runner is None:
        return None
    for address in runner.addresses:
        return int(address[1])
    return None


@dataclass(frozen=True)
class _Serving:
    """What the two servers need from the settings, read before anything starts
    (a bad TLS setting stops the replica at once)."""

    extender_tls: ReloadingTls | None
    console_tls: ReloadingTls | None
    console_token: str | None

    @classmethod
    def of(cls, cfg: SchedulerSettings) -> _Serving:
        console_tls = None
        if cfg.console_cert_file and cfg.console_key_file:
            console_tls = server_context(
                cfg.console_cert_file,
                cfg.console_key_file,
                settings="scheduler.console_cert_file, console_key_file",
            )
        elif cfg.console_cert_file or cfg.console_key_file:
            raise ConfigError("scheduler.console_cert_file and console_key_file go together")
        return cls(server_tls(cfg), console_tls, console.read_token(cfg))


async def _servers(
    cfg: SchedulerSettings, serving: _Serving, extender: Extender, pool: console.Console
) -> tuple[web.AppRunner, web.AppRunner, list[asyncio.Task[Any]]]:
    """The extender's server and the console's, each with its TLS, and the
    tasks that reload their certificates."""
    from hcs_bus import tasks

    app = extender.app()
    extender_tls, console_tls = serving.extender_tls, serving.console_tls
    mutual = extender_tls is not None and extender_tls.client_ca_file is not None
    if mutual:
        app.middlewares.append(client_certificates(allowed=cfg.extender_client_names))
    console_app = console.app(pool, token=serving.console_token, secure=console_tls is not None)
    allowed = cfg.extender_client_names if mutual else None
    runner = await serve(
        app,
        host=cfg.extender_host,
        port=cfg.extender_port,
        ssl_context=extender_tls.context if extender_tls else None,
        http2_answer=extender.http2(allowed=allowed) if cfg.extender_http2 else None,
    )
    try:
        console_runner = await console.serve(
            console_app,
            host=cfg.console_host,
            port=cfg.console_port,
            ssl_context=console_tls.context if console_tls else None,
        )
    except BaseException:
        await runner.cleanup()
        raise
    reloading = [
        tasks.start(t.watch(interval_s=TLS_RELOAD_S), name=f"tls-reload:{name}")
        for name, t in (("extender", extender_tls), ("console", console_tls))
        if t is not None
    ]
    return runner, console_runner, reloading


def profile_db() -> ProfileDB:
    try:
        return load_profiles()
    except (ConfigError, OSError) as exc:
        _log.warning("profiles_unavailable", error=str(exc))
        return ProfileDB(())


async def run(
    bus: Bus,
    kube: ReplicaKube | None,
    settings: Settings,
    *,
    profiles: ProfileDB | None = None,
    http: bool = True,
    summary_max_age_s: float = 0.5,
) -> Scheduler:
    """Start a replica; ``stop()`` on the result ends it."""
    from hcs_bus import tasks

    cfg = settings.scheduler
    serving = _Serving.of(cfg) if http else None
    view = ClusterView(bus, settings=cfg)
    if kube is not None:
        view.nodes_synced = asyncio.Event()
    _states.add(view.state)
    gauging.watch(view.state)
    replica = cfg.replica_id or f"{socket.gethostname()}:{os.getpid()}"
    kv = await bus.js.key_value(streams.KV_ALLOC)
    ckpt = await bus.js.key_value(streams.KV_CKPT)
    booker = Booker(
        bus,
        kv=kv,
        ckpt=ckpt,
        state=view.state,
        kube=kube,
        replica=replica,
        claim_ttl_s=cfg.reserve_ttl_s,
    )
    booker.quorum = quorum = LeaderWatch(bus, stream=streams.kv_stream(streams.KV_ALLOC))
    quotas = QuotaSource(kube=kube, file=cfg.quota_file)
    planner = Planner(
        view.state,
        profiles=profiles or profile_db(),
        quotas=quotas,
        max_age_s=summary_max_age_s,
        spread=cfg.placement == "spread",
    )
    view.listeners.append(planner.changed)
    pledger = Pledger(
        kv=kv,
        summary=planner.summary,
        ttl_s=cfg.pledge_ttl_s,
        pods=kube.list_pod_annotations if kube is not None else None,
        orphan_after_s=cfg.pledge_unclaimed_s,
    )
    view.key_listeners.append(pledger.apply)
    gauging.watch_pledges(pledger)
    planner.pledger, booker.spend, booker.unpledge = pledger, planner.spend, pledger.release
    planner.gangs = ganging.pins_of(kv=kv, planner=planner)
    extender = Extender(
        view,
        planner=planner,
        booker=booker,
        kube=kube,
        weights=placing.Weights.from_settings(cfg),
        pick_in_filter=cfg.pick_in_filter,
    )
    if kube is not None:  # no bind before every pod bound by HCS holds its devices
        view.before_ready.append(lambda: watching.first_reconcile(kube, booker))
    await view.start()
    service = PlanService(bus, planner=planner, booker=booker)
    await service.start()
    runner = console_runner = None
    running: list[asyncio.Task[Any]] = []
    if serving is not None:
        pool = console.Console(
            view, bus=bus, profiles=planner.profiles, quotas=quotas, pledger=pledger
        )
        runner, console_runner, running = await _servers(cfg, serving, extender, pool)
    running.append(
        tasks.start(watching.expire_loop(booker, ttl_s=cfg.reserve_ttl_s), name="expire")
    )
    running.append(tasks.start(pledging.sweep_loop(pledger), name="pledge-sweep"))
    running.append(tasks.start(quorum.run(), name="ledger-quorum"))
    strands = None
    if kube is not None:
        scheduler_name = settings.injector.scheduler_name
        pending = PendingPods(scheduler_name=scheduler_name)  # the watch keeps, the scan reads
        watch = watching.watch_pods(kube, booker, scheduler_name=scheduler_name, pending=pending)
        running.append(tasks.start(watch, name="pod-watch"))
        running.append(tasks.start(watching.watch_nodes(kube, view), name="node-watch"))
        gangs = ganging.of_replica(
            kube=kube,
            kv=kv,
            planner=planner,
            scheduler_name=scheduler_name,
            publish=bus.nc.publish,
            checkpoint=_checkpointer(bus, wait_s=cfg.reclaim_checkpoint_s),
            reclaim_share_per_min=cfg.reclaim_pool_share_per_min,
        )
        view.listeners.append(gangs.wake)
        running.append(tasks.supervise(lambda: gangs.run(ready=view.ready), name="gangs"))
        # each namespace's usage and the schedulable fleet's classes (which
        # the quotas' guarantees are judged against) every round, from the
        # planner's node-by-node parts: the nodes changed since the last
        # round are made again once, for this and the plans alike (a fleet of
        # thousands is not summed from its devices and reservations every two
        # seconds)
        used = UsedWriter(
            kube=kube,
            quotas=quotas,
            used=lambda: used_by_namespace(planner.usage(), pledger.by_namespace(fresh=True)),
            classes=planner.classes,
        )
        running.append(tasks.start(used.run(), name="quota-used"))
        reconciling = watching.reconcile_loop(kube, booker, ready=view.ready)
        running.append(tasks.start(reconciling, name="pod-reconcile"))
        strands = stranding.of_settings(
            kube=kube, planner=planner, settings=settings, replica=replica, pending_pods=pending
        )
        running.append(tasks.start(strands.run(ready=view.ready), name="stranding"))
        if cfg.kube_scheduler_deployment:  # its version against the API server's
            check = skew.skew_loop(kube, deployment=cfg.kube_scheduler_deployment)
            running.append(tasks.start(check, name="kube-scheduler-skew"))
    _log.info("scheduler_started", replica=replica, cluster=kube is not None)
    return Scheduler(
        view, planner, booker, service, extender, runner, running, strands, console_runner
    )


def _checkpointer(bus: Bus, *, wait_s: float) -> Callable[[str, str, str], Awaitable[bool]]:
    """Asks a job to checkpoint before a reclaim evicts it (``checkpoint.ask``)."""

    async def ask(namespace: str, job: str, reason: str) -> bool:
        got = await checkpoint.ask(bus, namespace=namespace, job=job, reason=reason, wait_s=wait_s)
        return got is not None

    return ask
