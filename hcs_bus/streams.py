"""The streams and KV buckets of docs/architecture.md#streams, created or updated idempotently
(``hcs bus init`` and every part at start). What the server holds is compared
with what the settings want (``hcs_bus.changes``) and only what differs is
touched, so a second run reports every one unchanged. Only nats-server 2.9
features are used (docs/architecture.md#bus-rules); the servers must be 2.10 or newer
(``hcs_bus.natsserver.MIN_VERSION``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError, ServerError

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.changes import changes
from hcs_bus.settings import BusSettings
from hcs_bus.telemetry import logger

FP = "HCS_FP"
HEALTH = "HCS_HEALTH"
ALLOC = "HCS_ALLOC"
DLQ = "HCS_DLQ"
KV_ALLOC = "hcs_alloc"
KV_CKPT = "hcs_ckpt"


def kv_stream(bucket: str) -> str:
    """The stream that holds KV ``bucket``."""
    return f"KV_{bucket}"


def kv_subject(bucket: str, key: str = ">") -> str:
    """The subject of ``key`` (or a wildcard) in KV ``bucket``."""
    return f"$KV.{bucket}.{key}"


_log = logger("hcs.streams")


def stream_configs(settings: BusSettings) -> list[StreamConfig]:
    r = settings.replicas
    # A replay must not dead-letter a message again (the copy's Nats-Msg-Id is
    # <stream>:<seq>): the DLQ remembers ids as long as it keeps letters, and
    # keeps them at least as long as the streams they came from.
    dlq_age_s = max(14 * 24 * 3600.0, settings.health_max_age_s, settings.alloc_max_age_s)
    common: dict[str, Any] = {
        "retention": RetentionPolicy.LIMITS,
        "storage": StorageType.FILE,
        "num_replicas": r,
        "duplicate_window": 120.0,
        "discard": DiscardPolicy.OLD,
    }
    return [
        StreamConfig(
            name=FP,
            subjects=[subjects.FP_ALL],
            max_msgs_per_subject=1,
            allow_direct=True,
            description="latest NodeFingerprint per node",
            **common,
        ),
        StreamConfig(
            name=HEALTH,
            subjects=[subjects.HEALTH_ALL],
            max_age=settings.health_max_age_s,
            max_msgs_per_subject=settings.health_max_per_node,
            description="HealthEvents and verdicts: the alert feed",
            **common,
        ),
        StreamConfig(
            name=ALLOC,
            subjects=[subjects.ALLOC_ALL],
            max_age=settings.alloc_max_age_s,
            max_msgs_per_subject=100_000,
            description="AllocationEvents: reserved / bound / released / expired",
            **common,
        ),
        StreamConfig(
            name=DLQ,
            subjects=[subjects.DLQ_ALL],
            max_bytes=1 << 30,
            description="dead letters copied by sequence with their reason",
            **{**common, "max_age": dlq_age_s, "duplicate_window": dlq_age_s},
        ),
    ]


def kv_configs(settings: BusSettings) -> list[KeyValueConfig]:
    return [
        KeyValueConfig(
            bucket=KV_ALLOC,
            history=1,
            replicas=settings.replicas,
            # every read answered by the stream's leader: a direct get may be
            # served by a replica behind it, and a decision taken on it (a
            # release that finds nothing to release) would be taken on the past
            direct=False,
            description="device reservations per node, written with compare-and-set",
        ),
        KeyValueConfig(
            bucket=KV_CKPT,
            history=1,
            replicas=settings.replicas,
            direct=True,
            ttl=settings.checkpoint_ttl_s,  # a run's entry expires this long after its last report
            description="latest CheckpointEvent per job run",
        ),
    ]


Action = Literal["created", "updated", "unchanged", "refused"]


@dataclass(frozen=True)
class Outcome:
    """What ``init`` did to one stream or bucket (``detail``: the fields changed,
    or the server's reason for a refusal)."""

    name: str
    action: Action
    detail: str = ""


async def init(bus: Bus, settings: BusSettings) -> list[Outcome]:
    """Create what is missing, update only what differs from ``settings``, leave
    the rest alone: safe to run any number of times, and each run says truthfully
    what it did. A refusal is reported and the others go on."""
    outcomes = [await _stream(bus, config) for config in stream_configs(settings)]
    outcomes += [await _bucket(bus, kv) for kv in kv_configs(settings)]
    by_action: dict[str, list[str]] = {}
    for outcome in outcomes:
        by_action.setdefault(outcome.action, []).append(outcome.name)
    _log.info("bus_initialised", **by_action)
    for outcome in outcomes:
        if outcome.action == "refused":
            _log.warning("stream_refused", stream=outcome.name, reason=outcome.detail)
    return outcomes


def render(outcomes: list[Outcome]) -> str:
    width = max(len(o.name) for o in outcomes)
    return "\n".join(
        f"{o.name:<{width}}  {o.action}" + (f" ({o.detail})" if o.detail else "") for o in outcomes
    )


async def _stream(bus: Bus, want: StreamConfig) -> Outcome:
    name = want.name or ""
    try:
        info = await bus.js.stream_info(name)
    except NotFoundError:
        return await _apply(bus, want, created=True)
    found = changes(want=want.as_dict(), have=info.config.as_dict())
    if not found:
        return Outcome(name, "unchanged")
    return await _apply(bus, want, created=False, detail="; ".join(found))


async def _bucket(bus: Bus, kv: KeyValueConfig) -> Outcome:
    name = kv_stream(kv.bucket)
    try:
        info = await bus.js.stream_info(name)
    except NotFoundError:
        try:
            await bus.js.create_key_value(kv)
        except (BadRequestError, ServerError) as exc:
            return Outcome(name, "refused", _why(exc))
        return Outcome(name, "created")
    ours: dict[str, Any] = {
        "description": kv.description,
        "max_msgs_per_subject": kv.history,
        "num_replicas": kv.replicas,
        "allow_direct": kv.direct,
        "max_age": kv.ttl,  # seconds here, nanoseconds on the wire
    }
    wire = {**ours, "max_age": None if kv.ttl is None else int(kv.ttl * 1_000_000_000)}
    found = changes(want=wire, have=info.config.as_dict())
    if not found:
        return Outcome(name, "unchanged")
    wanted = {k: v for k, v in ours.items() if v is not None}
    config = dataclasses.replace(info.config, **wanted)
    return await _apply(bus, config, created=False, detail="; ".join(found))


async def _apply(bus: Bus, config: StreamConfig, *, created: bool, detail: str = "") -> Outcome:
    name = config.name or ""
    try:
        if created:
            await bus.js.add_stream(config)
        else:
            await bus.js.update_stream(config)
    except (BadRequestError, ServerError) as exc:
        return Outcome(name, "refused", _why(exc))
    return Outcome(name, "created" if created else "updated", detail)


def _why(exc: BadRequestError | ServerError) -> str:
    return str(exc.description or exc)
