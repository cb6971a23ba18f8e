"""What the scheduler reads from a pod's ai.compute/* requests."""

from __future__ import annotations

import pytest

from scheduler.plan.pods import BadPod, pod_info_from_dict
from tests.scheduler.helpers import pod


def test_requests_of_every_container_are_summed_into_one_demand() -> None:
    info = pod_info_from_dict(
        pod("p", requests={"ai.compute/vram": "16Gi", "ai.compute/devices": "2"})
    )
    assert info.requests is not None
    assert info.requests.vram_mib == 16384 and info.requests.devices == 2


@pytest.mark.parametrize("count", ["1.5", "500m"])
def test_a_fractional_device_count_is_refused_by_name_not_rounded_down(count: str) -> None:
    with pytest.raises(BadPod, match=r"ai\.compute/devices"):
        pod_info_from_dict(pod("p", requests={"ai.compute/devices": count}))


def test_an_unknown_compute_resource_is_named() -> None:
    with pytest.raises(BadPod, match=r"ai\.compute/gpus"):
        pod_info_from_dict(pod("p", requests={"ai.compute/gpus": "1"}))


def _bare(**spec: object) -> dict[str, object]:
    found = pod("bare", requests={"ai.compute/vram": "16Gi"})
    del found["metadata"]["ownerReferences"]
    found["spec"].update(spec)
    return found


PREFERRED = [{"weight": 10, "preference": {"matchExpressions": []}}]
REQUIRED = {"nodeSelectorTerms": [{"matchExpressions": []}]}


@pytest.mark.parametrize(
    ("owner", "spec", "prefers"),
    [
        (None, {}, False),
        ("Job", {}, False),
        ("ReplicaSet", {}, True),
        ("StatefulSet", {}, True),
        (
            None,
            {
                "affinity": {
                    "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": REQUIRED}
                }
            },
            False,
        ),
        (
            None,
            {
                "affinity": {
                    "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": PREFERRED}
                }
            },
            True,
        ),
        (
            None,
            {
                "affinity": {
                    "podAntiAffinity": {
                        "preferredDuringSchedulingIgnoredDuringExecution": PREFERRED
                    }
                }
            },
            True,
        ),
        (
            None,
            {"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}},
            False,
        ),
        (
            None,
            {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "DoNotSchedule"}]},
            False,
        ),
        (
            None,
            {"topologySpreadConstraints": [{"maxSkew": 1, "whenUnsatisfiable": "ScheduleAnyway"}]},
            True,
        ),
    ],
)
def test_kube_scheduler_scoring_has_a_say_only_for_soft_preferences_and_spread_owners(
    owner: str | None, spec: dict[str, object], prefers: bool
) -> None:
    found = _bare(**spec)
    if owner is not None:
        found["metadata"]["ownerReferences"] = [{"kind": owner, "name": "x", "uid": "u"}]  # type: ignore[index]
    assert pod_info_from_dict(found).kube_scores is prefers
