"""The bodies of ``hcs bus init``, ``models``, ``convert``, ``place``,
``watch`` and ``certs``; ``hcs.cli`` parses the flags and calls them.

Each returns the exit code: 0 done, 1 refused (a plan, a stream); a wrong
value raises ConfigError (exit 2) naming the flag and the value.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from nats.js.errors import NotFoundError

from hcs import flags, models, plans
from hcs_bus import messages, profiles, streams, tasks
from hcs_bus.bus import Bus
from hcs_bus.errors import BusTimeout, ConfigError
from hcs_bus.settings import Settings, replace


async def bus_init(bus: Bus, settings: Settings, *, replicas: int | None) -> int:
    bus_settings = settings.bus
    if replicas is not None:
        bus_settings = replace(settings, bus={"replicas": replicas}).bus
    outcomes = await streams.init(bus, bus_settings)
    print(streams.render(outcomes))
    return 1 if any(o.action == "refused" for o in outcomes) else 0


async def bus_compact(bus: Bus, *, older_than_s: float) -> int:
    """Purge the delete markers older than ``older_than_s`` that released pod
    claims, pledges and checkpoints leave in the ledger's KV buckets, so every
    watch does not replay one marker per pod ever placed. The operator's
    credential only: no part of HCS may purge a stream."""
    for bucket in (streams.KV_ALLOC, streams.KV_CKPT):
        kv = await bus.js.key_value(bucket)
        before = (await kv.status()).values
        await kv.purge_deletes(olderthan=int(older_than_s))
        after = (await kv.status()).values
        print(f"{bucket}: {before - after} delete markers purged, {after} entries kept")
    return 0


def list_models(*, vendor: str | None, as_json: bool) -> int:
    vendors = sorted({p.vendor for p in profiles.load().all()})
    if vendor is not None and vendor not in vendors:
        raise ConfigError(
            f"hcs models: --vendor: unknown vendor {vendor!r}; known: {', '.join(vendors)}"
        )
    found = models.rows(profiles.load(), vendor=vendor)
    print(json.dumps(found, indent=2) if as_json else models.table(found))
    return 0


def convert(*, amount: str, unit: str, to: str) -> int:
    db = profiles.load()
    target = _profile(db, to, flag="hcs convert: --to")
    if unit.lower() in profiles.UNITS:
        result = _convert_amount(amount, unit.lower(), target)
    else:
        source = _source(db, unit)
        try:
            count = flags.device_count(amount)
        except argparse.ArgumentTypeError as exc:
            raise ConfigError(f"hcs convert: AMOUNT: {exc}") from None
        result = profiles.equivalent(source, count, target)
    print(result.arithmetic)
    print(f"= {result.devices} × {target.key}")
    return 0


def _convert_amount(amount: str, unit: str, target: profiles.Profile) -> profiles.Conversion:
    try:
        value = flags.vram_mib(amount) if unit == "vram" else flags.positive_number(amount)
    except argparse.ArgumentTypeError as exc:
        raise ConfigError(f"hcs convert: AMOUNT: {exc}") from None
    try:
        return profiles.convert_amount(value, unit, target)
    except ValueError as exc:
        raise ConfigError(f"hcs convert: UNIT: {exc}") from exc


def _source(db: profiles.ProfileDB, unit: str) -> profiles.Profile:
    if "/" in unit:
        return _profile(db, unit, flag="hcs convert: UNIT")
    try:
        return models.resolve(db, unit)
    except KeyError:
        raise ConfigError(
            f"hcs convert: UNIT: {unit!r} is neither a unit ({'|'.join(profiles.UNITS)}) "
            "nor a known model (hcs models lists them)"
        ) from None


def _profile(db: profiles.ProfileDB, text: str, *, flag: str) -> profiles.Profile:
    try:
        return models.resolve(db, text)
    except KeyError as exc:
        raise ConfigError(f"{flag}: {exc.args[0] if exc.args else text}") from None


def plan_request(args: argparse.Namespace) -> messages.PlanRequest:
    """The request ``hcs place`` sends; ConfigError when it asks for nothing
    or names a vendor or model nobody knows."""
    asked = (args.vram, args.tflops_fp16, args.tflops_bf16, args.tflops_fp32, args.acu)
    if all(a is None for a in asked) and args.devices is None:
        raise ConfigError(
            "hcs place: say what the pod needs: --vram, --tflops-fp16/-bf16/-fp32, --acu "
            "or --devices"
        )
    db = profiles.load()
    known = sorted({p.vendor for p in db.all()})
    for vendor in args.vendors:
        if vendor.lower() not in known:
            raise ConfigError(
                f"hcs place: --vendors: unknown vendor {vendor!r}; known: {', '.join(known)}"
            )
    for model in args.models:
        _profile(db, model, flag="hcs place: --models")
    return messages.PlanRequest(
        namespace=args.namespace,
        requests=messages.Requests(
            vram_mib=args.vram or 0,
            tflops_fp16=args.tflops_fp16 or 0.0,
            tflops_bf16=args.tflops_bf16 or 0.0,
            tflops_fp32=args.tflops_fp32 or 0.0,
            acu=args.acu or 0.0,
            devices=args.devices,
        ),
        policy=messages.Policy(
            vendors=tuple(v.lower() for v in args.vendors),
            models=tuple(args.models),
            substitution=args.substitution,
            job=args.job,
            topology=args.topology,
        ),
        dry_run=True,
    )


async def place(bus: Bus, request: messages.PlanRequest, *, timeout_s: float) -> int:
    from scheduler.plan.service import ask_plan

    try:
        plan = await ask_plan(bus, request, timeout_s=timeout_s)
    except BusTimeout as exc:
        raise BusTimeout(
            f"no scheduler answered within {timeout_s:g} s (is one running? hcs up starts one)"
        ) from exc
    print(plans.render(plan))
    return 0 if plan.ok else 1


REPLAY_SCAN = 5000  # messages of the stream looked back over for --last


async def watch(bus: Bus, subject: str, *, count: int | None, last: int | None = None) -> int:
    """Print ``subject``'s messages as JSON lines: first the last ``last`` the
    bus kept (with ``--last``), then new ones as they come; stderr says it waits."""
    done = asyncio.Event()
    seen = 0

    def show(msg_subject: str, data: bytes) -> None:
        nonlocal seen
        print(json.dumps({"subject": msg_subject, **_body(data)}), flush=True)
        seen += 1
        if count is not None and seen >= count:
            done.set()

    for msg_subject, data in await _kept(bus, subject, last=last) if last else ():
        show(msg_subject, data)
    if done.is_set():
        return 0

    async def on_msg(msg: Any) -> None:
        show(msg.subject, msg.data)

    sub = await bus.nc.subscribe(subject, cb=on_msg)
    await bus.nc.flush()  # the subscription is live before we wait
    print(f"hcs watch: waiting for messages on {subject} (Ctrl-C stops)", file=sys.stderr)
    stop = tasks.stop_event()
    waits = [asyncio.create_task(done.wait()), asyncio.create_task(stop.wait())]
    await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    for task in waits:
        task.cancel()
    await sub.unsubscribe()
    return 0


def _body(data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
    except ValueError:
        return {"undecodable": data.decode(errors="replace")}
    return body if isinstance(body, dict) else {"data": body}


async def _kept(bus: Bus, subject: str, *, last: int) -> list[tuple[str, bytes]]:
    """The newest ``last`` messages on ``subject`` its stream keeps, oldest first."""
    try:
        stream = await bus.js.find_stream_name_by_subject(subject)
    except NotFoundError:
        if subject.startswith("hcs."):
            raise  # an HCS subject no stream keeps: this server is not an HCS bus
        raise ConfigError(
            f"hcs watch: --last: no stream keeps {subject!r}, so there is nothing to replay"
        ) from None
    info = await bus.js.stream_info(stream)
    found: list[tuple[str, bytes]] = []
    seq = info.state.last_seq
    floor = max(info.state.first_seq, info.state.last_seq - REPLAY_SCAN + 1)
    while seq and seq >= floor and len(found) < last:
        try:
            raw = await bus.js.get_msg(stream, seq)
        except NotFoundError:  # deleted or aged out meanwhile
            raw = None
        if raw is not None and raw.subject and subject_matches(subject, raw.subject):
            found.append((raw.subject, raw.data or b""))
        seq -= 1
    return found[::-1]


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: ``*`` one token, ``>`` the rest (one or more)."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


def certs(args: argparse.Namespace) -> int:
    from hcs_bus.certs import make_dev_certs

    try:
        made = make_dev_certs(args.out, dns=list(args.dns), ips=list(args.ip), client=args.client)
    except OSError as exc:
        where = exc.filename or args.out
        raise ConfigError(f"hcs certs: --out: cannot write {where}: {exc.strerror or exc}") from exc
    extra = ", client.crt, client.key" if args.client else ""
    print(f"wrote {args.out}: ca.crt, tls.crt, tls.key{extra}")
    print(f"caBundle: {made.ca_bundle_b64}")
    return 0
