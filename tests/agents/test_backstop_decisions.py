"""The backstop's decisions: which pod a process belongs to, what a quota
annotation means, when a pod is over quota, and what to do about it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agents.backstopping import tool_reader
from agents.overquota import (
    Evict,
    Kill,
    Overrun,
    PodQuota,
    ProcessUsage,
    Streaks,
    health_event,
    hy_smi_processes,
    npu_smi_processes,
    overruns,
    parse_quota,
    plan,
    pod_quota,
    pod_uid_of_cgroup,
    quotas_of_pods,
    usages_from_records,
)
from agents.parsing import hy_smi

from .conftest import fixture_text

GiB = 1 << 30
MiB = 1 << 20
TRAINER = "5c1e7a0b-3f4d-4c8e-9a21-0d6b2f1e9c47"


@pytest.mark.parametrize(
    ("fixture", "uid"),
    [
        ("backstop-cgroup-v2-systemd.txt", TRAINER),
        ("backstop-cgroup-v2-cgroupfs-guaranteed.txt", "0f6a2c44-9b1e-4d7a-8c33-5e2b7d9a1f08"),
        ("backstop-cgroup-v1-cgroupfs.txt", "9d3c7e21-4a5b-4f6c-8d7e-1f2a3b4c5d6e"),
        ("backstop-cgroup-v1-systemd.txt", "2b8d4f60-1c3e-4a5b-9d7f-8e6c4a2b0d19"),
        ("backstop-cgroup-host.txt", None),
    ],
)
def test_a_process_is_mapped_to_its_pod_under_both_cgroup_versions_and_drivers(
    fixture: str, uid: str | None
) -> None:
    assert pod_uid_of_cgroup(fixture_text(fixture)) == uid


def test_a_cgroup_path_that_merely_mentions_pod_is_not_a_pod() -> None:
    assert pod_uid_of_cgroup("0::/system.slice/podman-pod-1234.scope\n") is None
    assert pod_uid_of_cgroup("") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("16Gi", (16 * GiB, {})),
        ("1.5Gi", (3 * GiB // 2, {})),
        ("0:16Gi,1:8Gi", (None, {0: 16 * GiB, 1: 8 * GiB})),
        (" 2G ", (2_000_000_000, {})),
    ],
)
def test_quota_annotation_is_read_like_the_interceptor_reads_it(
    text: str, expected: tuple[int | None, dict[int, int]]
) -> None:
    assert parse_quota(text) == expected


@pytest.mark.parametrize("text", ["lots", "0:16Gi,x:1Gi", "0:", "-1Gi"])
def test_a_quota_that_cannot_be_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quota(text)


def test_per_device_quota_follows_the_pods_device_list() -> None:
    pods = json.loads(fixture_text("backstop-pods.json"))["items"]
    trainer = pod_quota(pods[0])
    assert trainer is not None
    assert trainer.devices == (2, 3)
    assert [trainer.quota_of(d) for d in (0, 1, 2, 3)] == [None, None, 16 * GiB, 8 * GiB]
    notebook = pod_quota(pods[1])
    assert notebook is not None and notebook.quota_of(0) == 10 * GiB
    assert pod_quota(pods[2]) is None  # no quota annotation


def test_finished_pods_and_pods_without_quota_are_left_out() -> None:
    pods = json.loads(fixture_text("backstop-pods.json"))["items"]
    pods[1]["status"]["phase"] = "Succeeded"
    assert set(quotas_of_pods(pods)) == {TRAINER}


def recorded() -> tuple[list[ProcessUsage], dict[str, PodQuota]]:
    usages = usages_from_records(json.loads(fixture_text("backstop-nvml-processes.json")))
    quotas = quotas_of_pods(json.loads(fixture_text("backstop-pods.json"))["items"])
    return usages, quotas


PIDS = {
    41231: TRAINER,
    41267: TRAINER,
    52010: "0f6a2c44-9b1e-4d7a-8c33-5e2b7d9a1f08",
    60001: "9d3c7e21-4a5b-4f6c-8d7e-1f2a3b4c5d6e",
}


def test_only_the_pod_over_its_quota_on_a_device_is_found() -> None:
    usages, quotas = recorded()
    found = overruns(usages, pod_of_pid=PIDS, quotas=quotas, slack_per_process_b=512 * MiB)
    assert [(o.pod.name, o.device, o.used_b, o.quota_b) for o in found] == [
        ("trainer-0", 2, 18 * GiB, 16 * GiB)
    ]
    assert [p.pid for p in found[0].processes] == [41231, 41267]  # largest first


def test_slack_for_the_drivers_context_is_allowed_per_process() -> None:
    usages, quotas = recorded()
    # 18 GiB in two processes: within 16 GiB + 2 x 1 GiB
    assert overruns(usages, pod_of_pid=PIDS, quotas=quotas, slack_per_process_b=GiB) == []


def test_processes_outside_any_pod_are_never_judged() -> None:
    usages, quotas = recorded()
    assert overruns(usages, pod_of_pid={}, quotas=quotas) == []


def overrun() -> Overrun:
    usages, quotas = recorded()
    return overruns(usages, pod_of_pid=PIDS, quotas=quotas)[0]


def test_the_health_event_names_pod_processes_and_sizes() -> None:
    event = health_event(overrun(), node="gpu-node-7", now=1700000000.0, action="kill")
    assert event.kind == "vram_over_quota" and event.device == 2 and event.source == "agent"
    assert event.evidence == {
        "namespace": "ml",
        "pod": "trainer-0",
        "pod_uid": TRAINER,
        "pids": "41231,41267",
        "used_b": 18 * GiB,
        "quota_b": 16 * GiB,
        "action": "kill",
    }
    assert "ml/trainer-0" in event.message and "41231" in event.message


def test_report_plans_nothing_and_evict_plans_the_pods_eviction() -> None:
    o = overrun()
    assert plan(o, action="report") == []
    assert plan(o, action="evict") == [
        Evict(
            namespace="ml",
            name="trainer-0",
            uid=TRAINER,
            reason="18432 MiB over a quota of 16384 MiB",
        )
    ]


def test_kill_takes_the_largest_processes_until_the_pod_fits() -> None:
    kills = plan(overrun(), action="kill")
    assert [k.pid for k in kills if isinstance(k, Kill)] == [41231]
    pod = overrun().pod
    crowd = Overrun(
        pod=pod,
        device=2,
        used_b=20 * GiB,
        quota_b=5 * GiB,
        processes=tuple(ProcessUsage(pid=p, device=2, used_b=5 * GiB) for p in (1, 2, 3, 4)),
    )
    assert [k.pid for k in plan(crowd, action="kill") if isinstance(k, Kill)] == [1, 2, 3]


def test_an_overrun_is_reported_when_it_starts_and_acted_on_once_confirmed() -> None:
    o = overrun()
    streaks = Streaks(confirm=2)
    assert streaks.step([o]) == ([o], [])
    assert streaks.step([o]) == ([], [o])
    assert streaks.step([o]) == ([], [o])
    assert streaks.step([]) == ([], [])
    assert streaks.step([o]) == ([o], [])  # a new overrun after it cleared


def test_npu_smi_process_table_gives_per_process_memory() -> None:
    assert npu_smi_processes(fixture_text("npu-smi-info-910b.txt")) == [
        ProcessUsage(pid=184536, device=2, used_b=31568 * MiB)
    ]
    assert npu_smi_processes("garbage\n| 1 0 | 2 | x | 3 |\n") == []


def test_hy_smi_showpids_gives_the_processes_on_one_device_and_their_overrun() -> None:
    text = fixture_text("hy-smi-bw1000-showpids.txt")
    assert hy_smi.processes(text) == [
        hy_smi.HyProcess(pid=2004092, devices=(1,), vram_mib=9649),
        hy_smi.HyProcess(pid=3865170, devices=(2, 3), vram_mib=18660),
    ]
    # the process on two devices has no per-device figure: left out
    usages = hy_smi_processes(text)
    assert usages == [ProcessUsage(pid=2004092, device=1, used_b=9649 * MiB)]
    assert hy_smi_processes("No KFD PIDs currently running!\n") == []
    quota = PodQuota(uid=TRAINER, namespace="ml", name="dcu-0", devices=(1,), every_device=8 * GiB)
    [found] = overruns(usages, pod_of_pid={2004092: TRAINER}, quotas={TRAINER: quota})
    assert (found.pod.name, found.device, found.used_b) == ("dcu-0", 1, 9649 * MiB)


def test_a_vendor_tool_reader_runs_the_tool_and_reads_nothing_when_it_fails(tmp_path) -> None:
    fixture = Path(__file__).with_name("fixtures") / "hy-smi-bw1000-showpids.txt"
    tool = tmp_path / "hy-smi"
    tool.write_text(f'#!/bin/sh\n[ "$1" = --showpids ] && cat {fixture} || exit 3\n')
    tool.chmod(0o755)
    read = tool_reader([str(tool), "--showpids"], hy_smi_processes, timeout_s=5)
    assert [u.pid for u in read()] == [2004092]
    assert tool_reader([str(tool), "--other"], hy_smi_processes, timeout_s=5)() == []
