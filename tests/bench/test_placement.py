"""``bench.burst --same-placement``: plain pods held to the nodes an HCS
burst used, as many per node, and the ratio against them."""

from __future__ import annotations

import pytest

from bench.burst import burst_pod, placement, report_pinned
from bench.mixes import Kind


def _pod(name: str, node: str | None, phase: str) -> dict:
    return {"metadata": {"name": name}, "spec": {"nodeName": node}, "status": {"phase": phase}}


def test_the_placement_is_each_started_pods_node_in_pod_order() -> None:
    pods = [
        _pod("hcs-0002", "gpu-b", "Running"),
        _pod("hcs-0000", "gpu-a", "Running"),
        _pod("hcs-0001", None, "Pending"),  # never started: no pinned twin
        _pod("hcs-0003", "gpu-a", "Running"),
        _pod("other-0004", "gpu-c", "Running"),  # another burst's
    ]
    assert placement(pods, label="hcs", count=5) == ["gpu-a", "gpu-b", "gpu-a"]


def test_a_pinned_pod_is_held_to_its_node_by_hostname_and_a_plain_one_is_not() -> None:
    kind = Kind("plain", 100, {"example.com/dev": "1"})
    pinned = burst_pod("plainpin-0000", kind, node="gpu-a")
    assert pinned["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-a"}
    assert pinned["spec"]["schedulerName"] == "hcs-scheduler"  # kube-scheduler still places it
    assert "nodeSelector" not in burst_pod("plain-0000", kind)["spec"]


def test_the_same_placement_ratio_is_hcs_over_the_pinned_plain_burst(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def run(label: str, per_s: float, cpu: float) -> dict:
        return {
            "label": label,
            "pods_per_s": per_s,
            "running": 100,
            "cpu_wall_s": 10.0,
            "cpu_s": {"kubelets": ("kube", cpu)},
        }

    plain, hcs, pinned = run("plain", 50.0, 3.0), run("hcs", 30.0, 5.0), run("plainpin", 40.0, 4.0)
    report_pinned(plain, hcs, pinned, {"kubelets": 0.0})
    out = capsys.readouterr().out
    assert "40.0 pods/s, hcs 30.0; ratio 0.75, by CPU 0.80" in out
    assert "plainpin ran at 0.80 of plain (50.0 pods/s)" in out
