"""Node labels and extended resources through hcs_bus.kube (API-server double)."""

from __future__ import annotations

import pytest

from agents.labeling import FleetLabeler, Labeler, Target
from agents.labels import (
    ACU,
    DEVICES,
    VRAM,
    capacity,
    label_safe,
    labels_of_devices,
    valid_labels,
)
from hcs_bus import profiles
from hcs_bus.units import mib_to_bytes, parse_quantity
from tests.agents.test_changes import dev

GIB = 2**30


def test_capacity_counts_usable_devices_in_the_units_pods_request() -> None:
    devices = [dev(0), dev(1), dev(2, error="nvml: GPU is lost")]
    cap = capacity(devices)
    assert cap[VRAM] == 2 * 81920 * 2**20 == mib_to_bytes(2 * 81920)
    assert cap[ACU] == 200 and cap[DEVICES] == 2
    # what the kubelet compares: a pod's request against the Node's number, as they are
    assert parse_quantity("16Gi") == 16 * GIB <= cap[VRAM]
    assert parse_quantity("160Gi") == cap[VRAM] < parse_quantity("161Gi")


def test_capacity_leaves_out_what_each_driver_holds() -> None:
    import msgspec

    held = [msgspec.structs.replace(dev(i), vram_driver_mib=480) for i in range(2)]
    assert capacity(held)[VRAM] == mib_to_bytes(2 * (81920 - 480))


def test_capacity_of_no_usable_device_is_zero_everywhere() -> None:
    assert capacity([dev(0, error="gone")]) == {VRAM: 0, ACU: 0, DEVICES: 0}
    assert capacity([]) == {VRAM: 0, ACU: 0, DEVICES: 0}


def test_fractional_acu_is_rounded_down_to_what_the_devices_have() -> None:
    from hcs_bus.messages import Compute

    half = Compute(acu_profile=60.75, tflops_fp16_profile=190)
    assert capacity([dev(0, compute=half), dev(1, compute=half)])[ACU] == 121
    tenth = Compute(acu_profile=0.1, tflops_fp16_profile=0.3)  # 10 × 0.1 is 0.9999… in floats
    assert capacity([dev(i, compute=tenth) for i in range(10)])[ACU] == 1


async def test_labels_and_capacity_are_written_once_and_again_on_change(apiserver, kube) -> None:
    apiserver.add_node("gpu-1")
    labeler = Labeler(kube, node="gpu-1")
    devices = [dev(0), dev(1), dev(2, error="nvml: GPU is lost")]
    labels = labels_of_devices(devices, base={"hcs.io/network-group": "ng-a", "zone": "z1"})
    assert await labeler.apply(labels, devices, now_s=0.0)
    node = apiserver.nodes["gpu-1"]
    assert node["metadata"]["labels"]["hcs.io/vendor"] == "nvidia"
    assert node["metadata"]["labels"]["hcs.io/model"] == "A100-80G"
    assert node["metadata"]["labels"]["hcs.io/network-group"] == "ng-a"
    assert node["metadata"]["labels"]["zone"] == "z1"
    assert node["status"]["capacity"][VRAM] == str(2 * 81920 * 2**20)
    assert node["status"]["allocatable"][ACU] == "200"
    assert node["status"]["capacity"][DEVICES] == "2"
    writes = len(apiserver.requests)
    assert not await labeler.apply(labels, devices, now_s=1.0)
    assert len(apiserver.requests) == writes
    assert await labeler.apply(labels, devices[:1], now_s=2.0)
    assert apiserver.nodes["gpu-1"]["status"]["capacity"][ACU] == "100"
    assert apiserver.nodes["gpu-1"]["status"]["allocatable"][DEVICES] == "1"


async def test_everything_is_written_again_after_the_resync_interval(apiserver, kube) -> None:
    apiserver.add_node("gpu-1")
    labeler = Labeler(kube, node="gpu-1", resync_s=60.0)
    labels = labels_of_devices([dev(0)], base={})
    assert await labeler.apply(labels, [dev(0)], now_s=0.0)
    apiserver.update_node("gpu-1", lambda n: n["metadata"]["labels"].clear())
    assert not await labeler.apply(labels, [dev(0)], now_s=59.0)
    assert await labeler.apply(labels, [dev(0)], now_s=60.0)
    assert apiserver.nodes["gpu-1"]["metadata"]["labels"]["hcs.io/model"] == "A100-80G"


async def test_a_missing_node_is_logged_once_and_tried_again_less_and_less_often(
    apiserver, kube, logs
) -> None:
    labeler = Labeler(kube, node="gpu-9", retry_s=10.0)
    labels = labels_of_devices([dev(0)], base={})
    assert not await labeler.apply(labels, [dev(0)], now_s=0.0)
    calls = len(apiserver.requests)
    assert not labeler.due(labels, [dev(0)], now_s=9.9)
    assert not await labeler.apply(labels, [dev(0)], now_s=9.9)
    assert len(apiserver.requests) == calls  # not asked again inside the retry interval
    assert labeler.due(labels, [dev(0)], now_s=10.0)
    assert not await labeler.apply(labels, [dev(0)], now_s=10.0)
    assert len(apiserver.requests) == calls + 1
    apiserver.add_node("gpu-9")
    assert not labeler.due(labels, [dev(0)], now_s=29.9)  # second miss: waits 20 s
    assert await labeler.apply(labels, [dev(0)], now_s=30.0)
    assert [e["event"] for e in logs if e["event"].startswith("node_")] == [
        "node_missing",
        "node_found",
        "node_labelled",
    ]
    assert apiserver.nodes["gpu-9"]["status"]["capacity"][DEVICES] == "1"


async def test_a_label_kubernetes_would_refuse_is_left_out_and_named_once(
    apiserver, kube, logs
) -> None:
    apiserver.add_node("gpu-1")
    labeler = Labeler(kube, node="gpu-1")
    labels = {"hcs.io/model": "A100-80G", "hcs.io/bad": "has space", "-bad/key": "x"}
    assert await labeler.apply(labels, [dev(0)], now_s=0.0)
    assert not await labeler.apply(labels, [dev(0)], now_s=1.0)
    refused = sorted(e["key"] for e in logs if e["event"] == "label_not_written")
    assert refused == ["-bad/key", "hcs.io/bad"]
    written = apiserver.nodes["gpu-1"]["metadata"]["labels"]
    assert written["hcs.io/model"] == "A100-80G" and "hcs.io/bad" not in written


async def test_without_a_cluster_the_labeler_logs_once_and_carries_on(logs) -> None:
    labeler = Labeler(None, node="gpu-1")
    assert not await labeler.apply({}, [dev(0)], now_s=0.0)
    assert not await labeler.apply({}, [dev(0)], now_s=1.0)
    assert [e["event"] for e in logs] == ["labels_skipped"]


async def test_a_fleet_pass_writes_only_the_nodes_that_changed(apiserver, kube) -> None:
    for name in ("a", "b"):
        apiserver.add_node(name)
    fleet = FleetLabeler(kube)
    targets = [Target("a", {"hcs.io/vendor": "nvidia"}, [dev(0)]), Target("b", {}, [dev(0)])]
    assert await fleet.label(targets, now_s=0.0) == 2
    assert await fleet.label(targets, now_s=1.0) == 0
    targets[1] = Target("b", {}, [dev(0, error="lost")])
    assert await fleet.label(targets, now_s=2.0) == 1
    assert apiserver.nodes["b"]["status"]["capacity"][DEVICES] == "0"


@pytest.mark.parametrize(
    ("text", "safe"),
    [
        ("AMD Instinct MI300X", "AMD-Instinct-MI300X"),
        ("AMD INSTINCT MI200 (MCM) OAM LC MBA HPE C2", "AMD-INSTINCT-MI200-MCM-OAM-LC-MBA-HPE-C2"),
        ("  (x) ", "x"),
        ("A100-80G", "A100-80G"),
        ("K" * 80, "K" * 63),
        ("()", ""),
    ],
)
def test_tool_names_become_valid_label_values(text, safe) -> None:
    assert label_safe(text) == safe
    assert valid_labels({"hcs.io/model": safe})[1] == {}


def test_every_known_model_and_vendor_is_a_valid_label_value() -> None:
    for p in profiles.load().all():
        _, bad = valid_labels({"hcs.io/vendor": p.vendor, "hcs.io/model": p.model})
        assert bad == {}, (p.key, bad)


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("hcs.io/network-group", "ng-a", True),
        ("topology.kubernetes.io/zone", "", True),
        ("zone", "z_1.a", True),
        ("Hcs.io/x", "v", False),
        ("/x", "v", False),
        ("hcs.io/", "v", False),
        ("hcs.io/x", "-v", False),
        ("hcs.io/x", "v" * 64, False),
        ("a/b/c", "v", False),
    ],
)
def test_label_keys_and_values_follow_the_kubernetes_rules(key, value, ok) -> None:
    good, bad = valid_labels({key: value})
    assert (key in good, key in bad) == (ok, not ok)
