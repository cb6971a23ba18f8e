"""The backstop loop on recorded NVML readings, a fake /proc and the
API-server double: it reports the pod over quota and, as configured, kills
its processes or evicts it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.backstopping import Backstop
from agents.overquota import Action, ProcessUsage, usages_from_records
from hcs_bus.kube import Kube
from hcs_bus.messages import HealthEvent
from tests.apiserver import ApiServer

from .conftest import fixture_text

NODE = "gpu-node-7"
TRAINER = "5c1e7a0b-3f4d-4c8e-9a21-0d6b2f1e9c47"
CGROUPS = {
    41231: "backstop-cgroup-v2-systemd.txt",
    41267: "backstop-cgroup-v2-systemd.txt",
    52010: "backstop-cgroup-v2-cgroupfs-guaranteed.txt",
    60001: "backstop-cgroup-v1-cgroupfs.txt",
    1877: "backstop-cgroup-host.txt",
}


class Sink:
    def __init__(self) -> None:
        self.events: list[HealthEvent] = []

    def health(self, event: HealthEvent) -> HealthEvent:
        self.events.append(event)
        return event


@pytest.fixture
def proc_root(tmp_path: Path) -> Path:
    root = tmp_path / "proc"
    for pid, fixture in CGROUPS.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(fixture_text(fixture))
    return root


@pytest.fixture
def pods(apiserver: ApiServer) -> ApiServer:
    for pod in json.loads(fixture_text("backstop-pods.json"))["items"]:
        meta = pod["metadata"]
        apiserver.add_pod(
            meta["namespace"],
            meta["name"],
            node=NODE,
            annotations=meta["annotations"],
            uid=meta["uid"],
        )
    apiserver.add_pod(
        "ml", "elsewhere", node="other-node", uid="11111111-2222-3333-4444-555555555555"
    )
    return apiserver


def recorded() -> list[ProcessUsage]:
    return usages_from_records(json.loads(fixture_text("backstop-nvml-processes.json")))


def backstop(
    kube: Kube, proc_root: Path, *, action: Action, kills: list[int]
) -> tuple[Backstop, Sink]:
    sink = Sink()
    return (
        Backstop(
            node=NODE,
            kube=kube,
            sink=sink,
            readers=[recorded],
            action=action,
            slack_mib=512,
            confirm_sweeps=2,
            proc_root=proc_root,
            kill=lambda pid, sig: kills.append(pid),
        ),
        sink,
    )


async def test_report_names_the_pod_and_its_processes_once_and_touches_nothing(
    pods: ApiServer, kube: Kube, proc_root: Path
) -> None:
    kills: list[int] = []
    stop, sink = backstop(kube, proc_root, action="report", kills=kills)
    for now in (1.0, 2.0, 3.0):
        await stop.sweep(now=now)
    assert [(e.kind, e.evidence["pod"], e.evidence["pids"], e.device) for e in sink.events] == [
        ("vram_over_quota", "trainer-0", "41231,41267", 2)
    ]
    assert kills == []
    assert ("ml", "trainer-0") in pods.pods


async def test_kill_ends_the_largest_process_of_the_pod_once_confirmed(
    pods: ApiServer, kube: Kube, proc_root: Path
) -> None:
    kills: list[int] = []
    stop, sink = backstop(kube, proc_root, action="kill", kills=kills)
    await stop.sweep(now=1.0)
    assert kills == []  # reported, not yet confirmed
    await stop.sweep(now=2.0)
    assert kills == [41231]
    assert sink.events[0].evidence["action"] == "kill"


async def test_kill_spares_a_pid_reused_by_another_process_since_the_reading(
    pods: ApiServer, kube: Kube, proc_root: Path
) -> None:
    kills: list[int] = []
    stop, _ = backstop(kube, proc_root, action="kill", kills=kills)
    await stop.sweep(now=1.0)
    (proc_root / "41231" / "cgroup").write_text(fixture_text("backstop-cgroup-host.txt"))
    await stop.sweep(now=2.0)
    assert kills == []


async def test_evict_evicts_the_pod_over_quota_and_no_other(
    pods: ApiServer, kube: Kube, proc_root: Path
) -> None:
    stop, _ = backstop(kube, proc_root, action="evict", kills=[])
    await stop.sweep(now=1.0)
    assert ("ml", "trainer-0") in pods.pods
    await stop.sweep(now=2.0)
    assert ("ml", "trainer-0") not in pods.pods
    assert {("lab", "notebook"), ("ml", "whole-gpu"), ("ml", "elsewhere")} <= set(pods.pods)


async def test_an_eviction_refused_by_a_disruption_budget_is_tried_again(
    pods: ApiServer, kube: Kube, proc_root: Path
) -> None:
    pods.fail("create", "pods/eviction", code=429)
    stop, _ = backstop(kube, proc_root, action="evict", kills=[])
    await stop.sweep(now=1.0)
    await stop.sweep(now=2.0)  # refused: still there
    assert ("ml", "trainer-0") in pods.pods
    await stop.sweep(now=3.0)
    assert ("ml", "trainer-0") not in pods.pods


async def test_without_readings_the_api_server_is_not_asked(
    pods: ApiServer, kube: Kube, proc_root: Path
) -> None:
    sink = Sink()
    stop = Backstop(
        node=NODE,
        kube=kube,
        sink=sink,
        readers=[list],
        action="report",
        slack_mib=512,
        confirm_sweeps=2,
        proc_root=proc_root,
    )
    before = len(pods.requests)
    assert await stop.sweep(now=1.0) == []
    assert len(pods.requests) == before
