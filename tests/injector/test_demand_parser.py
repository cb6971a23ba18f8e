"""One demand parser (``hcs_bus.demands``): the injector at admission and the
scheduler at filter read the same demand from every pod, or refuse it with
the same reason. The table holds the pods on which the two parts used to
disagree (the scheduler summed requests over limits, per container, in
MiB, ignored init containers and accepted fractions, negatives and a
request without its limit), and plain ones that must stay as they were."""

from __future__ import annotations

from typing import Any

import pytest

from hcs_bus import demands
from hcs_bus import demands as injector_demands
from hcs_bus.messages import Policy, Requests
from scheduler.plan import pods as scheduler_pods

GI = 2**30


def _container(name: str, requests: dict[str, Any], limits: dict[str, Any] | None = None) -> Any:
    return {
        "name": name,
        "image": "registry.example/train:1",
        "resources": {"requests": requests, "limits": requests if limits is None else limits},
    }


def _pod(
    *containers: Any, init: tuple[Any, ...] = (), annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": list(containers)}
    if init:
        spec["initContainers"] = list(init)
    meta: dict[str, Any] = {"name": "p", "namespace": "ml", "uid": "u1"}
    if annotations:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": spec}


VRAM, ACU, DEVICES, TF16 = (
    "ai.compute/vram",
    "ai.compute/acu",
    "ai.compute/devices",
    "ai.compute/tflops-fp16",
)

# name, pod, the Requests both read, or the words both refusals carry
CASES: list[tuple[str, dict[str, Any], Requests | str]] = [
    ("one container", _pod(_container("a", {VRAM: "16Gi"})), Requests(vram_mib=16384)),
    (
        "containers are summed",
        _pod(_container("a", {VRAM: "8Gi", ACU: "20"}), _container("b", {VRAM: "8Gi"})),
        Requests(vram_mib=16384, acu=20.0),
    ),
    (
        "vram as a bare number is bytes",
        _pod(_container("a", {VRAM: str(GI)})),
        Requests(vram_mib=1024),
    ),
    # was: both rounded a part of a MiB down (Decimal // truncates), and the
    # scheduler rounded each container before summing (2.5 MiB: 2 + 2 MiB)
    ("a part of a MiB is rounded up", _pod(_container("a", {VRAM: "1.5Mi"})), Requests(vram_mib=2)),
    (
        "vram is summed in bytes and rounded up once",
        _pod(_container("a", {VRAM: "1310720"}), _container("b", {VRAM: "1310720"})),
        Requests(vram_mib=3),
    ),
    # was: the scheduler ignored init containers
    (
        "a larger init container sets the demand",
        _pod(_container("a", {VRAM: "8Gi"}), init=(_container("warm", {VRAM: "32Gi"}),)),
        Requests(vram_mib=32768),
    ),
    (
        "a smaller init container does not add to it",
        _pod(_container("a", {DEVICES: "2"}), init=(_container("warm", {DEVICES: "1"}),)),
        Requests(devices=2),
    ),
    (
        "an init container alone asks",
        _pod(_container("a", {}), init=(_container("warm", {ACU: "50"}),)),
        Requests(acu=50.0),
    ),
    # was: the scheduler accepted an unadvertised key in an init container
    (
        "an unadvertised key in an init container is refused",
        _pod(_container("a", {}), init=(_container("warm", {TF16: "100"}),)),
        "an init container cannot request ai.compute/tflops-fp16",
    ),
    # was: the scheduler took a request without a limit
    (
        "a request without a limit is refused",
        _pod(_container("a", {VRAM: "16Gi"}, {})),
        "ai.compute/vram is requested (17179869184) without a limit",
    ),
    # was: the scheduler took the request and ignored the limit
    (
        "a request unlike its limit is refused",
        _pod(_container("a", {ACU: "50"}, {ACU: "60"})),
        "ai.compute/acu request 50 and limit 60 differ",
    ),
    (
        "a limit alone is the request",
        _pod(_container("a", {}, {DEVICES: "2"})),
        Requests(devices=2),
    ),
    # was: the scheduler accepted fractions of everything but devices
    (
        "a fractional ACU is refused",
        _pod(_container("a", {ACU: "1.5"})),
        "ai.compute/acu: '1.5' must be a whole number",
    ),
    (
        "milli-ACU is refused",
        _pod(_container("a", {ACU: "500m"})),
        "ai.compute/acu: '500m' must be a whole number",
    ),
    (
        "a fractional device is refused",
        _pod(_container("a", {DEVICES: "1.5"})),
        "ai.compute/devices: '1.5' must be a whole number",
    ),
    # was: the scheduler accepted negative amounts
    (
        "a negative amount is refused",
        _pod(_container("a", {VRAM: "-1Gi"})),
        "ai.compute/vram: '-1Gi' is not a valid quantity",
    ),
    # was: the scheduler accepted amounts the API server cannot store
    ("vram beyond int64 is refused", _pod(_container("a", {VRAM: "10000Pi"})), "is too large"),
    ("ACU beyond int64 is refused", _pod(_container("a", {ACU: str(2**63)})), "is too large"),
    (
        "an unknown key is named",
        _pod(_container("a", {"ai.compute/gpus": "1"})),
        "unknown resource ai.compute/gpus",
    ),
    (
        "other resources are not ours",
        _pod(_container("a", {"cpu": "4", "nvidia.com/gpu": "1"})),
        "none",
    ),
]


def _injector(pod: dict[str, Any]) -> Requests | str:
    try:
        demand = injector_demands.read(pod)
    except injector_demands.DemandError as exc:
        return f"refused: {exc}"
    return demand.requests if demand is not None else "none"


def _scheduler(pod: dict[str, Any]) -> Requests | str:
    try:
        info = scheduler_pods.pod_info_from_dict(pod)
    except scheduler_pods.BadPod as exc:
        return f"refused: {exc}"
    return info.requests if info.requests is not None else "none"


@pytest.mark.parametrize(("pod", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_injector_and_scheduler_read_the_same_demand_or_refuse_it_alike(
    pod: dict[str, Any], expected: Requests | str
) -> None:
    at_admission, at_filter = _injector(pod), _scheduler(pod)
    assert at_admission == at_filter
    if isinstance(expected, Requests):
        assert at_admission == expected
    elif expected == "none":
        assert at_admission == "none"
    else:
        assert isinstance(at_admission, str) and at_admission.startswith("refused: ")
        assert expected in at_admission


@pytest.mark.parametrize(
    ("annotations", "labels", "policy"),
    [
        ({"hcs.io/substitution": " allow "}, {}, Policy(substitution="allow")),
        ({"hcs.io/vendors": "nvidia, huawei,"}, {}, Policy(vendors=("nvidia", "huawei"))),
        ({"hcs.io/job": "from-annotation"}, {}, Policy(job="from-annotation")),
        ({"hcs.io/job": "annotation"}, {"hcs.io/job": "label"}, Policy(job="label")),
        ({"hcs.io/topology": "high-bandwidth"}, {}, Policy(topology="high-bandwidth")),
    ],
)
def test_both_parts_read_the_same_policy(
    annotations: dict[str, str], labels: dict[str, str], policy: Policy
) -> None:
    pod = _pod(_container("a", {DEVICES: "1"}), annotations=annotations)
    pod["metadata"]["labels"] = labels
    demand = injector_demands.read(pod)
    assert demand is not None and demand.policy == policy
    assert scheduler_pods.pod_info_from_dict(pod).policy == policy


@pytest.mark.parametrize("value", ["maybe", ""])
def test_a_bad_substitution_is_refused_by_both_naming_the_annotation(value: str) -> None:
    pod = _pod(_container("a", {DEVICES: "1"}), annotations={"hcs.io/substitution": value})
    for read in (injector_demands.read, scheduler_pods.pod_info_from_dict):
        with pytest.raises(demands.DemandError, match=r"hcs\.io/substitution"):
            read(pod)


def test_a_boolean_amount_is_refused_not_a_crash() -> None:
    pod = _pod(_container("a", {DEVICES: True}))
    with pytest.raises(demands.DemandError, match="not a valid quantity"):
        demands.read(pod)
