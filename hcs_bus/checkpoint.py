"""Checkpoint reporting for training code and sidecars (docs/architecture.md#subjects).

``report`` stores the latest checkpoint of one run of a job in KV
``hcs_ckpt`` under ``subjects.ckpt_key(namespace, job, run)`` and announces it
on ``subjects.ckpt(namespace, job)`` (core NATS, not a stream); ``latest``
reads it back. The scheduler's bind turns the KV entry of the pod's own run
(or of the run its ``hcs.io/resume-run`` names) into ``hcs.io/resume-from``
for a replacement pod (``HCS_RESUME_FROM`` in its env)::

    bus = await hcs_bus.bus.connect(settings.bus)
    await checkpoint.report(
        bus, namespace="ml", job="llama", run=uid, uri="s3://b/ckpt-900", step=900
    )

A key is ``<namespace>.<job>.<run>`` (``subjects.NO_RUN`` when the run is
unknown), writable only by that namespace's sidecar user
(``hcs_bus.permissions.sidecar``); the bucket's ``max_age``
(``bus.checkpoint_ttl_s``) expires a run's entry that long after its last
report. A new run of a job (a new owner UID) never finds the last run's
checkpoint under its own key. A reader believes an entry only when its key
and its body both name the namespace, job and run asked for
(``resume_point``): a resume point never crosses a namespace or a run.

The stored step only moves forward: the write is a compare-and-set on the
entry's revision, and a report whose step is not above the stored one (a late
or retried report) is ignored — ``Reported.stored`` is False and
``Reported.latest`` is the newer checkpoint kept.

``ask`` asks a job to checkpoint before a planned eviction (the healer's
before a device is isolated, the scheduler's before a reclaim): it reads
the latest checkpoint, sends a ``CheckpointRequest`` on
``hcs.ckpt.request.<ns>.<job>`` (core NATS; the job's sidecar turns it into a
file and a signal) and waits, at most ``wait_s``, for a newer one to be
reported.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass

import msgspec
from nats.js.errors import KeyNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from hcs_bus import kvcas, messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import BadMessage, BusUnavailable, HcsError
from hcs_bus.messages import CheckpointEvent, CheckpointRequest
from hcs_bus.streams import KV_CKPT, kv_stream, kv_subject
from hcs_bus.telemetry import logger

_log = logger("hcs.checkpoint")


@dataclass(frozen=True, slots=True)
class Reported:
    """What ``report`` did: ``stored`` False means a newer (or the same) step was
    already the job's latest, kept as ``latest``."""

    event: CheckpointEvent
    stored: bool
    latest: CheckpointEvent

    @property
    def step(self) -> int:
        return self.event.step

    @property
    def uri(self) -> str:
        return self.event.uri


async def report(
    bus: Bus,
    *,
    namespace: str,
    job: str,
    uri: str,
    step: int,
    run: str = "",
    framework: str = "",
    time_s: float | None = None,
) -> Reported:
    """Record a complete checkpoint as the job's latest (unless a step at least
    as high is stored already) and announce it when stored."""
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
        run=run,
    )
    try:
        kv = await bus.js.key_value(KV_CKPT)
    except NotFoundError as exc:
        raise BusUnavailable(f"KV bucket {KV_CKPT} missing (run hcs bus init)") from exc
    done = await _store(kv, event)
    if not done.stored:
        _log.info(
            "checkpoint_report_ignored",
            namespace=namespace,
            job=job,
            step=step,
            stored_step=done.latest.step,
        )
        return done
    await bus.nc.publish(subjects.ckpt(namespace, job), messages.encode(event))
    _log.info("checkpoint_reported", namespace=namespace, job=job, run=run, step=step, uri=uri)
    return done


async def _store(kv: KeyValue, event: CheckpointEvent) -> Reported:
    """Compare-and-set ``event`` over the stored entry while it is older
    (``hcs_bus.kvcas``: another reporter's write in between is judged again)."""
    key = subjects.ckpt_key(event.namespace, event.job, event.run)

    def later(stored: CheckpointEvent | None) -> kvcas.Change[CheckpointEvent, Reported]:
        if stored is not None and stored.step >= event.step:
            return kvcas.Keep(Reported(event, stored=False, latest=stored))
        return kvcas.Put(event, Reported(event, stored=True, latest=event))

    def decode(value: bytes) -> CheckpointEvent | None:
        """The stored event; None (overwritable) when not a CheckpointEvent."""
        try:
            return messages.decode(value, CheckpointEvent)
        except msgspec.MsgspecError as exc:
            _log.warning("checkpoint_entry_unreadable", key=key, error=str(exc))
            return None

    return await kvcas.update(kv, key, later, decode=decode, encode=messages.encode)


def resume_point(
    value: bytes | None, *, key: str, namespace: str, job: str, run: str = ""
) -> CheckpointEvent | None:
    """The checkpoint stored under ``key`` when it is run ``run`` of
    ``namespace``/``job``'s: the key and the body must both name them. A
    mismatch (another namespace's or run's body under this key, a key of
    another namespace) or an unreadable body is refused, logged, and None."""
    if not value:
        return None
    want = subjects.ckpt_key(namespace, job, run)
    try:
        event = messages.decode(value, CheckpointEvent)
    except Exception as exc:  # hostile bytes raise more than MsgspecError
        _log.warning("checkpoint_refused", key=key, want=want, reason=f"unreadable: {exc}")
        return None
    try:
        named = subjects.ckpt_key(event.namespace, event.job, event.run)
    except ValueError:  # a body naming no valid key is nobody's
        named = f"{event.namespace}.{event.job}.{event.run}"
    if key != want or named != want:
        _log.warning(
            "checkpoint_refused",
            key=key,
            want=want,
            reason=f"key {key!r} holds a checkpoint of {named[:200]!r}",
        )
        return None
    return event


async def latest(
    bus: Bus, *, namespace: str, job: str, run: str | None = None
) -> CheckpointEvent | None:
    """The latest checkpoint reported by run ``run`` of the job (``run=None``:
    by any of its runs, the newest written: a ``STREAM.MSG.GET``, which the
    scheduler, healer and operator may send and a sidecar may not), or None
    when none was reported (or the entry is another namespace's, job's or
    run's: ``resume_point``)."""
    if run is None:
        return await _newest_run(bus, namespace=namespace, job=job)
    key = subjects.ckpt_key(namespace, job, run)
    kv = await bus.js.key_value(KV_CKPT)
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if not entry.value:
        return None
    _check(entry.value, key=key)
    return resume_point(entry.value, key=entry.key, namespace=namespace, job=job, run=run)


async def _newest_run(bus: Bus, *, namespace: str, job: str) -> CheckpointEvent | None:
    """The last entry written under any run of the job (one ``STREAM.MSG.GET``
    of the last message on ``<ns>.<job>.*``); None when it is a deletion."""
    prefix = kv_subject(KV_CKPT)[:-1]  # "$KV.hcs_ckpt."
    try:
        msg = await bus.js.get_msg(
            kv_stream(KV_CKPT), subject=prefix + subjects.ckpt_job_keys(namespace, job)
        )
    except NotFoundError:
        return None
    if not msg.data or (msg.headers or {}).get("KV-Operation") in ("DEL", "PURGE"):
        return None
    key = (msg.subject or "").removeprefix(prefix)
    _check(msg.data, key=key)
    run = key.rsplit(".", 1)[-1]
    run = "" if run == subjects.NO_RUN else run
    return resume_point(msg.data, key=key, namespace=namespace, job=job, run=run)


def _check(value: bytes, *, key: str) -> None:
    try:
        messages.decode(value, CheckpointEvent)
    except msgspec.MsgspecError as exc:
        raise BadMessage(f"KV {KV_CKPT} key {key} is not a CheckpointEvent: {exc}") from exc


def is_newer(after: CheckpointEvent | None, before: CheckpointEvent | None) -> bool:
    """Pure: is ``after`` a checkpoint taken after ``before``?"""
    if after is None:
        return False
    if before is None:
        return True
    return (after.step, after.time_s) > (before.step, before.time_s) or after.uri != before.uri


async def ask(
    bus: Bus, *, namespace: str, job: str, reason: str, wait_s: float, poll_s: float = 0.2
) -> CheckpointEvent | None:
    """Ask every rank of the job to checkpoint now and wait at most
    ``wait_s`` for the newer checkpoint; None when none came (or the request
    could not be sent: logged)."""
    try:
        before = await latest(bus, namespace=namespace, job=job)
        request = CheckpointRequest(
            namespace=namespace,
            job=job,
            reason=reason,
            request_id=uuid.uuid4().hex,
            deadline_s=wait_s,
        )
        await bus.nc.publish(subjects.ckpt_request(namespace, job), messages.encode(request))
    except (HcsError, subjects.SubjectError) as exc:  # a job name no subject can carry
        _log.warning("checkpoint_request_failed", namespace=namespace, job=job, error=str(exc))
        return None
    _log.info(
        "checkpoint_requested",
        namespace=namespace,
        job=job,
        request_id=request.request_id,
        before=before.step if before else None,
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + wait_s
    while loop.time() < deadline:
        await asyncio.sleep(poll_s)
        try:
            now = await latest(bus, namespace=namespace, job=job)
        except HcsError as exc:
            _log.warning("checkpoint_read_failed", namespace=namespace, job=job, error=str(exc))
            continue
        if now is not None and is_newer(now, before):
            _log.info(
                "checkpoint_arrived", namespace=namespace, job=job, step=now.step, uri=now.uri
            )
            return now
    _log.warning("checkpoint_wait_timed_out", namespace=namespace, job=job, wait_s=wait_s)
    return None
