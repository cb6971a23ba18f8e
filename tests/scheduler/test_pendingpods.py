"""The pending HCS pods kept from the pod watch (``scheduler.replan.pending_pods``):
what the store keeps and drops, a watch re-opened from a fresh list, and the
stranding scan reading the store instead of listing the pods."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any, cast

from hcs_bus import tasks
from hcs_bus.errors import KubeUnavailable
from scheduler.ledger import release_loop as watching
from scheduler.ledger.reservation_store import Booker
from scheduler.plan.service import Planner
from scheduler.replan.loop import Stranding
from scheduler.replan.pending_pods import PendingPods
from scheduler.view.state import ClusterState
from tests.scheduler.helpers import A100_WHOLE as PLAN
from tests.scheduler.helpers import FakeKube, until

SCHED = "hcs-scheduler"


def _pod(name: str, *, namespace: str = "ml", **spec: Any) -> dict[str, Any]:
    """A pending HCS pod (``spec`` changes added to its spec)."""
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{name}",
            "annotations": {"hcs.io/plan": json.dumps(PLAN)},
        },
        "spec": {
            "schedulerName": SCHED,
            "containers": [{"name": "m", "resources": {"limits": {"ai.compute/devices": "1"}}}],
            **spec,
        },
        "status": {"phase": "Pending"},
    }


def _names(store: PendingPods) -> list[str] | None:
    pods = store.pods()
    return None if pods is None else sorted(f"{p.ref.namespace}/{p.ref.name}" for p in pods)


def _synced() -> PendingPods:
    store = PendingPods(scheduler_name=SCHED)
    store.synced.set()
    return store


def test_the_store_follows_pods_added_bound_and_deleted() -> None:
    store = _synced()
    store.apply("ADDED", _pod("a"))
    store.apply("ADDED", _pod("b"))
    store.apply("ADDED", _pod("a", namespace="other"))
    assert _names(store) == ["ml/a", "ml/b", "other/a"]
    store.apply("MODIFIED", _pod("a", nodeName="gpu-1"))  # bound: no longer pending
    store.apply("DELETED", _pod("b"))
    assert _names(store) == ["other/a"]
    store.apply("MODIFIED", _pod("c"))  # first seen as a change: kept all the same
    assert _names(store) == ["ml/c", "other/a"]


def test_finished_going_and_other_schedulers_pods_are_not_kept() -> None:
    store = _synced()
    for name in ("done", "failed", "going", "theirs", "plain"):
        store.apply("ADDED", _pod(name))
    finished = _pod("done")
    finished["status"]["phase"] = "Succeeded"
    failed = _pod("failed")
    failed["status"]["phase"] = "Failed"
    going = _pod("going")
    going["metadata"]["deletionTimestamp"] = "2024-01-01T00:00:00Z"
    plain = _pod("plain")
    del plain["metadata"]["annotations"]["hcs.io/plan"]  # no plan: nothing to re-plan
    for pod in (finished, failed, going, _pod("theirs", schedulerName="default-scheduler"), plain):
        store.apply("MODIFIED", pod)
    store.apply("BOOKMARK", _pod("ghost"))  # not a change of a pod
    assert _names(store) == []


def test_the_store_is_not_read_until_synced_and_a_restart_forgets_it() -> None:
    store = PendingPods(scheduler_name=SCHED)
    store.apply("ADDED", _pod("a"))
    assert store.pods() is None
    store.synced.set()
    assert _names(store) == ["ml/a"]
    store.restart()
    assert store.pods() is None and not store.synced.is_set()
    store.synced.set()
    assert _names(store) == []


class _RestartingKube:
    """Pod watches from scripted lists: each watch yields its list as ADDED,
    sets ``synced``, then fails (KubeUnavailable) once ``drop`` is set, or
    waits forever when it is the last list."""

    def __init__(self, *lists: list[dict[str, Any]]) -> None:
        self.lists = list(lists)
        self.opened: list[str | None] = []
        self.drop = asyncio.Event()
        self.relist = asyncio.Event()  # the second list waits for it

    async def watch_pods(
        self, *, field_selector: str | None = None, synced: asyncio.Event | None = None
    ) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        self.opened.append(field_selector)
        if len(self.opened) > 1:
            await self.relist.wait()
        items = self.lists.pop(0)
        for pod in items:
            yield "ADDED", pod
        if synced is not None:
            synced.set()
        if self.lists:
            await self.drop.wait()
            raise KubeUnavailable("watch pods: connection reset")
        await asyncio.Event().wait()


def _booker() -> Booker:
    """What ``on_pod_event`` reads of a Booker: no pod held, no pledges."""
    return cast(Booker, SimpleNamespace(state=ClusterState(), unpledge=None))


async def test_a_watch_reopened_does_not_keep_a_pod_deleted_while_nobody_watched() -> None:
    kube = _RestartingKube([_pod("a"), _pod("b")], [_pod("b")])
    store = PendingPods(scheduler_name=SCHED)
    watch = watching.watch_pods(
        cast(Any, kube), _booker(), scheduler_name=SCHED, pending=store, retry_s=0.0
    )
    task = tasks.start(watch, name="test:pod-watch")
    try:
        await asyncio.wait_for(store.synced.wait(), timeout=5)
        assert _names(store) == ["ml/a", "ml/b"]
        kube.drop.set()  # the watch fails; "a" is deleted before the next list
        await until(lambda: len(kube.opened) == 2)
        assert store.pods() is None  # not trusted until the new list is taken
        kube.relist.set()
        await asyncio.wait_for(store.synced.wait(), timeout=5)
        assert _names(store) == ["ml/b"]
    finally:
        await tasks.stop(task)
    assert kube.opened == [f"spec.schedulerName={SCHED}"] * 2


async def test_the_pod_watch_asks_for_hcs_pods_only() -> None:
    kube = FakeKube()
    store = PendingPods(scheduler_name="my-hcs")
    watch = watching.watch_pods(cast(Any, kube), _booker(), scheduler_name="my-hcs", pending=store)
    task = tasks.start(watch, name="test:pod-watch")
    try:
        await asyncio.wait_for(store.synced.wait(), timeout=5)
    finally:
        await tasks.stop(task)
    assert kube.pod_selectors == ["spec.schedulerName=my-hcs"]


class _ListingKube(FakeKube):
    """Counts the pod lists and the selectors they ask for."""

    def __init__(self) -> None:
        super().__init__()
        self.lists: list[dict[str, Any]] = []

    async def list_pods(self, **selectors: Any) -> list[dict[str, Any]]:
        self.lists.append(selectors)
        return list(self.pods.values())


def _stranding(kube: _ListingKube, store: PendingPods | None) -> Stranding:
    planner = cast(Planner, None)  # pending() plans nothing
    return Stranding(
        kube=kube, planner=planner, scheduler_name=SCHED, replica="r1", pending_pods=store
    )


async def test_the_scan_reads_the_synced_store_and_lists_nothing() -> None:
    kube = _ListingKube()
    kube.pods[("ml", "listed")] = _pod("listed")
    store = _synced()
    store.apply("ADDED", _pod("kept"))
    found = await _stranding(kube, store).pending()
    assert [p.ref.name for p in found] == ["kept"]
    assert kube.lists == []


async def test_the_scan_lists_until_the_store_is_synced_or_without_one() -> None:
    kube = _ListingKube()
    kube.pods[("ml", "listed")] = _pod("listed")
    kube.pods[("ml", "bound")] = _pod("bound", nodeName="gpu-1")
    store = PendingPods(scheduler_name=SCHED)
    store.apply("ADDED", _pod("kept"))
    for strands in (_stranding(kube, store), _stranding(kube, None)):
        found = await strands.pending()
        assert [p.ref.name for p in found] == ["listed"]
    selector = f"spec.schedulerName={SCHED},spec.nodeName="
    assert kube.lists == [{"cached": True, "field_selector": selector}] * 2
