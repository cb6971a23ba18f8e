"""ComputeQuota guarantees, ceilings and weights as the quota source reads
them, from objects and from the quota file; quotas of before keep working."""

from __future__ import annotations

from pathlib import Path

import pytest

from hcs_bus.errors import ConfigError
from scheduler.plan.rules import QuotaLimits
from scheduler.quota.source import from_objects, read_file


def test_a_quota_of_before_reads_as_a_ceiling_without_a_guarantee() -> None:
    found = from_objects([{"spec": {"hard": {"ai.compute/vram": "32Gi", "acu": 100}}}])
    assert found == QuotaLimits(vram_mib=32768, acu=100.0)


def test_guarantee_weight_and_class_guarantees_are_read_and_the_tightest_wins() -> None:
    found = from_objects(
        [
            {
                "spec": {
                    "hard": {"acu": 800},
                    "guaranteed": {"acu": 400, "vram": "640Gi", "classes": {"nccl": {"acu": 300}}},
                    "weight": 3,
                }
            },
            {"spec": {"hard": {"acu": 600}, "guaranteed": {"acu": 500}, "weight": 2}},
        ]
    )
    assert found is not None
    assert (found.acu, found.guaranteed_acu, found.guaranteed_vram_mib) == (600.0, 400.0, 655360)
    assert found.weight == 2.0
    assert found.guaranteed_classes == (("nccl", None, 300.0),)


def test_the_quota_file_takes_guarantees_and_refuses_one_above_its_ceiling(tmp_path: Path) -> None:
    good = tmp_path / "q.yaml"
    good.write_text("namespaces:\n  ml: {acu: 800, guaranteed: {acu: 400}, weight: 2}\n")
    assert read_file(good)["ml"] == QuotaLimits(acu=800.0, guaranteed_acu=400.0, weight=2.0)
    bad = tmp_path / "bad.yaml"
    bad.write_text("namespaces:\n  ml: {acu: 100, guaranteed: {acu: 400}}\n")
    with pytest.raises(ConfigError, match="guaranteed acu 400 is above the ceiling"):
        read_file(bad)
    zero = tmp_path / "zero.yaml"
    zero.write_text("namespaces:\n  ml: {acu: 100, weight: 0}\n")
    with pytest.raises(ConfigError, match="weight"):
        read_file(zero)
