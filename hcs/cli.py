"""The ``hcs`` command line: the composition root above every part.

    hcs up [--for S] [--fleet FILE] [--extender H:P] [--webhook H:P] [--console H:P]
           [--state-dir DIR] [--nats-cluster N]
    hcs top [--once] [--json] [--limit N]
    hcs bus init [--replicas N]
    hcs models [--vendor V] [--json]
    hcs convert AMOUNT UNIT --to VENDOR/MODEL
        UNIT: tflops-fp16|tflops-bf16|tflops-fp32|acu|vram (AMOUNT 16Gi), or a model:
        hcs convert 1 nvidia/A100-80G --to hygon/K100
    hcs place --vram 16Gi [--tflops-fp16 N] [--acu N] [--devices N] [--vendors a,b] …
    hcs watch 'hcs.health.*' [--last N] [--count N]
    hcs usage [--namespace N] [--since 24h] [--json]
    hcs certs --out DIR --dns NAME… [--client NAME]
    hcs completion bash|zsh|tcsh

Global options (``--nats-url``, ``--config``, ``--connect-timeout``) go before
or after the command; without a bus named there (or in ``HCS_BUS__URL``), a
command talks to the running ``hcs up``'s (``hcs.context``). A bad flag or
file prints one line naming the flag and value and exits 2; a command that
cannot reach NATS within ``--connect-timeout`` prints one line and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import socket
import sys
import time
from collections import deque
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import nats.errors
import nats.js.errors
import shtab

from hcs import commands, flags
from hcs_bus import messages, subjects, tasks
from hcs_bus.bus import Bus, connect
from hcs_bus.errors import BusTimeout, ConfigError, HcsError
from hcs_bus.messages import HealthEvent
from hcs_bus.natsserver import free_port
from hcs_bus.redacting import redact_url
from hcs_bus.settings import Settings, load, replace
from hcs_bus.telemetry import configure, logger
from scheduler.view.follow_loop import ClusterView

DEFAULT_FLEET = Path("deploy/examples/fleet.yaml")
CONNECT_TIMEOUT_S = 3.0
UNITS = ("tflops-fp16", "tflops-bf16", "tflops-fp32", "acu", "vram")
_log = logger("hcs.cli")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def _version() -> str:
    try:
        return metadata.version("hcs")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """The options every command takes, before or after its name. On a
    command's parser they default to SUPPRESS, so they never undo a value
    given before the command."""

    def default(value: Any) -> Any:
        return value if top else argparse.SUPPRESS

    group = parser.add_argument_group("global options")
    group.add_argument(
        "--config", metavar="FILE", default=default(None), help="settings YAML (also HCS_CONFIG)"
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    group.add_argument(
        "--nats-url",
        metavar="URL",
        type=flags.nats_url,
        default=default(None),
        help="NATS server URL, e.g. nats://127.0.0.1:4222 (default: settings, HCS_BUS__URL)",
    )
    group.add_argument(
        "--connect-timeout",
        dest="connect_timeout_s",
        metavar="SECONDS",
        type=flags.positive_number,
        default=default(CONNECT_TIMEOUT_S),
        help=f"give up reaching NATS after this long (default {CONNECT_TIMEOUT_S:g})",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="hcs",
        description="Heterogeneous-accelerator scheduler: run it, watch it, ask it.",
        epilog="Global options may also follow the command: hcs watch --nats-url URL.",
    )
    parser.add_argument("--version", action="version", version=f"hcs {_version()}")
    _global_options(parser, top=True)
    sub = parser.add_subparsers(
        dest="command", required=True, parser_class=_Parser, metavar="COMMAND"
    )

    def command(name: str, about: str, parent: Any = sub) -> argparse.ArgumentParser:
        made: argparse.ArgumentParser = parent.add_parser(name, help=about, description=about)
        _global_options(made, top=False)
        return made

    _up_flags(command("up", "run the whole stack on an embedded NATS and a simulated fleet"))
    top = command("top", "the unified fleet view (live on a terminal)")
    top.add_argument("--once", action="store_true", help="print the view once and exit")
    top.add_argument("--json", action="store_true", help="print the view once as JSON")
    top.add_argument(
        "--limit",
        type=flags.positive_int,
        default=8,
        metavar="N",
        help="with --once or --json: the newest N alerts, newest first (default 8)",
    )

    bus = command("bus", "bus administration")
    bus_sub = bus.add_subparsers(
        dest="bus_command", required=True, parser_class=_Parser, metavar="BUS_COMMAND"
    )
    init = command("init", "create or update the streams and KV buckets", parent=bus_sub)
    init.add_argument(
        "--replicas",
        type=flags.replicas,
        metavar="N",
        help="copies of each stream, 1..5 (1 on one server, 3 in a cluster; default: settings)",
    )

    compact = command(
        "compact",
        "purge old delete markers from the ledger's KV buckets (operator credential)",
        parent=bus_sub,
    )
    compact.add_argument(
        "--older-than-s",
        type=float,
        default=600.0,
        metavar="S",
        help="purge markers older than this many seconds (default 600)",
    )

    models = command("models", "list the known accelerator models and their figures")
    models.add_argument("--vendor", type=str.lower, help="only this vendor's models")
    models.add_argument("--json", action="store_true", help="print the list as JSON")

    _convert_flags(command("convert", "equivalent device counts between models"))
    _place_flags(command("place", "ask the running scheduler for a plan (a dry run)"))

    check = command(
        "check",
        "compare the reservation ledger with the pods (needs a cluster); exit 1 on any inconsistency",
    )
    check.add_argument(
        "--settle",
        dest="settle_s",
        type=float,
        default=1.0,
        metavar="SECONDS",
        help="seconds between the two readings (a bind under way is not reported)",
    )
    usage = command(
        "usage",
        "device-, ACU- and VRAM-hours per namespace and model, within the guarantee and borrowed",
    )
    usage.add_argument("--namespace", help="only this namespace")
    usage.add_argument(
        "--since",
        dest="since_s",
        type=flags.duration_s,
        default=24 * 3600.0,
        metavar="DURATION",
        help="the window up to now, e.g. 30m, 24h, 7d (default 24h)",
    )
    usage.add_argument("--json", action="store_true", help="print the rows as JSON")
    queue = command("queue", "the shared pool: each namespace's share and the queue in order")
    queue.add_argument("--json", action="store_true", help="print the view as JSON")
    kueue = command(
        "kueue", "Kueue ResourceFlavors and ClusterQueues in ACU from the ComputeQuotas"
    )
    kueue.add_argument(
        "--namespace",
        dest="namespaces",
        action="append",
        default=[],
        metavar="NAMESPACE",
        help="also this namespace's ComputeQuotas (repeatable)",
    )
    watch = command("watch", "print bus messages as JSON lines")
    watch.add_argument(
        "subject",
        nargs="?",
        default="hcs.health.*",
        type=flags.subject,
        help="NATS subject, wildcards allowed (default: hcs.health.*)",
    )
    watch.add_argument(
        "--count", type=flags.positive_int, metavar="N", help="exit after N messages"
    )
    watch.add_argument(
        "--last",
        type=flags.positive_int,
        metavar="N",
        help="first print the last N messages the bus kept on SUBJECT (e.g. the last alerts)",
    )

    certs = command("certs", "write a development CA and a serving certificate")
    certs.add_argument(
        "--out", type=Path, required=True, metavar="DIR", help="folder to write them in"
    ).complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    certs.add_argument(
        "--dns",
        nargs="+",
        type=flags.dns_name,
        default=["localhost"],
        metavar="NAME",
        help="DNS names the certificate is for (default: localhost)",
    )
    certs.add_argument(
        "--ip",
        nargs="*",
        type=flags.ip_address,
        default=["127.0.0.1"],
        metavar="ADDRESS",
        help="IP addresses the certificate is for (default: 127.0.0.1)",
    )
    certs.add_argument(
        "--client",
        type=flags.dns_name,
        metavar="NAME",
        help="also a client certificate for NAME (its Common Name), signed by the same CA",
    )

    completion = command("completion", "print a shell completion script")
    completion.add_argument(
        "shell",
        choices=["bash", "zsh", "tcsh"],
        help='e.g. eval "$(hcs completion bash)" in ~/.bashrc',
    )
    return parser


def _up_flags(up: argparse.ArgumentParser) -> None:
    up.add_argument(
        "--for",
        dest="for_s",
        type=flags.positive_number,
        metavar="SECONDS",
        help="stop cleanly after SECONDS (default: until Ctrl-C)",
    )
    up.add_argument(
        "--fleet",
        type=Path,
        default=None,
        metavar="FILE",
        help=f"simulated fleet YAML (default: {DEFAULT_FLEET})",
    ).complete = shtab.FILE  # type: ignore[attr-defined]
    up.add_argument(
        "--extender",
        default=None,
        type=flags.host_port,
        metavar="HOST:PORT",
        help="where the scheduler extender listens (default: a free port on 127.0.0.1)",
    )
    up.add_argument(
        "--webhook",
        default=None,
        type=flags.host_port,
        metavar="HOST:PORT",
        help="where the injector's webhook listens (default: a free port on 127.0.0.1)",
    )
    up.add_argument(
        "--console",
        default=None,
        type=flags.host_port,
        metavar="HOST:PORT",
        help="where the web console listens (default: a free port on 127.0.0.1)",
    )
    up.add_argument(
        "--state-dir",
        type=Path,
        metavar="DIR",
        help="keep the NATS store, certificates and logs here (default: a temporary folder)",
    ).complete = shtab.DIRECTORY  # type: ignore[attr-defined]
    up.add_argument(
        "--no-demo-job",
        dest="demo_job",
        action="store_false",
        help="do not run the demo training job (admitted, scheduled, checkpointed, resumed)",
    )
    up.add_argument(
        "--nats-cluster",
        type=flags.replicas,
        default=1,
        metavar="N",
        help="run the embedded NATS as a JetStream cluster of N servers on loopback, "
        "every stream on three of them (default: 1 server)",
    )


def _convert_flags(conv: argparse.ArgumentParser) -> None:
    conv.add_argument(
        "amount",
        metavar="AMOUNT",
        help="how much: a number, VRAM with its unit (16Gi, 16384Mi), or a device count",
    )
    conv.add_argument(
        "unit", metavar="UNIT", help=f"{'|'.join(UNITS)}, or a model (VENDOR/MODEL, any case)"
    )
    conv.add_argument("--to", required=True, metavar="VENDOR/MODEL", help="the target model")


def _place_flags(place: argparse.ArgumentParser) -> None:
    place.add_argument(
        "--vram", type=flags.vram_mib, metavar="SIZE", help="VRAM with its unit, e.g. 16Gi"
    )
    for unit in ("tflops-fp16", "tflops-bf16", "tflops-fp32"):
        place.add_argument(
            f"--{unit}",
            type=flags.positive_number,
            metavar="N",
            help=f"dense {unit[7:].upper()} TFLOPS the pod needs",
        )
    place.add_argument(
        "--acu",
        type=flags.positive_number,
        metavar="N",
        help="compute in ACU (1 ACU = 1 %% of an A100-80G's dense FP16)",
    )
    place.add_argument(
        "--devices", type=flags.device_count, metavar="N", help="whole devices the pod needs"
    )
    place.add_argument(
        "--vendors", type=flags.names, default=(), metavar="A,B", help="only these vendors"
    )
    place.add_argument(
        "--models",
        type=flags.names,
        default=(),
        metavar="M,N",
        help="preferred models (VENDOR/MODEL or a model name, any case)",
    )
    place.add_argument(
        "--substitution",
        choices=["allow", "ask", "deny"],
        default="deny",
        help="another model when the named ones have no room: allow, ask (an offer), deny",
    )
    place.add_argument("--job", help="the job this pod belongs to (checkpoint, gang)")
    place.add_argument(
        "--topology",
        choices=["high-bandwidth", "any"],
        default="any",
        help="high-bandwidth: devices joined by NVLink/HCCS/xGMI on one node",
    )
    place.add_argument("--namespace", default="default", help="namespace (for its quota)")
    place.add_argument(
        "--timeout",
        dest="timeout_s",
        type=flags.positive_number,
        default=2.0,
        metavar="SECONDS",
        help="wait this long for a scheduler's answer (default 2)",
    )


def main(argv: Sequence[str] | None = None) -> int:
    url = "NATS"
    try:
        args = build_parser().parse_args(argv)
        settings = load(path=args.config)
        if args.nats_url:
            settings = replace(settings, bus={"url": args.nats_url})
        elif _follows_context(args):
            settings = _from_context(settings)
        url = redact_url(settings.bus.url)
        if args.command != "up" and "HCS_TELEMETRY__LOG_LEVEL" not in os.environ:
            # A command's output is its answer; logs only when something is wrong.
            settings = replace(settings, telemetry={"log_level": "warning"})
        configure(settings.telemetry, service=f"hcs-{args.command}")
        return asyncio.run(_dispatch(args, settings))
    except ConfigError as exc:
        return _fail(str(exc), code=2)
    except HcsError as exc:
        return _fail(str(exc), code=1)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the last resort: one line, never a traceback
        _log.debug("command_failed", exc_info=exc)
        return _fail(_explain(exc, url=url), code=1)


LOCAL_COMMANDS = frozenset({"up", "convert", "models", "certs", "completion"})


def _follows_context(args: argparse.Namespace) -> bool:
    """A bus command given no bus: the running ``hcs up``'s, unless settings name one."""
    explicit = args.config or os.environ.get("HCS_CONFIG") or os.environ.get("HCS_BUS__URL")
    return args.command not in LOCAL_COMMANDS and not explicit


def _from_context(settings: Settings) -> Settings:
    from hcs import context

    found = context.read()
    return settings if found is None else replace(settings, bus={"url": found.bus_url})


def _fail(message: str, *, code: int) -> int:
    line = " ".join(message.split())  # one line, whatever the message held
    print(f"hcs: error: {line}", file=sys.stderr)
    return code


def _explain(exc: Exception, *, url: str) -> str:
    """A third-party error from the bus as one sentence for the user."""
    if isinstance(exc, nats.js.errors.ServiceUnavailableError | nats.errors.NoRespondersError):
        return f"NATS at {url} does not answer JetStream requests (start nats-server with -js)"
    if isinstance(exc, nats.js.errors.NotFoundError):
        return (
            f"NATS at {url} is not an HCS bus: it has no HCS streams "
            f"({exc.description or 'not found'}); point --nats-url at the bus HCS runs on, "
            "or start one with hcs up"
        )
    if isinstance(exc, nats.errors.ConnectionClosedError | TimeoutError):
        return f"NATS at {url} stopped answering ({type(exc).__name__})"
    if isinstance(exc, nats.errors.Error):
        return f"NATS at {url}: {exc}"
    return (
        f"unexpected {type(exc).__name__}: {exc} "
        "(HCS_TELEMETRY__LOG_LEVEL=debug shows where it came from)"
    )


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    command = args.command
    if command == "up":
        return await _up(args, settings)
    if command == "convert":
        return commands.convert(amount=args.amount, unit=args.unit, to=args.to)
    if command == "models":
        return commands.list_models(vendor=args.vendor, as_json=args.json)
    if command == "certs":
        return commands.certs(args)
    if command == "completion":
        print(shtab.complete(build_parser(), shell=args.shell))
        return 0
    request = commands.plan_request(args) if command == "place" else None  # checked first
    bus = await connect(settings.bus, name=f"hcs-{command}", give_up_after_s=args.connect_timeout_s)
    try:
        if command == "top":
            once = args.once or args.json
            return await _top(bus, settings, once=once, as_json=args.json, limit=args.limit)
        if command == "bus" and args.bus_command == "compact":
            return await commands.bus_compact(bus, older_than_s=args.older_than_s)
        if command == "bus":
            return await commands.bus_init(bus, settings, replicas=args.replicas)
        if request is not None:
            return await commands.place(bus, request, timeout_s=args.timeout_s)
        if command == "watch":
            return await commands.watch(bus, args.subject, count=args.count, last=args.last)
        if command == "check":
            return await _check(bus, settings, settle_s=args.settle_s)
        if command == "queue":
            from hcs import queue

            return await queue.run(bus, settings, as_json=args.json, now=time.time())
        if command == "kueue":
            from hcs import kueue

            return await kueue.run(bus, settings, namespaces=args.namespaces)
        if command == "usage":
            from hcs import usage

            now = time.time()  # the window ends now (wall clock: event times are Unix seconds)
            return await usage.run(
                bus,
                settings,
                namespace=args.namespace,
                since_s=args.since_s,
                as_json=args.json,
                now=now,
            )
    finally:
        await bus.nc.close()
    raise ConfigError(f"unknown command {command!r}")


async def _check(bus: Bus, settings: Settings, *, settle_s: float) -> int:
    from hcs_bus import kube as kube_mod
    from scheduler.ledger import audit_store as checking
    from scheduler.ledger import pledge_audit_rules as pledgecheck

    kube = await kube_mod.connect(settings.kube)
    if kube is None:
        raise ConfigError("hcs check needs a cluster: set KUBECONFIG or run in-cluster")
    try:
        limits = pledgecheck.Limits(
            ttl_s=settings.scheduler.pledge_ttl_s,
            orphan_after_s=settings.scheduler.pledge_unclaimed_s,
        )
        return await checking.run(bus, kube, settle_s=settle_s, limits=limits)
    finally:
        await kube.close()


async def _up(args: argparse.Namespace, settings: Settings) -> int:
    from hcs.up import UpOptions, run

    options = UpOptions(
        nats_url=args.nats_url,
        fleet=args.fleet or _default_fleet(),
        for_s=args.for_s,
        extender=await _listen_address(args.extender, flag="--extender"),
        webhook=await _listen_address(args.webhook, flag="--webhook"),
        console=await _listen_address(args.console, flag="--console"),
        state_dir=args.state_dir,
        demo_job=args.demo_job,
        nats_cluster=args.nats_cluster,
    )
    if args.nats_url and args.nats_cluster > 1:
        raise ConfigError("hcs up: --nats-cluster starts its own servers; drop --nats-url")
    if args.nats_url:  # an unreachable NATS is one line now, not a hang later
        probe = await connect(settings.bus, name="hcs-up", give_up_after_s=args.connect_timeout_s)
        await probe.nc.close()
    return await run(settings, options)


async def _listen_address(host_port: tuple[str, int] | None, *, flag: str) -> str:
    """Where a server of ``hcs up`` listens: a free port on 127.0.0.1 when the
    flag is not given, else the address asked for, which must be free now."""
    if host_port is None:
        return f"127.0.0.1:{free_port()}"
    address = await _bind_address(host_port, flag=flag)
    host, _, port = address.rpartition(":")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            raise ConfigError(
                f"hcs up: {flag} {address}: {exc.strerror or exc}; "
                f"give {flag} another HOST:PORT, or leave {flag} out for a free port"
            ) from None
    return address


async def _bind_address(host_port: tuple[str, int], *, flag: str) -> str:
    """``HOST:PORT`` with the host as an IP address (the serving certificate
    names it): ``localhost:8443`` becomes ``127.0.0.1:8443``."""
    host, port = host_port
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise ConfigError(
            f"hcs up: {flag}: cannot resolve {host!r}: {exc.strerror or exc}"
        ) from exc
    families = sorted(found, key=lambda info: info[0] != socket.AF_INET)  # IPv4 first
    address = str(families[0][4][0])
    return f"{address}:{port}"


def _default_fleet() -> Path:
    if DEFAULT_FLEET.is_file():
        return DEFAULT_FLEET
    return Path(__file__).resolve().parent.parent / DEFAULT_FLEET


# -- top --------------------------------------------------------------------
async def show_top(
    bus: Bus,
    settings: Settings,
    *,
    live: bool,
    stop: asyncio.Event,
    period_s: float = 1.0,
    view: ClusterView | None = None,
) -> None:
    """Draw ``hcs top`` until ``stop``: a screen that fits the terminal when
    ``live``, progress lines otherwise. ``view``: a ClusterView already
    running (``hcs up`` shares its own)."""
    from hcs.alerts import recent

    own = view is None
    if view is None:
        view = ClusterView(bus, settings=settings.scheduler, health_replay_s=600.0)
        await view.start()
    alerts: deque[HealthEvent] = deque(await recent(bus), maxlen=50)
    sub = await _collect_alerts(bus, alerts)
    try:
        if live:
            await _draw_live(bus, view, alerts=alerts, stop=stop, period_s=period_s)
        else:
            await _print_progress(bus, view, alerts=alerts, stop=stop, period_s=period_s)
    finally:
        await sub.unsubscribe()
        if own:
            await view.stop()


async def _draw_live(
    bus: Bus, view: ClusterView, *, alerts: deque[HealthEvent], stop: asyncio.Event, period_s: float
) -> None:
    from rich.console import Console
    from rich.live import Live

    from hcs.screen import layout
    from hcs.top import summarise

    console = Console()
    with Live(console=console, screen=True, auto_refresh=False, redirect_stderr=False) as screen:
        while not stop.is_set():
            checkpoints = await _checkpoints(bus, view.state)
            summary = summarise(view.state, alerts=alerts, checkpoints=checkpoints)
            width, height = console.size
            screen.update(layout(summary, width=width, height=height), refresh=True)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period_s):
                    await stop.wait()


async def _print_progress(
    bus: Bus, view: ClusterView, *, alerts: deque[HealthEvent], stop: asyncio.Event, period_s: float
) -> None:
    from hcs.top import ALERTS_SHOWN, render, summarise

    tick = 0
    while not stop.is_set():
        if tick % 5 == 0:
            checkpoints = await _checkpoints(bus, view.state)
            summary = summarise(view.state, alerts=alerts, checkpoints=checkpoints)
            print(_progress_line(summary), flush=True)
        tick += 1
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(period_s):
                await stop.wait()
    checkpoints = await _checkpoints(bus, view.state)
    last = summarise(view.state, alerts=alerts, checkpoints=checkpoints, limit=ALERTS_SHOWN)
    print(render(last), flush=True)


async def _checkpoints(bus: Bus, state: Any) -> dict[str, messages.CheckpointEvent]:
    """The latest checkpoint of every job that holds devices (KV ``hcs_ckpt``)."""
    from hcs_bus import checkpoint
    from scheduler.console.panels import job_keys

    found: dict[str, messages.CheckpointEvent] = {}
    for namespace, job in job_keys(state):
        last = await checkpoint.latest(bus, namespace=namespace, job=job)
        if last is not None:
            found[f"{namespace}/{job}"] = last
    return found


async def _collect_alerts(bus: Bus, alerts: deque[HealthEvent]) -> Any:
    from hcs.alerts import decoded

    async def on_msg(msg: Any) -> None:
        event = decoded(msg.subject, msg.data)  # forged or undecodable: not an alert
        if event is not None:
            alerts.append(event)

    return await bus.nc.subscribe(subjects.HEALTH_ALL, cb=on_msg)


def _progress_line(summary: dict[str, Any]) -> str:
    t = summary["totals"]
    last = summary["alerts"][0] if summary["alerts"] else None  # newest first
    tail = "".join(
        f" | job {j['job']} {j['pod']} on {j['node']} ({j['devices']}) "
        f"at {j['checkpoint'] or 'no checkpoint'}"
        for j in summary["jobs"]
    )
    if last:
        where = last["node"] + (f"/{last['device']}" if last["device"] is not None else "")
        tail += f" | last alert: {last['severity']} {last['verdict'] or last['kind']} on {where}"
    from hcs.top import acu_text, gib_text

    return (
        f"hcs: nodes {t['nodes']:.0f} devices {t['health']['text']} VRAM free "
        f"{gib_text(t['vram_free_mib'])}/{gib_text(t['vram_total_mib'])} GiB "
        f"ACU {acu_text(t['acu'])} alerts {len(summary['alerts'])}{tail}"
    )


async def _top(bus: Bus, settings: Settings, *, once: bool, as_json: bool, limit: int) -> int:
    from hcs.top import render, summarise

    if not once:
        stop = tasks.stop_event()
        await show_top(bus, settings, live=sys.stdout.isatty(), stop=stop)
        return 0
    view = ClusterView(bus, settings=settings.scheduler)
    await view.start()
    try:
        try:
            await view.wait_ready(timeout_s=30)
        except TimeoutError:
            raise BusTimeout(
                f"the fleet view from {redact_url(settings.bus.url)} did not load in 30 s"
            ) from None
        from hcs.alerts import recent

        checkpoints = await _checkpoints(bus, view.state)
        alerts = deque(await recent(bus), maxlen=50)
        summary = summarise(view.state, alerts=alerts, checkpoints=checkpoints, limit=limit)
    finally:
        await view.stop()
    print(json.dumps(summary, indent=2) if as_json else render(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
