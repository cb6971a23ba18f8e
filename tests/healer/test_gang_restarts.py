"""A fatal fault on one rank's device restarts its whole gang: the healer
finds every member by ``hcs.io/gang`` through the API, asks the job to
checkpoint where a sidecar runs, then evicts every member; the new ranks all
bind with that one checkpoint. A real nats-server, the API double."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec

from hcs_bus import checkpoint, streams, subjects, vocabulary
from hcs_bus.bus import Bus
from hcs_bus.kube import Kube
from hcs_bus.messages import PodRef, Policy
from healer import restarting
from healer.bindings import Binding
from healer.checkpointing import REQUEST_FILE, Sidecar
from scheduler.ledger.pledge_rules import Pledge
from scheduler.plan import gang_records as records
from scheduler.plan.pods import PodInfo
from tests.apiserver import ApiServer
from tests.healer.conftest import bound, fingerprint, health
from tests.healer.test_healing import Make, collect, make, publish, ready, wait_until  # noqa: F401
from tests.scheduler.conftest import Start, start_scheduler  # noqa: F401

RUN = "ml/train/uid-1"
SPREAD = {"train-0": ("n1", 0), "train-1": ("n1", 2), "train-2": ("n2", 0), "train-3": ("n2", 1)}


def _members(api: ApiServer, *, sidecar: bool) -> None:
    for name, (node, _) in SPREAD.items():
        notes = {vocabulary.GANG: RUN, vocabulary.GANG_SIZE: "4"}
        if sidecar:
            notes[vocabulary.CHECKPOINT_DIR] = "/ckpt"
        api.add_pod("ml", name, node=node, annotations=notes, uid=f"uid-{name}")
    api.add_pod("ml", "solo", node="n1", uid="uid-solo")  # on a good device of n1
    other = {vocabulary.GANG: "ml/other/uid-2", vocabulary.GANG_SIZE: "1"}
    api.add_pod("ml", "other-0", node="n2", annotations=other, uid="uid-other-0")


async def _bound(bus: Bus) -> None:
    for name, (node, index) in SPREAD.items():
        await publish(bus, bound(node, name, (index,), job="train"), subjects.alloc(node))
    await publish(bus, bound("n1", "solo", (1,)), subjects.alloc("n1"))
    await publish(bus, bound("n2", "other-0", (3,), job="other"), subjects.alloc("n2"))


def _evicted(api: ApiServer) -> list[str]:
    return sorted(r.path.split("/")[-2] for r in api.requests if r.resource == "pods/eviction")


def test_victims_are_split_into_pods_of_no_gang_and_whole_gangs() -> None:
    pods = [
        {
            "metadata": {
                "namespace": "ml",
                "name": n,
                "uid": f"uid-{n}",
                "annotations": {vocabulary.GANG: RUN},
            },
            "spec": {"nodeName": node},
            "status": {"phase": "Running"},
        }
        for n, (node, _) in SPREAD.items()
    ]
    pods[3]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # going already
    victim = Binding("ml", "train-0", "uid-train-0", "n1", frozenset({0}), "train")
    stale = Binding("ml", "train-1", "uid-older", "n1", frozenset({2}), "train")
    alone = Binding("ml", "solo", "uid-solo", "n1", frozenset({1}), None)
    found = restarting.split([victim, stale, alone], pods)
    assert [b.name for b in found.alone] == ["train-1", "solo"]  # another incarnation; no gang
    (gang,) = found.gangs
    assert (gang.key, gang.namespace, gang.job) == (RUN, "ml", "train")
    assert [m.name for m in gang.members] == ["train-0", "train-1", "train-2"]
    assert not gang.sidecar


async def test_a_fatal_fault_on_one_ranks_device_evicts_every_member_of_its_gang(
    bus: Bus,
    kube: Kube,
    apiserver: ApiServer,
    make: Make,  # noqa: F811
) -> None:
    apiserver.add_node("n1")
    apiserver.add_node("n2")
    _members(apiserver, sidecar=False)
    await _bound(bus)
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    requests, sub = await collect(bus, "hcs.ckpt.request.>")
    healer = await make(kube)
    await ready(healer)
    await publish(bus, health("n1", code=79, device=0), subjects.health("n1"))
    await wait_until(lambda: len(_evicted(apiserver)) >= 4)
    await asyncio.sleep(0.3)  # nothing more comes
    await healer.actor.wait_evictions()
    assert _evicted(apiserver) == sorted(SPREAD)
    assert {("ml", "solo"), ("ml", "other-0")} <= set(apiserver.pods)
    assert requests == []  # no sidecar runs: evicted at once
    await sub.unsubscribe()


async def test_a_gang_with_a_sidecar_checkpoints_then_restarts_whole_and_resumes_from_one_step(
    bus: Bus,
    kube: Kube,
    apiserver: ApiServer,
    make: Make,  # noqa: F811
    start_scheduler: Start,  # noqa: F811
    tmp_path: Path,
) -> None:
    apiserver.add_node("n1")
    apiserver.add_node("n2")
    _members(apiserver, sidecar=True)
    await _bound(bus)
    await publish(bus, fingerprint("n1"), subjects.fp("n1"))
    await checkpoint.report(bus, namespace="ml", job="train", run="uid-1", uri="s3://c/10", step=10)
    sidecar = Sidecar(bus, root=tmp_path, namespace="ml", job="train", run="uid-1", interval_s=0.05)
    side = asyncio.get_running_loop().create_task(sidecar.run())
    saved_at: list[float] = []
    evicted_at: list[float] = []
    apiserver.before("create", "pods/eviction", lambda: evicted_at.append(time.monotonic()))

    async def trainer() -> None:  # saves when asked through the request file
        await wait_until(lambda: (tmp_path / REQUEST_FILE).exists())
        (tmp_path / "checkpoint-20").mkdir()
        (tmp_path / "checkpoint-20" / "trainer_state.json").write_text("{}")
        saved_at.append(time.monotonic())

    train = asyncio.get_running_loop().create_task(trainer())
    try:
        healer = await make(kube)
        await ready(healer)
        await publish(bus, health("n1", code=79, device=2), subjects.health("n1"))
        await wait_until(lambda: len(_evicted(apiserver)) >= 4)
        await healer.actor.wait_evictions()
        assert _evicted(apiserver) == sorted(SPREAD)
        assert saved_at and evicted_at and min(evicted_at) > saved_at[0]
        latest = await checkpoint.latest(bus, namespace="ml", job="train", run="uid-1")
        assert latest is not None and latest.step == 20
    finally:
        train.cancel()
        side.cancel()
        await asyncio.gather(train, side, return_exceptions=True)
    # the Job's new ranks are pledged whole; each binds with the one step
    sched = await start_scheduler(bus, None, http=False)
    kv = await bus.js.key_value(streams.KV_ALLOC)
    pledge = Pledge(id="p", vendor="nvidia", model="H200", devices=1, vram_mib_per_device=1000)
    record = records.GangRecord(
        namespace="ml",
        job="train",
        run="uid-1",
        size=4,
        vendor="nvidia",
        model="H200",
        state="pledged",
        ranks=tuple(
            records.RankPledge(pod=f"train-new-{i}", node="n1", pledge=pledge) for i in range(4)
        ),
    )
    await kv.put(record.key, records.ENCODER.encode(record))
    points = []
    for i in range(4):
        rank = PodInfo(
            ref=PodRef(namespace="ml", name=f"train-new-{i}", uid=f"new-{i}"),
            requests=None,
            policy=Policy(job="train"),
            annotation=None,
            priority=0,
            job="train",
            run="uid-1",
        )
        points.append(await sched.booker._resume_from(rank))
        if i == 0:  # an old rank's late save lands between two binds
            await checkpoint.report(
                bus, namespace="ml", job="train", run="uid-1", uri="s3://c/late", step=30
            )
    assert len(set(points)) == 1 and points[0] is not None and points[0].endswith("checkpoint-20")
    stored = records.DECODER.decode((await kv.get(record.key)).value)
    assert msgspec.structs.replace(stored, resume_from=None) == record
    assert stored.resume_from == points[0]
