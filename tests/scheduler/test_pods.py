"""What the scheduler reads from a pod's ai.compute/* requests."""

from __future__ import annotations

import pytest

from scheduler.pods import BadPod, pod_info_from_dict
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
