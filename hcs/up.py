"""``hcs up``: the whole stack on one machine, the embedded default.

Starts ``nats-server -js`` in a temporary directory on a free port (or uses
``--nats-url``; ``--nats-cluster 3``: three servers as one JetStream cluster
on loopback, every stream and bucket on all three), initialises the streams, then runs every part as its own
process, as in a cluster: the simulated fleet (agents), the scheduler with
its extender and console, the injector's webhook, and the healer (dry-run
unless a cluster is configured). No setup: a throw-away CA in the state
folder's ``certs/`` signs the webhook's and the extender's serving
certificate and kube-scheduler's client certificate (``client.crt``: the
extender takes binds over mutual TLS only, as in a cluster), and a fresh
console token is printed in the console's URL. It shows ``hcs top`` while it
runs (progress lines when stdout is not a terminal). ``--for`` stops it after
that long; Ctrl-C / SIGTERM stop everything, leaving no process behind.

The extender, webhook and console take free ports unless their flags name
one. While it runs, ``hcs.context`` tells every other ``hcs`` command where
it runs; the parts' logs are kept after it stops (``hcs.context.new_logs_dir``
or ``--state-dir``'s ``logs/``), and it says under the screen what happened
(``hcs.runsummary``), where it ran and where the logs are.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from agents import fleet as fleet_file
from hcs import context, partlogs, runsummary
from hcs.demo import DemoJob
from hcs_bus import streams, tasks
from hcs_bus.bus import connect
from hcs_bus.errors import ConfigError
from hcs_bus.natsserver import NatsCluster, NatsServer, free_port
from hcs_bus.redacting import redact_url
from hcs_bus.settings import Settings, replace
from hcs_bus.telemetry import logger
from scheduler.view.follow_loop import ClusterView

_log = logger("hcs.up")
KUBE_SCHEDULER = "hcs-kube-scheduler"  # the Common Name of kube-scheduler's client certificate


@dataclass(frozen=True)
class UpOptions:
    nats_url: str | None
    fleet: Path
    for_s: float | None
    extender: str
    webhook: str
    state_dir: Path | None
    demo_job: bool = True
    console: str = "127.0.0.1:8889"
    nats_cluster: int = 1  # servers of the embedded NATS (a cluster when more than one)


@dataclass
class Part:
    name: str
    argv: list[str]
    process: asyncio.subprocess.Process | None = None
    metrics_port: int = 0  # its Prometheus /metrics (HCS_TELEMETRY__METRICS_PORT)


def _host_port(text: str, *, what: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ConfigError(f"{what}: {text!r} is not HOST:PORT")
    return host, int(port)


def part_env(settings: Settings, *, certs_dir: Path | None) -> dict[str, str]:
    """The environment that hands this stack's settings to every part."""
    env = dict(os.environ)
    env["HCS_BUS__URL"] = settings.bus.url
    env["HCS_BUS__REPLICAS"] = str(settings.bus.replicas)
    env["HCS_TELEMETRY__LOG_FORMAT"] = "json"
    env["HCS_SCHEDULER__EXTENDER_HOST"] = settings.scheduler.extender_host
    env["HCS_SCHEDULER__EXTENDER_PORT"] = str(settings.scheduler.extender_port)
    env["HCS_INJECTOR__HOST"] = settings.injector.host
    env["HCS_INJECTOR__PORT"] = str(settings.injector.port)
    env["HCS_SCHEDULER__CONSOLE_HOST"] = settings.scheduler.console_host
    env["HCS_SCHEDULER__CONSOLE_PORT"] = str(settings.scheduler.console_port)
    if settings.scheduler.console_token_file:
        env["HCS_SCHEDULER__CONSOLE_TOKEN_FILE"] = settings.scheduler.console_token_file
    if certs_dir is not None:
        env["HCS_INJECTOR__CERT_FILE"] = str(certs_dir / "tls.crt")
        env["HCS_INJECTOR__KEY_FILE"] = str(certs_dir / "tls.key")
        env["HCS_SCHEDULER__EXTENDER_CERT_FILE"] = str(certs_dir / "tls.crt")
        env["HCS_SCHEDULER__EXTENDER_KEY_FILE"] = str(certs_dir / "tls.key")
        env["HCS_SCHEDULER__EXTENDER_CLIENT_CA_FILE"] = str(certs_dir / "ca.crt")
        env["HCS_SCHEDULER__EXTENDER_CLIENT_NAMES"] = KUBE_SCHEDULER
    return env


def parts(options: UpOptions) -> list[Part]:
    py = sys.executable
    return [
        Part(
            "agents", [py, "-m", "agents", "--fleet", str(options.fleet)], metrics_port=free_port()
        ),
        Part("scheduler", [py, "-m", "scheduler"], metrics_port=free_port()),
        Part("injector", [py, "-m", "injector"], metrics_port=free_port()),
        Part("healer", [py, "-m", "healer"], metrics_port=free_port()),
    ]


async def run(settings: Settings, options: UpOptions) -> int:
    fleet_file.load(
        options.fleet
    )  # a bad fleet is one clear line and exit 2, before anything starts
    ext_host, ext_port = _host_port(options.extender, what="--extender")
    wh_host, wh_port = _host_port(options.webhook, what="--webhook")
    console_host, console_port = _host_port(options.console, what="--console")
    settings = replace(
        settings,
        scheduler={
            "extender_host": ext_host,
            "extender_port": ext_port,
            "console_host": console_host,
            "console_port": console_port,
        },
        injector={"host": wh_host, "port": wh_port},
    )
    failures: list[str] = []
    farewell: list[str] = []  # told again under the screen when the stack stops
    with tempfile.TemporaryDirectory(prefix="hcs-up-") as tmp:
        state_dir = options.state_dir or Path(tmp)
        logs = _logs_dir(options.state_dir)
        # On a terminal the live screen owns it: this process's own log lines go
        # to logs/hcs-up.log, and a failing part is told once the screen is gone.
        try:
            with _stderr_to(logs / "hcs-up.log", enabled=sys.stdout.isatty()):
                return await _run_in(
                    settings, options, state_dir=state_dir, logs=logs, told=(failures, farewell)
                )
        finally:
            for line in farewell:
                print(line, flush=True)
            for failure in failures:
                print(failure, file=sys.stderr, flush=True)


def _logs_dir(state_dir: Path | None) -> Path:
    """``--state-dir``'s ``logs/``, else a fresh folder in the state home that
    outlives the run (``hcs.context.new_logs_dir``)."""
    if state_dir is None:
        return context.new_logs_dir(now=datetime.datetime.now(datetime.UTC))
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    return state_dir / "logs"


async def _run_in(
    settings: Settings,
    options: UpOptions,
    *,
    state_dir: Path,
    logs: Path,
    told: tuple[list[str], list[str]],
) -> int:
    server: NatsServer | NatsCluster | None = None
    if options.nats_url is None and options.nats_cluster > 1:
        cluster = NatsCluster(size=options.nats_cluster, root=state_dir / "nats")
        server = await cluster.astart()
        # every stream and bucket on three servers (or all, when fewer)
        settings = replace(settings, bus={"url": cluster.urls, "replicas": min(cluster.size, 3)})
        _log.info("nats_started", url=cluster.urls, store=str(state_dir / "nats"))
    elif options.nats_url is None:
        server = await NatsServer(store_dir=state_dir / "nats").astart()
        settings = replace(settings, bus={"url": server.url})
        _log.info("nats_started", url=server.url, store=str(state_dir / "nats"))
    try:
        return await _run_stack(settings, options, state_dir=state_dir, logs=logs, told=told)
    finally:
        if server is not None:
            server.cleanup()


async def _run_stack(
    settings: Settings,
    options: UpOptions,
    *,
    state_dir: Path,
    logs: Path,
    told: tuple[list[str], list[str]],
) -> int:
    failures, farewell = told
    bus = await connect(settings.bus, name="hcs-up")
    await streams.init(bus, settings.bus)
    tally = runsummary.Tally()
    following = await runsummary.follow(bus, tally)
    started = asyncio.get_running_loop().time()
    certs_dir = _dev_certs(
        state_dir / "certs", hosts={settings.injector.host, settings.scheduler.extender_host}
    )
    token_file = _console_token(certs_dir / "console-token")
    settings = replace(settings, scheduler={"console_token_file": str(token_file)})
    env = part_env(settings, certs_dir=certs_dir)
    running = parts(options)
    stop = tasks.stop_event()
    banner: list[str] = []
    try:
        for part in running:
            part.process = await asyncio.create_subprocess_exec(
                *part.argv,
                env={**env, "HCS_TELEMETRY__METRICS_PORT": str(part.metrics_port)},
                start_new_session=True,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=_log_file(logs, part.name),
            )
            _log.info("part_started", part=part.name, pid=part.process.pid)
        banner = _endpoint_lines(
            settings, logs=logs, certs_dir=certs_dir, token=token_file.read_text()
        )
        print("\n".join(banner), flush=True)
        _print_metrics(running)
        _write_context(settings, logs=logs, token=token_file.read_text(), running=running)
        from hcs.cli import show_top  # the live view shares code with `hcs top`

        view = ClusterView(bus, settings=settings.scheduler, health_replay_s=600.0)
        await view.start()
        live = sys.stdout.isatty()
        watch = _watch_parts(running, stop, logs=logs, failures=failures)
        background = [
            tasks.start(show_top(bus, settings, live=live, stop=stop, view=view), name="up:top"),
            tasks.start(watch, name="up:watch"),
        ]
        if options.demo_job:
            job = DemoJob(
                bus=bus,
                state=view.state,
                webhook_url=f"https://{settings.injector.host}:{settings.injector.port}/mutate",
                extender_url=f"https://{settings.scheduler.extender_host}:"
                f"{settings.scheduler.extender_port}",
                ca_file=certs_dir / "ca.crt",
                client_cert_file=certs_dir / "client.crt",
                client_key_file=certs_dir / "client.key",
            )
            background.append(tasks.start(job.run(), name="up:demo-job"))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(options.for_s):
                await stop.wait()
        stop.set()
        await asyncio.gather(background[0], return_exceptions=True)
        await tasks.stop(*background[1:])
        await view.stop()
        failed = [p.name for p in running if p.process and p.process.returncode not in (None, 0)]
        return 1 if failed else 0
    finally:
        context.remove(pid=os.getpid())
        await _stop_parts(running)
        with contextlib.suppress(Exception):  # the bus may be gone already
            await bus.nc.flush(timeout=1)
            for sub in following:
                await sub.unsubscribe()
        await bus.nc.close()
        ran_s = asyncio.get_running_loop().time() - started
        farewell.append(f"hcs up: stopped after {ran_s:.0f} s: {tally.line()}")
        farewell += banner
        farewell.append(f"hcs up: logs kept in {logs}")


def _dev_certs(out: Path, *, hosts: set[str]) -> Path:
    """A throw-away CA, one serving certificate for the webhook and the
    extender, and kube-scheduler's client certificate (the demo job's)."""
    from hcs_bus.certs import make_dev_certs

    names = ["localhost", "hcs-injector.hcs-system.svc"]
    ips = ["127.0.0.1", *sorted(hosts - {"127.0.0.1"})]
    make_dev_certs(out, dns=names, ips=ips, client=KUBE_SCHEDULER)
    return out


def _console_token(path: Path) -> Path:
    """A fresh console token in ``path`` (0600), for this run only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_urlsafe(24))
    return path


def _log_file(logs: Path, name: str) -> int:
    logs.mkdir(parents=True, exist_ok=True)
    return os.open(logs / f"{name}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)


def _write_context(settings: Settings, *, logs: Path, token: str, running: list[Part]) -> None:
    """Tell every other ``hcs`` command where this stack runs (``hcs.context``)."""
    s = settings.scheduler
    console = f"http://{s.console_host}:{s.console_port}/console/"
    found = context.Context(
        bus_url=settings.bus.url,
        pid=os.getpid(),
        started=datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        extender_url=f"https://{s.extender_host}:{s.extender_port}",
        webhook_url=f"https://{settings.injector.host}:{settings.injector.port}/mutate",
        console_url=f"{console}?token={token}",
        console_token=token,
        logs=str(logs),
        metrics={p.name: f"http://127.0.0.1:{p.metrics_port}/metrics" for p in running},
    )
    where = context.write(found)
    _log.info("context_written", path=str(where))


def _endpoint_lines(settings: Settings, *, logs: Path, certs_dir: Path, token: str) -> list[str]:
    s = settings
    endpoints = (
        f"hcs up: NATS {redact_url(s.bus.url)} | extender https://{s.scheduler.extender_host}:"
        f"{s.scheduler.extender_port}/{{filter,prioritize,bind,preempt}} (mutual TLS: "
        f"kube-scheduler's client certificate {certs_dir / 'client.crt'}) | webhook "
        f"https://{s.injector.host}:{s.injector.port}/mutate (CA {certs_dir / 'ca.crt'}) | "
        f"logs {logs} | alerts: hcs watch 'hcs.health.*' --nats-url {redact_url(s.bus.url)}"
    )
    host = s.scheduler.console_host
    console = f"http://{host}:{s.scheduler.console_port}/console/?token={token}"
    return [endpoints, f"hcs up: console {console} (read-only, live; the token is this run's)"]


def _print_metrics(running: list[Part]) -> None:
    """One port per part: setting one port for all made every part but the
    first fail to bind it, and the stack stop."""
    ports = " ".join(f"{p.name}=http://127.0.0.1:{p.metrics_port}/metrics" for p in running)
    print(f"hcs up: metrics {ports}", flush=True)


async def _watch_parts(
    running: list[Part], stop: asyncio.Event, *, logs: Path, failures: list[str]
) -> None:
    """A part that exits on its own stops the stack, and ``failures`` says why:
    the reason and the last lines of its log (its log folder may vanish at exit)."""
    waits = {asyncio.create_task(p.process.wait()): p for p in running if p.process}
    done, pending = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        task.cancel()
    for task in done:
        part = waits[task]
        lines = partlogs.tail(logs / f"{part.name}.log")
        why = partlogs.reason(lines) or "no error in its log"
        _log.error("part_exited", part=part.name, code=task.result(), reason=why)
        shown = "\n".join(f"  {partlogs.readable(line)}" for line in lines)
        failures.append(
            f"hcs up: part {part.name} exited with code {task.result()}: {why}\n"
            f"last lines of its log:\n{shown}"
        )
    stop.set()


@contextlib.contextmanager
def _stderr_to(path: Path, *, enabled: bool) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` for a while (when ``enabled``)."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


async def _stop_parts(running: list[Part]) -> None:
    for part in running:
        if part.process and part.process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(part.process.pid, signal.SIGTERM)
    for part in running:
        if part.process is None:
            continue
        try:
            async with asyncio.timeout(8):
                await part.process.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(part.process.pid, signal.SIGKILL)
            await part.process.wait()
        _log.info("part_stopped", part=part.name, code=part.process.returncode)
