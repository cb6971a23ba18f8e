"""The streams and KV buckets of DESIGN §1, created or updated idempotently
(``hcs bus init``). Only nats-server 2.9 features are used (DESIGN §7.7)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nats.js.api import (
    DiscardPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError

from hcs_bus import subjects
from hcs_bus.bus import Bus
from hcs_bus.settings import BusSettings
from hcs_bus.telemetry import logger

FP = "HCS_FP"
HEALTH = "HCS_HEALTH"
ALLOC = "HCS_ALLOC"
DLQ = "HCS_DLQ"
KV_ALLOC = "hcs_alloc"
KV_CKPT = "hcs_ckpt"

_log = logger("hcs.streams")


def stream_configs(settings: BusSettings) -> list[StreamConfig]:
    r = settings.replicas
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
            max_age=14 * 24 * 3600.0,
            max_bytes=1 << 30,
            description="dead letters copied by sequence with their reason",
            **common,
        ),
    ]


def kv_configs(settings: BusSettings) -> list[KeyValueConfig]:
    return [
        KeyValueConfig(
            bucket=KV_ALLOC,
            history=1,
            replicas=settings.replicas,
            direct=True,
            description="device reservations per node, written with compare-and-set",
        ),
        KeyValueConfig(
            bucket=KV_CKPT,
            history=1,
            replicas=settings.replicas,
            direct=True,
            description="latest CheckpointEvent per job",
        ),
    ]


@dataclass(frozen=True)
class InitResult:
    created: list[str]
    updated: list[str]


async def init(bus: Bus, settings: BusSettings) -> InitResult:
    """Create what is missing, update what differs. Safe to run any number of times."""
    created: list[str] = []
    updated: list[str] = []
    for config in stream_configs(settings):
        assert config.name is not None
        try:
            await bus.js.stream_info(config.name)
        except NotFoundError:
            await bus.js.add_stream(config)
            created.append(config.name)
            continue
        try:
            await bus.js.update_stream(config)
        except BadRequestError as exc:
            _log.warning("stream_update_refused", stream=config.name, error=str(exc))
            continue
        updated.append(config.name)
    for kv in kv_configs(settings):
        try:
            await bus.js.key_value(kv.bucket)
            updated.append(f"KV_{kv.bucket}")
        except NotFoundError:
            await bus.js.create_key_value(kv)
            created.append(f"KV_{kv.bucket}")
    _log.info("bus_initialised", created=created, updated=updated)
    return InitResult(created, updated)
