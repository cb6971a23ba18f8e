"""Asking jobs to checkpoint before a planned eviction (docs/architecture.md#subjects).

For each job with pods on a degraded device: ``hcs_bus.checkpoint.ask``
(read its latest checkpoint from KV ``hcs_ckpt``, send a
``CheckpointRequest`` on ``hcs.ckpt.request.<ns>.<job>``, wait at most
``wait_s`` for a newer one). The scheduler hands the KV entry to the
replacement pod as ``hcs.io/resume-from``.
"""

from __future__ import annotations

import asyncio

from hcs_bus import checkpoint
from hcs_bus.bus import Bus
from healer.bindings import Binding


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
        got = await checkpoint.ask(
            self.bus,
            namespace=namespace,
            job=job,
            reason=reason,
            wait_s=self.wait_s,
            poll_s=self.poll_s,
        )
        return got is not None
