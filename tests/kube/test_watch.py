"""watch_pods: list then watch, resumed from the last resourceVersion, and a
fresh list (with the difference as events) after 410 Gone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest

from hcs_bus import tasks
from hcs_bus.errors import KubeError
from hcs_bus.kube import Kube
from tests.apiserver import ApiServer

NS = "ml-team"
Events = list[tuple[str, str]]


@pytest.fixture
async def events(kube: Kube) -> AsyncIterator[Callable[..., Any]]:
    """Start watch_pods in a task; yields a starter returning the (type, name) list."""
    seen: Events = []
    started: list[asyncio.Task[Any]] = []

    async def consume(field_selector: str | None) -> None:
        async for kind, pod in kube.watch_pods(field_selector=field_selector):
            seen.append((kind, pod["metadata"]["name"]))

    def start(field_selector: str | None = None) -> Events:
        started.append(tasks.start(consume(field_selector), name="watch-pods-test"))
        return seen

    yield start
    await tasks.stop(*started)


async def _until(seen: Events, wanted: Events, *, timeout_s: float = 5.0) -> None:
    """Wait until ``wanted`` is a subsequence at the end of what was seen."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while seen[-len(wanted) :] != wanted:
        assert loop.time() < deadline, f"saw {seen}, waited for {wanted}"
        await asyncio.sleep(0.01)


async def test_watch_sees_existing_pods_then_added_modified_and_deleted(
    apiserver: ApiServer, events: Callable[..., Events]
) -> None:
    apiserver.add_pod(NS, "old")
    seen = events()
    await _until(seen, [("ADDED", "old")])

    apiserver.add_pod(NS, "new", phase="Pending")
    apiserver.update_pod(NS, "new", lambda p: p["spec"].update(nodeName="gpu-node-a"))
    apiserver.delete_pod(NS, "old")

    await _until(seen, [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "old")])
    assert seen == [("ADDED", "old"), ("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "old")]


async def test_watch_resumes_from_its_resource_version_when_the_server_ends_the_stream(
    apiserver: ApiServer, events: Callable[..., Events]
) -> None:
    seen = events()
    apiserver.add_pod(NS, "a")
    await _until(seen, [("ADDED", "a")])
    await apiserver.until_watched()

    apiserver.close_watches()  # as at the end of timeoutSeconds
    apiserver.add_pod(NS, "b")

    await _until(seen, [("ADDED", "b")])
    assert seen == [("ADDED", "a"), ("ADDED", "b")]
    watches = [r for r in apiserver.requests if r.verb == "watch"]
    assert len(watches) >= 2
    assert sum(r.verb == "list" for r in apiserver.requests) == 1  # no re-list needed


async def test_after_410_gone_the_watch_lists_again_and_reports_the_difference(
    apiserver: ApiServer, events: Callable[..., Events]
) -> None:
    apiserver.add_pod(NS, "stays")
    apiserver.add_pod(NS, "goes")
    seen = events()
    await _until(seen, [("ADDED", "goes"), ("ADDED", "stays")])  # a list comes sorted
    await apiserver.until_watched()

    async with apiserver.watch_outage():  # history compacted meanwhile
        apiserver.delete_pod(NS, "goes")
        apiserver.add_pod(NS, "comes")
        apiserver.update_pod(NS, "stays", lambda p: p["metadata"].update(labels={"x": "y"}))

    await _until(seen, [("DELETED", "goes"), ("ADDED", "comes"), ("MODIFIED", "stays")])
    assert sum(r.verb == "list" for r in apiserver.requests) == 2


async def test_a_pod_gone_during_an_outage_is_reported_with_its_identity_alone(
    apiserver: ApiServer, kube: Kube
) -> None:
    """Between lists only each pod's metadata is kept: what a DELETED needs
    (namespace, name, uid, the pledge annotation) without spec and status."""
    apiserver.add_pod(NS, "goes", node="gpu-node-a")
    apiserver.update_pod(
        NS,
        "goes",
        lambda p: p["metadata"].update(
            annotations={"hcs.io/pledge": "p1"}, managedFields=[{"manager": "kubelet"}]
        ),
    )
    deleted: list[dict[str, Any]] = []
    listed = asyncio.Event()

    async def consume() -> None:
        async for kind, pod in kube.watch_pods():
            listed.set()
            if kind == "DELETED":
                deleted.append(pod)

    task = tasks.start(consume(), name="watch-pods-identity")
    try:
        await asyncio.wait_for(listed.wait(), 5)
        await apiserver.until_watched()
        async with apiserver.watch_outage():
            apiserver.delete_pod(NS, "goes")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while not deleted:
            assert loop.time() < deadline, "no DELETED after the outage"
            await asyncio.sleep(0.01)
    finally:
        await tasks.stop(task)
    [gone] = deleted
    assert set(gone) == {"metadata"}
    meta = gone["metadata"]
    assert (meta["name"], meta["annotations"]) == ("goes", {"hcs.io/pledge": "p1"})
    assert meta["uid"] and "managedFields" not in meta


async def test_a_pod_leaving_the_field_selector_is_reported_deleted(
    apiserver: ApiServer, events: Callable[..., Events]
) -> None:
    apiserver.add_pod(NS, "p", node="gpu-node-a")
    apiserver.add_pod(NS, "elsewhere", node="gpu-node-b")
    seen = events(field_selector="spec.nodeName=gpu-node-a")
    await _until(seen, [("ADDED", "p")])

    apiserver.update_pod(NS, "elsewhere", lambda p: p["metadata"].update(labels={"x": "1"}))
    apiserver.update_pod(NS, "p", lambda p: p["spec"].update(nodeName="gpu-node-b"))

    await _until(seen, [("DELETED", "p")])
    assert seen == [("ADDED", "p"), ("DELETED", "p")]


async def test_a_server_error_on_the_watch_is_retried_without_losing_events(
    apiserver: ApiServer, events: Callable[..., Events]
) -> None:
    apiserver.fail("watch", "pods", code=503)
    seen = events()
    await apiserver.until_watched()  # the second attempt

    apiserver.add_pod(NS, "after-503")

    await _until(seen, [("ADDED", "after-503")])
    assert sum(r.verb == "watch" for r in apiserver.requests) == 2


async def test_a_forbidden_watch_raises_instead_of_retrying_forever(
    apiserver: ApiServer, kube: Kube
) -> None:
    apiserver.fail("list", "pods", code=403)

    with pytest.raises(KubeError) as caught:
        async for _ in kube.watch_pods():
            pass
    assert caught.value.status == 403
