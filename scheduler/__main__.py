"""``python -m scheduler``: one scheduler replica until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import contextlib
import signal

from hcs_bus import settings as settings_mod
from hcs_bus import streams
from hcs_bus.bus import connect
from hcs_bus.telemetry import configure
from scheduler.running import run


async def main() -> None:
    settings = settings_mod.load()
    configure(settings.telemetry, service="hcs-scheduler")
    bus = await connect(settings.bus, name="hcs-scheduler")
    await streams.init(bus, settings.bus)
    from hcs_bus import kube as kube_mod  # the adapter; None without a cluster

    kube = await kube_mod.connect(settings.kube)
    scheduler = await run(bus, kube, settings)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await scheduler.stop()
    if kube is not None:
        await kube.close()
    await bus.drain()


if __name__ == "__main__":
    asyncio.run(main())
