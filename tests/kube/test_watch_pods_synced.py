"""watch_pods with ``synced``: set once every pod of the first list has been
taken, and with a schedulerName field selector only that scheduler's pods."""

from __future__ import annotations

import asyncio
from typing import Any

from hcs_bus import tasks
from hcs_bus.kube import Kube
from tests.apiserver import ApiServer

NS = "ml-team"


async def test_synced_is_set_after_the_first_list_of_the_schedulers_pods(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.add_pod(NS, "ours-1", phase="Pending", scheduler_name="hcs-scheduler")
    apiserver.add_pod(NS, "ours-2", phase="Pending", scheduler_name="hcs-scheduler")
    apiserver.add_pod(NS, "theirs", phase="Pending")
    synced = asyncio.Event()
    seen: list[tuple[str, str, bool]] = []

    async def consume() -> None:
        selector = "spec.schedulerName=hcs-scheduler"
        async for kind, pod in kube.watch_pods(field_selector=selector, synced=synced):
            seen.append((kind, pod["metadata"]["name"], synced.is_set()))

    task: asyncio.Task[Any] = tasks.start(consume(), name="watch-pods-synced-test")
    try:
        await asyncio.wait_for(synced.wait(), 5)
        assert sorted(seen) == [("ADDED", "ours-1", False), ("ADDED", "ours-2", False)]
        apiserver.add_pod(NS, "theirs-2", phase="Pending")
        apiserver.add_pod(NS, "ours-3", phase="Pending", scheduler_name="hcs-scheduler")
        async with asyncio.timeout(5):
            while len(seen) < 3:
                await asyncio.sleep(0.01)
        assert seen[2] == ("ADDED", "ours-3", True)
    finally:
        await tasks.stop(task)
