"""watch_nodes: the same list-then-watch as watch_pods, on Nodes — labels
changing arrive as MODIFIED, selectors are honoured, 410 Gone lists again,
and a BOOKMARK moves the point a watch resumes from."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from hcs_bus import tasks
from hcs_bus.kube import Kube
from tests.apiserver import ApiServer

Events = list[tuple[str, str, dict[str, str]]]


@pytest.fixture
async def node_events(kube: Kube) -> AsyncIterator[Callable[..., Any]]:
    """Start watch_nodes in a task; yields a starter returning (type, name, labels)
    of every event, and the event that is set once the first list was yielded."""
    seen: Events = []
    started: list[asyncio.Task[Any]] = []
    synced = asyncio.Event()

    async def consume(selectors: dict[str, str]) -> None:
        async for kind, node in kube.watch_nodes(synced=synced, **selectors):
            meta = node["metadata"]
            seen.append((kind, meta["name"], dict(meta.get("labels") or {})))

    def start(**selectors: str) -> tuple[Events, asyncio.Event]:
        started.append(tasks.start(consume(selectors), name="watch-nodes-test"))
        return seen, synced

    yield start
    await tasks.stop(*started)


async def _until(seen: Events, wanted: list[tuple[str, str]], *, timeout_s: float = 5.0) -> None:
    """Wait until ``wanted`` (type, name) pairs end what was seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while [(k, n) for k, n, _ in seen[-len(wanted) :]] != wanted:
        assert loop.time() < deadline, f"saw {seen}, waited for {wanted}"
        await asyncio.sleep(0.01)


def _lists(apiserver: ApiServer) -> int:
    return sum(r.verb == "list" and r.resource == "nodes" for r in apiserver.requests)


async def test_nodes_are_listed_then_label_changes_and_deletions_are_watched(
    apiserver: ApiServer, node_events: Callable[..., Any]
) -> None:
    apiserver.add_node("gpu-a", labels={"hcs.io/network-group": "ng-a"})
    seen, synced = node_events()
    await asyncio.wait_for(synced.wait(), 5)
    assert [(k, n) for k, n, _ in seen] == [("ADDED", "gpu-a")]

    apiserver.update_node("gpu-a", lambda n: n["metadata"]["labels"].pop("hcs.io/network-group"))
    apiserver.add_node("gpu-b", labels={"hcs.io/rdma-fabric": "ib-1"})
    apiserver.delete_node("gpu-a")

    await _until(seen, [("MODIFIED", "gpu-a"), ("ADDED", "gpu-b"), ("DELETED", "gpu-a")])
    assert "hcs.io/network-group" not in seen[1][2]
    assert seen[2][2]["hcs.io/rdma-fabric"] == "ib-1"


async def test_pod_changes_do_not_reach_a_node_watch(
    apiserver: ApiServer, node_events: Callable[..., Any]
) -> None:
    apiserver.add_node("gpu-a")
    seen, _ = node_events()
    await _until(seen, [("ADDED", "gpu-a")])
    await apiserver.until_watched()

    apiserver.add_pod("ml-team", "p", node="gpu-a")
    apiserver.add_node("gpu-b")

    await _until(seen, [("ADDED", "gpu-b")])
    assert [n for _, n, _ in seen] == ["gpu-a", "gpu-b"]


async def test_a_label_selector_reports_a_node_leaving_it_as_deleted(
    apiserver: ApiServer, node_events: Callable[..., Any]
) -> None:
    apiserver.add_node("gpu-a", labels={"hcs.io/vendor": "nvidia"})
    apiserver.add_node("cpu-a")
    seen, _ = node_events(label_selector="hcs.io/vendor")
    await _until(seen, [("ADDED", "gpu-a")])

    apiserver.update_node("gpu-a", lambda n: n["metadata"]["labels"].pop("hcs.io/vendor"))

    await _until(seen, [("DELETED", "gpu-a")])
    assert [n for _, n, _ in seen] == ["gpu-a", "gpu-a"]


async def test_a_field_selector_on_the_node_name_keeps_one_node(
    apiserver: ApiServer, node_events: Callable[..., Any]
) -> None:
    apiserver.add_node("gpu-a")
    apiserver.add_node("gpu-b")
    seen, _ = node_events(field_selector="metadata.name=gpu-b")
    await _until(seen, [("ADDED", "gpu-b")])
    await apiserver.until_watched()

    apiserver.update_node("gpu-a", lambda n: n["metadata"]["labels"].update(x="1"))
    apiserver.update_node("gpu-b", lambda n: n["metadata"]["labels"].update(x="2"))

    await _until(seen, [("MODIFIED", "gpu-b")])
    assert [n for _, n, _ in seen] == ["gpu-b", "gpu-b"]


async def test_after_410_gone_the_node_watch_lists_again_and_reports_the_difference(
    apiserver: ApiServer, node_events: Callable[..., Any]
) -> None:
    apiserver.add_node("stays", labels={"hcs.io/network-group": "ng-a"})
    apiserver.add_node("goes")
    seen, _ = node_events()
    await _until(seen, [("ADDED", "goes"), ("ADDED", "stays")])
    await apiserver.until_watched()

    async with apiserver.watch_outage():  # history compacted meanwhile
        apiserver.delete_node("goes")
        apiserver.add_node("comes")
        apiserver.update_node(
            "stays", lambda n: n["metadata"]["labels"].update({"hcs.io/network-group": "ng-b"})
        )

    await _until(seen, [("DELETED", "goes"), ("ADDED", "comes"), ("MODIFIED", "stays")])
    assert seen[-1][2]["hcs.io/network-group"] == "ng-b"
    assert _lists(apiserver) == 2


async def test_a_bookmark_moves_the_resume_point_so_compaction_needs_no_new_list(
    apiserver: ApiServer, node_events: Callable[..., Any]
) -> None:
    apiserver.add_node("gpu-a")
    seen, _ = node_events()
    await _until(seen, [("ADDED", "gpu-a")])
    await apiserver.until_watched()
    for i in range(3):  # the resourceVersion moves on without any node event
        apiserver.add_pod("ml-team", f"p{i}")

    apiserver.bookmark()  # carries the current resourceVersion
    apiserver.compact()  # a resume from the node's own version would be 410 Gone
    apiserver.close_watches()
    apiserver.add_node("gpu-b")

    await _until(seen, [("ADDED", "gpu-b")])
    assert [k for k, _, _ in seen] == ["ADDED", "ADDED"]  # the BOOKMARK itself is no event
    assert _lists(apiserver) == 1
