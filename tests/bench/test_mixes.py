"""The mixed burst of ``bench.burst --mix``: its shares, its offline fit and
the end-of-burst check of which allowed classes still had room."""

from __future__ import annotations

import collections
import json

from bench import mixes
from bench.mixes import Kind
from hcs_bus import profiles, vocabulary
from scheduler.plan.rules import ClassStats, Summary

FIVE = (
    "nvidia/A100-80G",
    "nvidia/H100-SXM",
    "huawei/Ascend910B2",
    "hygon/K100",
    "cambricon/MLU370-X8",
)


def test_every_kind_gets_its_share_of_the_pods() -> None:
    counts = collections.Counter(k.name for k in mixes.kinds_for(1000))
    assert counts == {k.name: k.share_pct * 10 for k in mixes.MIX}


def test_the_default_mix_of_1000_pods_fits_50_nodes_of_8_devices() -> None:
    models = [FIVE[n % 5] for n in range(50)]
    fit = mixes.fit(mixes.kinds_for(1000), models=models, per_node=8, profiles=profiles.load())
    assert not fit.unplaced
    assert sum(fit.placed.values()) == 1000
    assert fit.vram_mib < fit.vram_total_mib
    assert fit.placed["nvidia/H100-SXM"] >= 50  # the pinned ones went there


def test_whole_devices_beyond_the_fleet_are_left_unplaced() -> None:
    whole = Kind("devices 1", 100, {"ai.compute/devices": "1"})
    fit = mixes.fit([whole] * 20, models=[FIVE[0], FIVE[1]], per_node=8, profiles=profiles.load())
    assert sum(fit.placed.values()) == 16
    assert fit.unplaced == {"devices 1": 4}
    assert fit.whole_devices == fit.devices == 16


def _stats(key: str, *, free_per_device_mib: list[int]) -> ClassStats:
    p = profiles.load().get(key)
    idle = sum(free == p.vram_mib for free in free_per_device_mib)
    return ClassStats(
        vendor=p.vendor,
        model=p.model,
        vram_mib=p.vram_mib,
        acu=p.acu,
        devices=len(free_per_device_mib),
        free_mib=sum(free_per_device_mib),
        max_usable_per_node=len(free_per_device_mib),
        max_idle_per_node=idle,
        kth_free=sorted(free_per_device_mib, reverse=True),
        free_counts=dict(collections.Counter(free_per_device_mib)),
        idle_devices=idle,
    )


def _pending(kind: Kind, *, planned: str = "") -> dict[str, object]:
    pod = mixes.bare_pod(kind)
    if planned:
        vendor, model = planned.split("/")
        note = {"vendor": vendor, "model": model, "devices": 1, "vram_mib_per_device": 8192}
        pod["metadata"]["annotations"][vocabulary.PLAN] = json.dumps(note)
    return pod


def test_a_pending_pod_counts_room_only_in_the_classes_its_policy_allows() -> None:
    summary = Summary(
        classes={
            "nvidia/H100-SXM": _stats("nvidia/H100-SXM", free_per_device_mib=[81920, 40960]),
            "huawei/Ascend910B2": _stats("huawei/Ascend910B2", free_per_device_mib=[4096, 0]),
        },
        usage={},
    )
    db = profiles.load()
    anywhere = Kind("vram 16Gi", 100, {"ai.compute/vram": "16Gi"})
    huawei = Kind("huawei", 100, {"ai.compute/vram": "16Gi"}, {vocabulary.VENDORS: "huawei"})
    whole_two = Kind("two whole", 100, {"ai.compute/devices": "2"})
    assert mixes.with_room(_pending(anywhere), summary, db) == ["nvidia/H100-SXM"]
    assert mixes.with_room(_pending(huawei), summary, db) == []
    assert mixes.with_room(_pending(whole_two), summary, db) == []  # one idle device only


def test_the_planned_class_is_read_from_the_plan_note() -> None:
    kind = Kind("vram 8Gi", 100, {"ai.compute/vram": "8Gi"})
    assert mixes.planned_class(_pending(kind, planned="hygon/K100")) == "hygon/K100"
    assert mixes.planned_class(_pending(kind)) == ""
