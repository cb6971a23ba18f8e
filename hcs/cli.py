"""The ``hcs`` command line: the composition root above every part.

    hcs up [--for S] [--nats-url URL] [--fleet FILE] [--extender H:P] [--webhook H:P]
    hcs top [--once] [--json]
    hcs bus init [--replicas N]
    hcs convert AMOUNT UNIT --to VENDOR/MODEL
        UNIT: tflops-fp16|tflops-bf16|tflops-fp32|acu|vram, or a model:
        hcs convert 1 nvidia/A100-80G --to hygon/K100
    hcs place --vram 16Gi [--tflops-fp16 N] [--acu N] [--devices N] [--vendors a,b] …
    hcs watch 'hcs.health.*'
    hcs certs --out DIR --dns NAME…

Bad flags or files print one line naming the field and value and exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from hcs_bus import messages, streams, subjects, tasks
from hcs_bus.bus import Bus, connect
from hcs_bus.errors import ConfigError, HcsError
from hcs_bus.messages import HealthEvent
from hcs_bus.settings import Settings, load, replace
from hcs_bus.telemetry import configure
from scheduler.viewing import ClusterView

DEFAULT_FLEET = Path("deploy/examples/fleet.yaml")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message}")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hcs", description="Heterogeneous-accelerator scheduler")
    parser.add_argument("--config", help="settings YAML (also HCS_CONFIG)")
    parser.add_argument("--nats-url", help="NATS server URL (default: settings / NATS_URL)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    up = sub.add_parser("up", help="run the whole stack on an embedded NATS and a simulated fleet")
    up.add_argument("--for", dest="for_s", type=float, help="stop cleanly after SECONDS")
    up.add_argument("--fleet", type=Path, default=None, help="fleet YAML")
    up.add_argument("--extender", default="127.0.0.1:8888", help="extender HOST:PORT")
    up.add_argument("--webhook", default="127.0.0.1:8443", help="webhook HOST:PORT")
    up.add_argument("--state-dir", type=Path, help="keep NATS store, certs and logs here")
    up.add_argument(
        "--no-demo-job",
        dest="demo_job",
        action="store_false",
        help="do not run the demo training job (admitted, scheduled, checkpointed, resumed)",
    )

    top = sub.add_parser("top", help="the unified fleet view")
    top.add_argument("--once", action="store_true")
    top.add_argument("--json", action="store_true")

    bus = sub.add_parser("bus", help="bus administration")
    bus_sub = bus.add_subparsers(dest="bus_command", required=True, parser_class=_Parser)
    init = bus_sub.add_parser("init", help="create or update streams and KV buckets")
    init.add_argument("--replicas", type=int, help="stream replicas (1 locally, 3 in a cluster)")

    conv = sub.add_parser("convert", help="equivalent device counts between models")
    conv.add_argument("amount", type=float)
    conv.add_argument("unit", help="tflops-fp16|tflops-bf16|tflops-fp32|acu|vram or VENDOR/MODEL")
    conv.add_argument("--to", required=True, help="target VENDOR/MODEL")

    place = sub.add_parser("place", help="ask the running scheduler for a plan")
    place.add_argument("--vram", default="0", help="e.g. 16Gi")
    for unit in ("tflops-fp16", "tflops-bf16", "tflops-fp32", "acu"):
        place.add_argument(f"--{unit}", type=float, default=0.0)
    place.add_argument("--devices", type=int)
    place.add_argument("--vendors", default="")
    place.add_argument("--models", default="")
    place.add_argument("--substitution", choices=["allow", "ask", "deny"], default="deny")
    place.add_argument("--job")
    place.add_argument("--topology", choices=["high-bandwidth", "any"], default="any")
    place.add_argument("--namespace", default="default")
    place.add_argument("--timeout", type=float, default=2.0)

    watch = sub.add_parser("watch", help="print bus messages as JSON lines")
    watch.add_argument("subject", nargs="?", default="hcs.health.*")
    watch.add_argument("--count", type=int, help="exit after N messages")

    certs = sub.add_parser("certs", help="development CA and serving certificate")
    certs.add_argument("--out", type=Path, required=True)
    certs.add_argument("--dns", nargs="+", default=["localhost"])
    certs.add_argument("--ip", nargs="*", default=["127.0.0.1"])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        settings = load(path=args.config)
        if args.nats_url:
            settings = replace(settings, bus={"url": args.nats_url})
        if args.command != "up" and "HCS_TELEMETRY__LOG_LEVEL" not in os.environ:
            # A command's output is its answer; logs only when something is wrong.
            settings = replace(settings, telemetry={"log_level": "warning"})
        configure(settings.telemetry, service=f"hcs-{args.command}")
        return asyncio.run(_dispatch(args, settings))
    except ConfigError as exc:
        print(f"hcs: error: {exc}", file=sys.stderr)
        return 2
    except HcsError as exc:
        print(f"hcs: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


async def _dispatch(args: argparse.Namespace, settings: Settings) -> int:
    command = args.command
    if command == "up":
        from hcs.up import UpOptions, run

        options = UpOptions(
            nats_url=args.nats_url,
            fleet=args.fleet or _default_fleet(),
            for_s=args.for_s,
            extender=args.extender,
            webhook=args.webhook,
            state_dir=args.state_dir,
            demo_job=args.demo_job,
        )
        return await run(settings, options)
    if command == "convert":
        return _convert(args)
    if command == "certs":
        return _certs(args)
    bus = await connect(settings.bus, name=f"hcs-{command}")
    try:
        if command == "top":
            return await _top(bus, settings, once=args.once, as_json=args.json)
        if command == "bus":
            return await _bus_init(bus, settings, replicas=args.replicas)
        if command == "place":
            return await _place(bus, args)
        if command == "watch":
            return await _watch(bus, args.subject, count=args.count)
    finally:
        await bus.nc.close()
    raise ConfigError(f"unknown command {command!r}")


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
    """Draw ``hcs top`` until ``stop`` (progress lines when not a terminal).
    ``view``: a ClusterView already running (``hcs up`` shares its own)."""
    from hcs.top import render, summarise

    own = view is None
    if view is None:
        view = ClusterView(bus, settings=settings.scheduler, health_replay_s=600.0)
        await view.start()
    alerts: deque[HealthEvent] = deque(maxlen=50)
    sub = await _collect_alerts(bus, alerts)
    tick = 0
    try:
        while not stop.is_set():
            checkpoints = await _checkpoints(bus, view.state)
            summary = summarise(view.state, alerts=alerts, checkpoints=checkpoints)
            if live:
                sys.stdout.write("\x1b[H\x1b[2J" + render(summary) + "\n")
                sys.stdout.flush()
            elif tick % 5 == 0:
                print(_progress_line(summary), flush=True)
            tick += 1
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(period_s):
                    await stop.wait()
        if not live:
            checkpoints = await _checkpoints(bus, view.state)
            print(render(summarise(view.state, alerts=alerts, checkpoints=checkpoints)), flush=True)
    finally:
        await sub.unsubscribe()
        if own:
            await view.stop()


async def _checkpoints(bus: Bus, state: Any) -> dict[str, messages.CheckpointEvent]:
    """The latest checkpoint of every job that holds devices (KV ``hcs_ckpt``)."""
    from hcs.top import job_keys
    from hcs_bus import checkpoint

    found: dict[str, messages.CheckpointEvent] = {}
    for namespace, job in job_keys(state):
        last = await checkpoint.latest(bus, namespace=namespace, job=job)
        if last is not None:
            found[f"{namespace}/{job}"] = last
    return found


async def _collect_alerts(bus: Bus, alerts: deque[HealthEvent]) -> Any:
    decode = messages.decoder_for(HealthEvent).decode

    async def on_msg(msg: Any) -> None:
        with contextlib.suppress(msgspec.MsgspecError):
            event = decode(msg.data)
            if event.severity != "info" or event.source == "healer":
                alerts.append(event)

    return await bus.nc.subscribe(subjects.HEALTH_ALL, cb=on_msg)


def _progress_line(summary: dict[str, Any]) -> str:
    t = summary["totals"]
    last = summary["alerts"][-1] if summary["alerts"] else None
    tail = "".join(
        f" | job {j['job']} {j['pod']} on {j['node']} ({j['devices']}) "
        f"at {j['checkpoint'] or 'no checkpoint'}"
        for j in summary["jobs"]
    )
    if last:
        where = last["node"] + (f"/{last['device']}" if last["device"] is not None else "")
        tail += f" | last alert: {last['severity']} {last['verdict'] or last['kind']} on {where}"
    return (
        f"hcs: nodes {t['nodes']:.0f} devices {t['devices']:.0f} "
        f"unhealthy {t['unhealthy_devices']:.0f} VRAM free {t['vram_free_mib'] / 1024:,.0f}/"
        f"{t['vram_total_mib'] / 1024:,.0f} GiB ACU {t['acu']:,.0f} "
        f"alerts {len(summary['alerts'])}{tail}"
    )


async def _top(bus: Bus, settings: Settings, *, once: bool, as_json: bool) -> int:
    from hcs.top import render, summarise

    if not once:
        stop = asyncio.Event()
        await show_top(bus, settings, live=sys.stdout.isatty(), stop=stop)
        return 0
    view = ClusterView(bus, settings=settings.scheduler)
    await view.start()
    try:
        await view.wait_ready(timeout_s=30)
        summary = summarise(view.state)
    finally:
        await view.stop()
    print(json.dumps(summary, indent=2) if as_json else render(summary))
    return 0


# -- bus, convert, place, watch, certs ----------------------------------------
async def _bus_init(bus: Bus, settings: Settings, *, replicas: int | None) -> int:
    bus_settings = settings.bus
    if replicas is not None:
        bus_settings = replace(settings, bus={"replicas": replicas}).bus
    result = await streams.init(bus, bus_settings)
    print(
        f"created: {', '.join(result.created) or '-'}; updated: {', '.join(result.updated) or '-'}"
    )
    return 0


def _convert(args: argparse.Namespace) -> int:
    from hcs_bus import profiles

    db = profiles.load()
    target = _profile(db, args.to, what="--to")
    if "/" in args.unit:
        source = _profile(db, args.unit, what="UNIT")
        if not math.isfinite(args.amount) or args.amount <= 0 or args.amount != int(args.amount):
            raise ConfigError(f"AMOUNT: {args.amount} must be a whole number of devices")
        result = profiles.equivalent(source, int(args.amount), target)
    else:
        try:
            result = profiles.convert_amount(args.amount, args.unit, target)
        except ValueError as exc:
            raise ConfigError(f"UNIT: {exc}") from exc
    print(result.arithmetic)
    print(f"= {result.devices} × {target.key}")
    return 0


def _profile(db: Any, key: str, *, what: str) -> Any:
    try:
        return db.get(key)
    except KeyError as exc:
        raise ConfigError(f"{what}: {exc.args[0] if exc.args else key}") from exc


async def _place(bus: Bus, args: argparse.Namespace) -> int:
    from hcs_bus.units import QuantityError, quantity_mib
    from scheduler.explaining import render_plan
    from scheduler.serving import ask_plan

    try:
        vram = quantity_mib(args.vram)
    except QuantityError as exc:
        raise ConfigError(f"--vram: {exc}") from exc
    request = messages.PlanRequest(
        namespace=args.namespace,
        requests=messages.Requests(
            vram_mib=vram,
            tflops_fp16=args.tflops_fp16,
            tflops_bf16=args.tflops_bf16,
            tflops_fp32=args.tflops_fp32,
            acu=args.acu,
            devices=args.devices,
        ),
        policy=messages.Policy(
            vendors=tuple(v for v in args.vendors.split(",") if v),
            models=tuple(m for m in args.models.split(",") if m),
            substitution=args.substitution,
            job=args.job,
            topology=args.topology,
        ),
        dry_run=True,
    )
    plan = await ask_plan(bus, request, timeout_s=args.timeout)
    print(render_plan(plan))
    return 0 if plan.ok else 1


async def _watch(bus: Bus, subject: str, *, count: int | None) -> int:
    done = asyncio.Event()
    seen = 0

    async def on_msg(msg: Any) -> None:
        nonlocal seen
        try:
            body = json.loads(msg.data)
        except ValueError:
            body = {"undecodable": msg.data.decode(errors="replace")}
        print(json.dumps({"subject": msg.subject, **body}), flush=True)
        seen += 1
        if count is not None and seen >= count:
            done.set()

    sub = await bus.nc.subscribe(subject, cb=on_msg)
    stop = tasks.stop_event()
    waits = [asyncio.create_task(done.wait()), asyncio.create_task(stop.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    await sub.unsubscribe()
    return 0


def _certs(args: argparse.Namespace) -> int:
    from injector.certs import make_dev_certs

    made = make_dev_certs(args.out, dns=list(args.dns), ips=list(args.ip))
    print(f"wrote {args.out}: ca.crt, tls.crt, tls.key")
    print(f"caBundle: {made.ca_bundle_b64}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
