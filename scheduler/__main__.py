"""``python -m scheduler``: one scheduler replica until SIGTERM/SIGINT."""

from __future__ import annotations

import sys

from hcs_bus import settings as settings_mod
from hcs_bus import streams, tasks
from hcs_bus.bus import connect
from hcs_bus.telemetry import configure
from scheduler.replica import run


async def main() -> None:
    settings = settings_mod.load()
    configure(settings.telemetry, service="hcs-scheduler")
    bus = await connect(settings.bus, name="hcs-scheduler")
    await streams.init(bus, settings.bus)
    from hcs_bus import kube as kube_mod  # the adapter; None without a cluster

    kube = await kube_mod.connect(settings.kube)
    scheduler = await run(bus, kube, settings)
    tasks.long_lived()
    await tasks.stop_event().wait()
    await scheduler.stop()
    if kube is not None:
        await kube.close()
    await bus.drain()


if __name__ == "__main__":
    sys.exit(tasks.run_part(main, service="hcs-scheduler"))
