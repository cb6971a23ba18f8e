"""The tier's own failure messages: a component that dies while the cluster
starts is named with its binary and the last lines of its log (no cluster
binaries needed)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.e2e.cluster import find_binaries
from tests.e2e.processes import ClusterError, Process, Revive, died_of_fake_os_race, stop_all


def test_a_component_that_dies_at_start_is_named_with_its_binary_and_its_last_log_lines(
    tmp_path: Path,
) -> None:
    script = tmp_path / "fake-apiserver"
    script.write_text(
        "#!/bin/sh\necho 'starting'\necho 'E0101 bind: address already in use' >&2\nexit 3\n"
    )
    script.chmod(0o755)
    process = Process("kube-apiserver", [str(script)], logs=tmp_path / "logs")
    with pytest.raises(ClusterError) as failed:
        process.wait_until(lambda: False, what="ready (/readyz)", timeout_s=10)
    message = str(failed.value)
    assert "kube-apiserver" in message and str(script) in message
    assert "exited with 3" in message and "address already in use" in message


def test_a_missing_binary_folder_names_what_is_missing(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HCS_KUBE_BIN", raising=False)
    assert "HCS_KUBE_BIN is not set" in str(find_binaries())
    (tmp_path / "kube-apiserver").write_text("")
    monkeypatch.setenv("HCS_KUBE_BIN", str(tmp_path))
    assert find_binaries() == f"kube-apiserver not found in HCS_KUBE_BIN={tmp_path}"


# the head of the crash a hollow kubelet (kubemark v1.26) died of in bench.burst
FAKE_OS_CRASH = """\
I1127 10:45:42.539156   24903 fake_topology_manager.go:72] "AddContainer" pod="burst-hcs/hcs-0622"
fatal error: concurrent map writes

goroutine 2252 [running]:
k8s.io/kubernetes/pkg/kubelet/container/testing.(*FakeOS).Create(0xc000e3a4b0?, {0xc00141c4e0?, 0x413a6e?})
\t/tmp/e2e/k8s-src/pkg/kubelet/container/testing/os.go:87 +0x8e
k8s.io/kubernetes/pkg/kubelet/kuberuntime.(*kubeGenericRuntimeManager).makeMounts(0xc00095b680)
"""
# two goroutines caught the race at once: the second's header lands before
# the traceback, or inside it, even within a frame's line (CI: a kubelet so
# crashed was left for dead)
SECOND = "fatal error: concurrent map writes\n"
FAKE_OS_CRASH_TWICE = FAKE_OS_CRASH.replace(SECOND, SECOND + SECOND)
FAKE_OS_CRASH_WITHIN = FAKE_OS_CRASH.replace("[running]:\n", "[running]:\n" + SECOND).replace(
    "(*FakeOS).Create(", "(*FakeOS).Create(" + SECOND
)
OTHER_CRASH = """\
fatal error: concurrent map writes

goroutine 7 [running]:
k8s.io/kubernetes/pkg/kubelet/status.(*manager).syncPod(0xc000a)
"""


def _kubelet(tmp_path: Path, name: str, crash: str, *, after_s: float = 0) -> Process:
    """A stand-in hollow kubelet: the first run prints ``crash`` and exits 2
    (``after_s`` after it starts), every later one runs until stopped."""
    (tmp_path / f"{name}.crash").write_text(crash)
    script = tmp_path / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ ! -e "{tmp_path}/{name}.ran" ]; then\n'
        f'  touch "{tmp_path}/{name}.ran"; sleep {after_s}; cat "{tmp_path}/{name}.crash"; exit 2\n'
        "fi\n"
        "exec sleep 60\n"
    )
    script.chmod(0o755)
    return Process(f"kubelet-{name}", [str(script)], logs=tmp_path / "logs")


def test_a_hollow_kubelet_killed_by_kubemarks_fake_os_race_is_started_again_and_no_other(
    tmp_path: Path,
) -> None:
    raced, other = (
        _kubelet(tmp_path, "raced", FAKE_OS_CRASH),
        _kubelet(tmp_path, "other", OTHER_CRASH, after_s=0.5),  # dies after raced is back
    )
    nodes = {"raced": raced, "other": other}
    replaced: list[tuple[Process, Process]] = []
    started_again = threading.Event()

    def on_replaced(old: Process, new: Process) -> None:
        replaced.append((old, new))
        started_again.set()

    judged: dict[str, bool] = {}
    both_judged = threading.Event()

    def revivable(process: Process) -> bool:  # Revive's own rule, watched
        judged[process.name] = verdict = died_of_fake_os_race(process)
        if {"kubelet-raced", "kubelet-other"} <= judged.keys():
            both_judged.set()
        return verdict

    revive = Revive(nodes, revivable=revivable, replaced=on_replaced, every_s=0.05)
    revive.start()
    try:
        # each stand-in dies on its own schedule: wait until Revive has seen both deaths
        assert started_again.wait(timeout=10) and both_judged.wait(timeout=10)
        assert judged == {"kubelet-raced": True, "kubelet-other": False}
        assert revive.revived == ["raced"]
        fresh = nodes["raced"]
        assert fresh is not raced and fresh.alive and replaced == [(raced, fresh)]
        assert fresh.log == raced.log and "concurrent map writes" in fresh.log.read_text()
        assert not other.alive and nodes["other"] is other  # its crash is not the test double's
        assert died_of_fake_os_race(raced) and not died_of_fake_os_race(other)
        assert not died_of_fake_os_race(fresh)  # running
        fresh.stop()  # stopped, its log still holding the crash of the run before it
        assert not fresh.alive and not died_of_fake_os_race(fresh)
    finally:
        revive.stop()
        stop_all(list(nodes.values()))


@pytest.mark.parametrize(
    ("crash", "revivable"),
    [
        (FAKE_OS_CRASH, True),
        (FAKE_OS_CRASH_TWICE, True),
        (FAKE_OS_CRASH_WITHIN, True),
        (OTHER_CRASH, False),
        (FAKE_OS_CRASH.replace("concurrent map writes", "out of memory"), False),
    ],
    ids=["one-header", "two-headers", "header-within-frames", "status-manager", "not-a-race"],
)
def test_a_crashed_kubelet_is_judged_by_its_crashing_frame_and_named_with_the_crash_head(
    tmp_path: Path, crash: str, revivable: bool
) -> None:
    kubelet = _kubelet(tmp_path, "n1", crash + "".join(f"frame {i}\n" for i in range(40)))
    kubelet.popen.wait(timeout=10)
    assert died_of_fake_os_race(kubelet) is revivable
    message = str(kubelet.failure("stopped"))
    # the crash's head and its goroutine's first frame are named, though the
    # log's last lines (named too) are far below them
    head = message[message.index("It crashed:\nfatal error: ") :]
    assert "(*FakeOS).Create(" in head or "status.(*manager).syncPod(" in head
    assert "frame 39" in message
