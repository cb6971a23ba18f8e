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


def _asking(
    container: str, resources: dict[str, object], *, init: bool = False
) -> dict[str, object]:
    """A pod whose first container (regular, or init) asks ``resources``, then
    one that asks nothing: the same containers in the same order both ways."""
    found = pod("p")
    asking = {"name": container, "resources": resources}
    plain = {"name": "main", "resources": {}}
    spec = found["spec"]
    spec["initContainers"], spec["containers"] = (
        ([asking], [plain]) if init else ([], [asking, plain])
    )
    return found


def test_pods_asking_alike_read_alike_and_each_refusal_names_its_own_container() -> None:
    asks = {"limits": {"ai.compute/vram": "24Gi"}, "requests": {"ai.compute/vram": "24Gi"}}
    first = pod_info_from_dict(_asking("a", asks))
    again = pod_info_from_dict(_asking("b", asks))
    assert first.requests is not None and first.requests.vram_mib == 24576
    assert again.requests == first.requests
    bad = {"limits": {"ai.compute/vram": "24Gi"}, "requests": {"ai.compute/vram": "16Gi"}}
    for name in ("x", "y"):
        with pytest.raises(BadPod, match=rf"spec\.containers\[0\] \({name}\): ai\.compute/vram"):
            pod_info_from_dict(_asking(name, bad))


def test_what_a_regular_container_may_ask_an_init_container_is_refused_even_after() -> None:
    asks = {"limits": {"ai.compute/tflops-fp16": "100"}}
    regular = pod_info_from_dict(_asking("main", asks))
    assert regular.requests is not None and regular.requests.tflops_fp16 == 100.0
    with pytest.raises(BadPod, match=r"spec\.initContainers\[0\] \(warm\): an init container"):
        pod_info_from_dict(_asking("warm", asks, init=True))


@pytest.mark.parametrize(
    ("labels", "owner", "job", "run"),
    [
        ({}, None, None, ""),
        (
            {"jobset.sigs.k8s.io/jobset-name": "llm", "jobset.sigs.k8s.io/jobset-uid": "js-1"},
            None,
            "llm",
            "js-1",
        ),
        (
            {},
            {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "j-7"},
            "train",
            "j-7",
        ),
    ],
)
def test_the_pods_job_and_its_run_are_read_as_at_admission(
    labels: dict[str, str], owner: dict[str, object] | None, job: str | None, run: str
) -> None:
    found = pod("p", labels=labels)
    found["metadata"]["ownerReferences"] = [{**owner, "controller": True}] if owner else []
    info = pod_info_from_dict(found)
    assert (info.job, info.policy.job, info.run) == (job, job, run)
