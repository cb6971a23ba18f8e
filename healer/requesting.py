"""Asking jobs to checkpoint before a planned eviction (docs/architecture.md#subjects).

For each job with pods on a degraded device: read its latest checkpoint from
KV ``hcs_ckpt``, send a ``CheckpointRequest`` on ``hcs.ckpt.request.<ns>.<job>``
(core NATS; the job's sidecar turns it into a file and a signal), then wait —
at most ``wait_s`` — for a newer checkpoint to appear in KV. The scheduler
hands the KV entry to the replacement pod as ``hcs.io/resume-from``.
"""

from __future__ import annotations

import asyncio
import uuid

from hcs_bus import checkpoint, messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.errors import HcsError
from hcs_bus.messages import CheckpointEvent, CheckpointRequest
from hcs_bus.telemetry import logger
from healer.bindings import Binding

_log = logger("hcs.healer.requesting")


def is_newer(after: CheckpointEvent | None, before: CheckpointEvent | None) -> bool:
    """Pure: is ``after`` a checkpoint taken after ``before``?"""
    if after is None:
        return False
    if before is None:
        return True
    return (after.step, after.time_s) > (before.step, before.time_s) or after.uri != before.uri


class CheckpointAsker:
    def __init__(self, bus: Bus, *, wait_s: float, poll_s: float = 0.2) -> None:
        self.bus = bus
        self.wait_s = wait_s
        self.poll_s = poll_s

    async def checkpoint_all(self, pods: list[Binding], *, reason: str) -> dict[str, bool]:
        """Ask every job among ``pods`` to checkpoint; job → whether one arrived in time."""
        jobs = sorted({(p.namespace, p.job) for p in pods if p.job})
        results = await asyncio.gather(
            *(self.checkpoint(ns, job, reason=reason) for ns, job in jobs)
        )
        return {f"{ns}/{job}": ok for (ns, job), ok in zip(jobs, results, strict=True)}

    async def checkpoint(self, namespace: str, job: str, *, reason: str) -> bool:
        try:
            before = await checkpoint.latest(self.bus, namespace=namespace, job=job)
            request = CheckpointRequest(
                namespace=namespace,
                job=job,
                reason=reason,
                request_id=uuid.uuid4().hex,
                deadline_s=self.wait_s,
            )
            await self.bus.nc.publish(
                subjects.ckpt_request(namespace, job), messages.encode(request)
            )
        except (HcsError, subjects.SubjectError) as exc:  # a job name no subject can carry
            _log.warning("checkpoint_request_failed", namespace=namespace, job=job, error=str(exc))
            return False
        _log.info(
            "checkpoint_requested",
            namespace=namespace,
            job=job,
            request_id=request.request_id,
            before=before.step if before else None,
        )
        got = await self._wait_newer(namespace, job, before)
        if got is None:
            _log.warning(
                "checkpoint_wait_timed_out", namespace=namespace, job=job, wait_s=self.wait_s
            )
            return False
        _log.info("checkpoint_arrived", namespace=namespace, job=job, step=got.step, uri=got.uri)
        return True

    async def _wait_newer(
        self, namespace: str, job: str, before: CheckpointEvent | None
    ) -> CheckpointEvent | None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        while loop.time() < deadline:
            await asyncio.sleep(self.poll_s)
            try:
                now = await checkpoint.latest(self.bus, namespace=namespace, job=job)
            except HcsError as exc:
                _log.warning("checkpoint_read_failed", namespace=namespace, job=job, error=str(exc))
                continue
            if is_newer(now, before):
                return now
        return None
