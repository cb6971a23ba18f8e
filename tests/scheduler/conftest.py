"""A running scheduler replica on the test bus."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from hcs_bus.bus import Bus
from hcs_bus.settings import BusSettings, Settings
from scheduler.replica import Scheduler, run
from tests.scheduler.helpers import DB

Start = Callable[..., Awaitable[Scheduler]]


@pytest.fixture
async def start_scheduler(bus_settings: BusSettings) -> AsyncIterator[Start]:
    started: list[Scheduler] = []

    async def start(bus: Bus, kube: Any = None, *, http: bool = True, **cfg: Any) -> Scheduler:
        settings = Settings(bus=bus_settings)
        from hcs_bus.settings import replace

        settings = replace(settings, scheduler={"extender_port": 0, "console_port": 0, **cfg})
        sched = await run(bus, kube, settings, profiles=DB, http=http, summary_max_age_s=0.0)
        started.append(sched)
        await sched.view.wait_ready(timeout_s=10)
        return sched

    yield start
    for sched in started:
        await sched.stop()
