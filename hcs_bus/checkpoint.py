"""Checkpoint reporting for training code and sidecars (DESIGN §1).

``report`` stores a job's latest checkpoint in KV ``hcs_ckpt`` under
``subjects.ckpt_key(namespace, job)`` and announces it on
``subjects.ckpt(namespace, job)`` (core NATS, not a stream); ``latest`` reads
it back. The scheduler's bind turns the KV entry into ``hcs.io/resume-from``
for a replacement pod of the same job (``HCS_RESUME_FROM`` in its env)::

    bus = await hcs_bus.bus.connect(settings.bus)
    await checkpoint.report(bus, namespace="ml", job="llama", uri="s3://b/ckpt-900", step=900)
"""

from __future__ import annotations

import time

import msgspec
from nats.js.errors import KeyNotFoundError, NotFoundError

from hcs_bus import messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BadMessage, BusUnavailable
from hcs_bus.messages import CheckpointEvent
from hcs_bus.streams import KV_CKPT
from hcs_bus.telemetry import logger

_log = logger("hcs.checkpoint")


async def report(
    bus: Bus,
    *,
    namespace: str,
    job: str,
    uri: str,
    step: int,
    framework: str = "",
    time_s: float | None = None,
) -> CheckpointEvent:
    """Record a complete checkpoint as the job's latest and announce it."""
    if not uri:
        raise ValueError("checkpoint uri must not be empty")
    if step < 0:
        raise ValueError(f"checkpoint step must be >= 0, got {step}")
    event = CheckpointEvent(
        namespace=namespace,
        job=job,
        uri=uri,
        step=step,
        time_s=time.time() if time_s is None else time_s,
        framework=framework,
    )
    key = subjects.ckpt_key(namespace, job)
    data = messages.encode(event)
    try:
        kv = await bus.js.key_value(KV_CKPT)
        await kv.put(key, data)
        await bus.nc.publish(subjects.ckpt(namespace, job), data)
    except NotFoundError as exc:
        raise BusUnavailable(f"KV bucket {KV_CKPT} missing (run hcs bus init)") from exc
    _log.info("checkpoint_reported", namespace=namespace, job=job, step=step, uri=uri)
    return event


async def latest(bus: Bus, *, namespace: str, job: str) -> CheckpointEvent | None:
    """The job's latest reported checkpoint, or None when none was reported."""
    key = subjects.ckpt_key(namespace, job)
    kv = await bus.js.key_value(KV_CKPT)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if not entry.value:
        return None
    try:
        return messages.decode(entry.value, CheckpointEvent)
    except msgspec.MsgspecError as exc:
        raise BadMessage(f"KV {KV_CKPT} key {key} is not a CheckpointEvent: {exc}") from exc
