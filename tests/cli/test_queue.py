"""``hcs queue`` and ``hcs kueue``: the shared pool's view from the ledger
on a real nats-server, and Kueue objects in ACU from the ComputeQuotas."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import msgspec
import yaml

from hcs import kueue, queue
from hcs_bus import messages, streams, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import DeviceSlice, NodeReservations, PodRef, Reservation
from scheduler.ledger import pledge_rules
from scheduler.ledger.pledge_rules import NamespacePledges, Pledge
from scheduler.plan.rules import ClassStats, QuotaLimits
from scheduler.quota.share_rules import Amount
from tests.cli.running import hcs
from tests.scheduler.helpers import node_fp, publish_fleet


def held(
    ns: str, pod: str, index: int, *, job: str | None = None, priority: int = 0
) -> Reservation:
    return Reservation(
        pod=PodRef(namespace=ns, name=pod, uid=f"uid-{pod}"),
        devices=(DeviceSlice(index=index, uuid=f"u{index}", vram_mib=81920, whole=True),),
        state="bound",
        time_s=100.0,
        vendor="nvidia",
        model="A100-80G",
        acu=100.0,
        job=job,
        priority=priority,
    )


def pledge(pid: str, *, time_s: float, spent: bool = False) -> Pledge:
    return Pledge(
        id=pid,
        vendor="nvidia",
        model="A100-80G",
        devices=1,
        vram_mib_per_device=81920,
        whole_device=True,
        acu_per_device=100.0,
        time_s=time_s,
        name=f"pod-{pid}",
        spent_s=time_s + 1 if spent else None,
    )


LEDGER = [
    NodeReservations(
        node="gpu-1",
        reservations=tuple(held("ml", f"train-{i}", i, job="train") for i in range(6)),
    )
]
PLEDGES = [
    NamespacePledges(
        namespace="cv",
        pledges=(
            pledge("b", time_s=50.0),
            pledge("a", time_s=10.0),
            pledge("x", time_s=1.0, spent=True),
        ),
    )
]
LIMITS = {
    "ml": QuotaLimits(acu=800.0, guaranteed_acu=400.0, weight=2.0),
    "cv": QuotaLimits(acu=1600.0, guaranteed_acu=400.0),
}
POOL = Amount(acu=1600.0, vram_mib=16 * 81920)


def test_the_view_splits_each_namespaces_use_at_its_guarantee_and_orders_the_queue() -> None:
    found = queue.view(LEDGER, PLEDGES, limits=LIMITS, pool=POOL, now=200.0)
    ml = next(n for n in found["namespaces"] if n["namespace"] == "ml")
    assert ml["used"]["acu"] == 600.0 and ml["borrowed"]["acu"] == 200.0
    assert ml["guaranteed"]["acu"] == 400.0 and ml["ceiling"]["acu"] == 800.0
    assert ml["dominant_share"] == 0.1875  # 6 of 16 devices' VRAM over weight 2
    assert [(q["position"], q["job"]) for q in found["queue"]] == [
        (1, "cv/pod-a#a"),
        (2, "cv/pod-b#b"),
    ]  # the spent pledge is bound, not waiting
    assert found["running"] == [
        {"job": "ml/train", "ranks": 6, "class": "nvidia/A100-80G", "acu": 600.0,
         "vram_mib": 6 * 81920, "running_s": 100.0}
    ]  # fmt: skip
    text = queue.table(found)
    assert "ml" in text and "1. cv/pod-a#a" in text


def test_kueue_states_guarantees_as_nominal_quota_and_ceilings_as_borrowing_limits() -> None:
    classes = {
        "nvidia/A100-80G": ClassStats(vendor="nvidia", model="A100-80G", acu=100.0, devices=12),
        "huawei/Ascend910B2": ClassStats(
            vendor="huawei", model="Ascend910B2", acu=100.0, devices=4
        ),
    }
    libraries = kueue.libraries_of(classes)
    assert libraries == {"hccl": 400.0, "nccl": 1200.0}
    limits = {
        "ml": QuotaLimits(acu=800.0, guaranteed_acu=400.0, weight=2.0,
                          guaranteed_classes=(("huawei/Ascend910B2", None, 100.0),)),
        "open": QuotaLimits(guaranteed_acu=100.0),
        "none": None,
    }  # fmt: skip
    objects = kueue.manifests(limits, libraries)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds == [
        ("ResourceFlavor", "hccl"), ("ResourceFlavor", "nccl"),
        ("ClusterQueue", "hcs-ml"), ("LocalQueue", "hcs"),
        ("ClusterQueue", "hcs-open"), ("LocalQueue", "hcs"),
    ]  # fmt: skip
    assert all(o["apiVersion"] == "kueue.x-k8s.io/v1beta1" for o in objects)
    ml = objects[2]["spec"]
    assert ml["cohort"] == "hcs" and ml["fairSharing"] == {"weight": "2"}
    group = ml["resourceGroups"][0]
    assert group["coveredResources"] == ["ai.compute/acu"]
    quotas = {f["name"]: f["resources"][0] for f in group["flavors"]}
    # 100 on hccl by class, the other 300 split 1:3 by the libraries' ACU
    assert quotas["hccl"] == {"name": "ai.compute/acu", "nominalQuota": 175, "borrowingLimit": 400}
    assert quotas["nccl"]["nominalQuota"] == 225
    open_quota = objects[4]["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]
    assert "borrowingLimit" not in open_quota  # no ceiling: borrows without limit
    assert (
        objects[3]["spec"] == {"clusterQueue": "hcs-ml"}
        and objects[3]["metadata"]["namespace"] == "ml"
    )
    assert list(yaml.safe_load_all(kueue.render(objects))) == objects


async def _write_ledger(bus: Bus) -> None:
    kv = await bus.js.key_value(streams.KV_ALLOC)
    for doc in LEDGER:
        await kv.put(subjects.alloc_key(doc.node), messages.encode(doc))
    for pledged in PLEDGES:
        await kv.put(pledge_rules.key_for(pledged.namespace), msgspec.json.encode(pledged))


async def test_hcs_queue_and_kueue_read_the_ledger_fleet_and_quota_file(
    bus: Bus, nats_url: str, tmp_path: Path
) -> None:
    await publish_fleet(bus, node_fp("gpu-1", count=8), node_fp("gpu-2", count=8))
    await _write_ledger(bus)
    quotas = tmp_path / "quotas.yaml"
    quotas.write_text(
        "namespaces:\n"
        "  ml: {acu: 800, guaranteed: {acu: 400}, weight: 2}\n"
        "  cv: {acu: 1600, guaranteed: {acu: 400}}\n"
    )
    env = {"HCS_SCHEDULER__QUOTA_FILE": str(quotas), "KUBECONFIG": str(tmp_path / "none")}
    done = await asyncio.to_thread(hcs, "queue", "--json", "--nats-url", nats_url, env=env)
    assert done.code == 0, done.err
    found = json.loads(done.out)
    assert found["pool"]["vram_mib"] > 0
    by = {n["namespace"]: n for n in found["namespaces"]}
    assert by["ml"]["used"]["acu"] == 600.0 and by["ml"]["borrowed"]["acu"] == 200.0
    assert by["cv"]["guaranteed"]["acu"] == 400.0
    assert [q["job"] for q in found["queue"]] == ["cv/pod-a#a", "cv/pod-b#b"]

    made = await asyncio.to_thread(hcs, "kueue", "--nats-url", nats_url, env=env)
    assert made.code == 0, made.err
    objects = list(yaml.safe_load_all(made.out))
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ResourceFlavor"] == ["nccl"]
    assert {o["metadata"]["name"] for o in objects if o["kind"] == "ClusterQueue"} == {
        "hcs-ml",
        "hcs-cv",
    }
