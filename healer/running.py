"""Running the healer: ``run(bus, kube, settings)`` for ``hcs up`` and ``python -m healer``."""

from __future__ import annotations

import asyncio
import os
import socket

from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.settings import Settings, replace
from hcs_bus.telemetry import logger
from healer.healing import Healer

_log = logger("hcs.healer")


def identity() -> str:
    """Lease holder identity: pod name (hostname) and pid, as client-go does."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


async def run(bus: Bus, kube: Kube | None, settings: Settings) -> None:
    """Heal until cancelled. Without a cluster: dry run, said once in the log."""
    if kube is None and not settings.healer.dry_run:
        _log.warning(
            "healer_dry_run",
            reason="no Kubernetes cluster configured: actions are "
            "published as kind=action events, nothing is applied",
        )
        settings = replace(settings, healer={"dry_run": True})
    elif settings.healer.dry_run:
        _log.info("healer_dry_run", reason="settings.healer.dry_run")
    healer = Healer(bus, kube, settings.healer, identity=identity())
    await healer.start()
    try:
        await asyncio.Event().wait()
    finally:
        await healer.stop()
