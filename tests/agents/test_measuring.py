from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import MutableMapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from agents import benchmark, measuring
from agents.parsing import npu_smi, nvml_readings
from hcs_bus import profiles
from hcs_bus.messages import Compute, DeviceFingerprint, Telemetry
from tests.agents.conftest import FIXTURES, fixture_text
from tests.agents.test_changes import dev
from tests.agents.test_publishing import until

FAKE_TORCH = Path(__file__).parent / "faketorch"


def test_tflops_counts_two_n_cubed_operations_per_matmul() -> None:
    assert benchmark.tflops(n=8192, iterations=20, elapsed_s=0.1) == pytest.approx(219.9, abs=0.1)
    assert measuring.acu_of(312.0) == 100.0
    with pytest.raises(ValueError, match="elapsed_s"):
        benchmark.tflops(n=8192, iterations=1, elapsed_s=0)


def test_measured_compute_is_the_profile_scaled_by_the_models_benchmark_and_wins() -> None:
    device = measuring.with_measured(dev(0), 238.0, bench_tflops=280.0)  # 85 % of a healthy one
    assert device.compute.acu_profile == 100 and device.compute.acu_measured == 85.0
    assert device.compute.acu == 85.0 and device.compute.tflops_fp16_measured == 238.0
    none = measuring.with_measured(dev(0), None, bench_tflops=280.0)
    assert none.compute.acu_measured is None and none.compute.tflops_fp16_measured is None


def test_without_a_benchmark_figure_the_profile_stands_and_the_raw_figure_is_kept() -> None:
    # 764 TFLOPS is a healthy H100, 77 % of its peak: as a share of the A100's
    # peak it would read 245 ACU against the profile's 317
    h100 = dev(0, model="H100-SXM", compute=Compute(acu_profile=317.15, tflops_fp16_profile=989.5))
    device = measuring.with_measured(h100, 764.0, bench_tflops=None)
    assert device.compute.acu_measured is None and device.compute.acu == 317.15
    assert device.compute.tflops_fp16_measured == 764.0


def test_the_benchmark_figure_comes_from_the_devices_profile(db: profiles.ProfileDB) -> None:
    h100 = db.get("nvidia/H100-SXM")
    assert h100.bench_tflops_fp16 is not None and h100.bench_tflops_fp16 < h100.tflops_fp16
    assert measuring.bench_of(db, dev(0, model="H100-SXM")) == h100.bench_tflops_fp16
    assert measuring.bench_of(db, dev(0, model="A100-80G")) is None  # nobody measured one
    assert measuring.bench_of(db, dev(0, model="no-such-card")) is None
    healthy = measuring.with_measured(
        dev(0, model="H100-SXM", compute=Compute(acu_profile=h100.acu, tflops_fp16_profile=989.5)),
        h100.bench_tflops_fp16,
        bench_tflops=h100.bench_tflops_fp16,
    )
    assert healthy.compute.acu == pytest.approx(h100.acu, abs=0.01)


@pytest.mark.skipif(benchmark.backend() is None, reason=benchmark.SKIP_REASON)
async def test_a_real_device_measures_a_positive_throughput_in_a_child() -> None:
    measured = await measuring.measure_in_child([0], timeout_s=120, n=2048, iterations=5)
    assert measured is not None and measured[0] > 1.0


def referenced_profile(db: profiles.ProfileDB) -> tuple[profiles.Profile | None, str]:
    """The profile of GPU 0 where it has a benchmark figure, and why not."""
    found = benchmark.backend()
    if found is None:
        return None, benchmark.SKIP_REASON
    torch, _ = found
    name = torch.cuda.get_device_name(0)
    profile = db.match("nvidia", name)
    with_figure = [p.model for p in db.all() if p.bench_tflops_fp16 is not None]
    if profile is None or profile.bench_tflops_fp16 is None:
        return (
            None,
            f"needs a GPU whose profile has bench_tflops_fp16 ({with_figure}), not {name!r}",
        )
    return profile, ""


async def test_a_healthy_device_measures_near_its_models_figure(db: profiles.ProfileDB) -> None:
    profile, why = referenced_profile(db)
    if profile is None:
        pytest.skip(why)
    assert profile.bench_tflops_fp16 is not None
    found = await measuring.measure_in_child([0], timeout_s=120)  # as the agent runs it
    assert found is not None
    measured = found[0]
    # on the H100 the figure came from, ten runs in a row gave 0.84 to 1.0 of it
    assert 0.75 < measured / profile.bench_tflops_fp16 < 1.2, (measured, profile.key)


def test_the_measurement_is_also_the_achieved_throughput_the_healer_compares() -> None:
    device = measuring.with_measured(dev(0), 238.04, bench_tflops=None)
    assert device.telemetry.achieved_tflops_fp16 == 238.0
    assert dev(0).telemetry.achieved_tflops_fp16 is None


def busy(index: int) -> DeviceFingerprint:
    return dev(index, telemetry=Telemetry(utilisation_pct=97.0), vram_free_mib=20000)


async def test_each_device_is_measured_once_and_only_while_idle() -> None:
    runs: list[list[int]] = []

    async def run(indices: Sequence[int]) -> dict[int, float]:
        runs.append(list(indices))
        return {i: 200.0 + i for i in indices}

    measurer = measuring.Measurer(run=run, available=lambda: True)
    lost = dev(3, error="nvml: GPU is lost")
    await measurer.update([dev(0), busy(1), dev(2), lost])
    assert runs == [[0, 2]] and measurer.deferred == {"GPU-1"}  # one child for both
    await measurer.update([dev(0), busy(1), dev(2), lost])
    assert runs == [[0, 2]]  # measured once; still busy; still lost
    await measurer.update([dev(0), dev(1), dev(2), lost])  # the job on GPU 1 ended
    assert runs == [[0, 2], [1]] and measurer.deferred == set()
    measured = measurer.apply(dev(1), bench_tflops=201.0)
    assert measured.compute.tflops_fp16_measured == 201.0 and measured.compute.acu == 100.0
    assert measurer.apply(lost, bench_tflops=201.0).compute.tflops_fp16_measured is None


async def test_without_a_backend_nothing_is_measured_and_it_is_not_asked_again() -> None:
    asked: list[bool] = []

    def available() -> bool:
        asked.append(True)
        return False

    async def run(indices: Sequence[int]) -> dict[int, float]:
        raise AssertionError("measured without a backend")

    measurer = measuring.Measurer(run=run, available=available)
    for _ in range(3):
        await measurer.update([dev(0)])
    assert asked == [True] and measurer.unavailable
    assert measurer.apply(dev(0), bench_tflops=280.0) == dev(0)


async def test_pytorch_without_a_device_is_asked_once() -> None:
    runs: list[list[int]] = []

    async def run(indices: Sequence[int]) -> None:
        runs.append(list(indices))

    measurer = measuring.Measurer(run=run, available=lambda: True)
    for _ in range(3):
        await measurer.update([dev(0), dev(1)])
    assert runs == [[0, 1]] and measurer.unavailable


async def test_a_failed_benchmark_keeps_what_it_finished_and_gives_up_after_three_tries(
    logs: list[MutableMapping[str, Any]],
) -> None:
    runs: list[list[int]] = []

    async def run(indices: Sequence[int]) -> dict[int, float]:
        runs.append(list(indices))
        done = {0: 300.0} if 0 in indices else {}
        raise measuring.MeasureFailed("benchmark exited with 1: CUDA error", measured=done)

    measurer = measuring.Measurer(run=run, available=lambda: True)
    for _ in range(5):
        await measurer.update([dev(0), dev(1)])
    assert runs == [[0, 1], [1], [1]]  # GPU 0 done at once; GPU 1 tried three times
    assert measurer.tflops == {"GPU-0": 300.0} and measurer.failures == {"GPU-1": 3}
    assert measurer.apply(dev(1), bench_tflops=280.0) == dev(1)  # its profile stands
    failed = [e for e in logs if e["event"] == "acu_measure_failed"]
    assert [(e["uuid"], e["tries"], e["gives_up"]) for e in failed] == [
        ("GPU-1", 1, False),
        ("GPU-1", 2, False),
        ("GPU-1", 3, True),
    ]
    assert all(e["error"] == "benchmark exited with 1: CUDA error" for e in failed)
    assert [e["uuid"] for e in logs if e["event"] == "acu_measured"] == ["GPU-0"]


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_each_device_is_measured_again_once_its_interval_has_passed_and_it_is_idle(
    logs: list[MutableMapping[str, Any]],
) -> None:
    """A device that slows down in service shows it at its next round; until
    then, and while it is busy, its last figure stands."""
    figures = iter([764.0, 600.0])
    runs: list[float] = []
    clock = Clock()

    async def run(indices: Sequence[int]) -> dict[int, float]:
        runs.append(clock.now)
        return {0: next(figures)}

    measurer = measuring.Measurer(run=run, available=lambda: True, every_s=3600, clock=clock)
    for clock.now in (0.0, 100.0, 3599.0):
        await measurer.update([dev(0)])
    assert runs == [0.0]
    clock.now = 3600.0
    await measurer.update([busy(0)])
    assert runs == [0.0] and measurer.deferred == {"GPU-0"}
    assert measurer.apply(dev(0), bench_tflops=764.0).compute.tflops_fp16_measured == 764.0
    clock.now = 3700.0
    await measurer.update([dev(0)])
    assert runs == [0.0, 3700.0]
    slowed = measurer.apply(dev(0), bench_tflops=764.0)
    assert slowed.compute.tflops_fp16_measured == 600.0
    assert slowed.telemetry.achieved_tflops_fp16 == 600.0  # the healer's slow-device signal
    clock.now = 3700.0 + 3599.0
    await measurer.update([dev(0)])
    assert runs == [0.0, 3700.0]  # the next round counts from the last
    measured = [(e["tflops_fp16"], e["previous"]) for e in logs if e["event"] == "acu_measured"]
    assert measured == [(764.0, None), (600.0, 764.0)]


async def test_measured_again_a_device_must_hold_no_more_than_it_did_at_rest() -> None:
    """A tenant that computes nothing at the moment still holds its context
    (about 0.5 GiB on an H100): the device is not idle for a second round."""
    clock = Clock()
    runs: list[float] = []

    async def run(indices: Sequence[int]) -> dict[int, float]:
        runs.append(clock.now)
        return {0: 764.0}

    measurer = measuring.Measurer(run=run, available=lambda: True, every_s=3600, clock=clock)
    rest = dev(0, vram_free_mib=81920 - 480)
    await measurer.update([rest])
    assert measurer.rest_mib == {"GPU-0": 480}
    clock.now = 3600.0
    tenant = dev(0, vram_free_mib=81920 - 480 - 500)  # 0 % busy, 1.2 % of memory held
    assert measuring.idle(tenant)  # idle enough for a first measurement
    await measurer.update([tenant])
    assert runs == [0.0] and measurer.deferred == {"GPU-0"}
    clock.now = 3700.0
    await measurer.update([dev(0, vram_free_mib=81920 - 480 - measuring.REST_MARGIN_MIB)])
    assert runs == [0.0, 3700.0]


async def test_a_round_that_fails_keeps_the_last_figure_and_the_next_round_tries_again() -> None:
    clock = Clock()
    runs: list[float] = []
    answers = iter([{0: 764.0}, None, None, None, {0: 700.0}])

    async def run(indices: Sequence[int]) -> dict[int, float]:
        runs.append(clock.now)
        answer = next(answers)
        if answer is None:
            raise measuring.MeasureFailed("benchmark exited with 1: CUDA error")
        return answer

    measurer = measuring.Measurer(run=run, available=lambda: True, every_s=3600, clock=clock)
    for clock.now in (0.0, 3600.0, 3601.0, 3602.0, 3603.0, 3604.0):
        await measurer.update([dev(0)])
    assert runs == [0.0, 3600.0, 3601.0, 3602.0]  # three tries, then it gives up the round
    assert measurer.tflops == {"GPU-0": 764.0} and measurer.failures == {"GPU-0": 3}
    clock.now = 3602.0 + 3600.0
    await measurer.update([dev(0)])
    assert runs[-1] == 7202.0 and measurer.tflops == {"GPU-0": 700.0}
    assert measurer.failures == {}


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The benchmark child imports tests/agents/faketorch's torch; returns the
    file where that child writes its pid."""
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join([str(FAKE_TORCH), os.environ.get("PYTHONPATH", "")])
    )
    monkeypatch.setenv("HCS_FAKE_TORCH_REPORT", str(tmp_path / "child.json"))
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST")  # what the child must not keep
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # nor this: NVML's indices count every GPU
    return tmp_path / "child.json"


def child_of(report: Path) -> dict[str, object]:
    child: dict[str, object] = json.loads(report.read_text())
    return child


def gone(pid: object) -> bool:
    """No such process, or only its exit status left (a zombie)."""
    assert isinstance(pid, int)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


async def test_the_benchmark_child_measures_each_device_in_nvml_order_and_is_gone_after(
    fake_torch: Path,
) -> None:
    measured = await measuring.measure_in_child([0, 1], timeout_s=60, n=64, iterations=2)
    assert measured is not None and sorted(measured) == [0, 1]
    assert all(tflops > 0 for tflops in measured.values())
    child = child_of(fake_torch)
    assert child["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" and child["CUDA_VISIBLE_DEVICES"] is None
    assert gone(child["pid"])  # its context went with it


async def test_a_child_without_a_device_says_so(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HCS_FAKE_TORCH", "none")
    assert await measuring.measure_in_child([0], timeout_s=60) is None


async def test_a_crashed_child_keeps_the_devices_it_finished_and_names_the_error(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HCS_FAKE_TORCH", "crash")  # device 1 fails
    with pytest.raises(
        measuring.MeasureFailed, match="exited with 1: RuntimeError: CUDA error"
    ) as e:
        await measuring.measure_in_child([0, 1], timeout_s=60, n=64, iterations=2)
    assert list(e.value.measured) == [0] and gone(child_of(fake_torch)["pid"])


async def test_a_child_that_cannot_be_started_is_a_failed_measurement(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "executable", str(fake_torch.parent / "no-such-python"))
    with pytest.raises(
        measuring.MeasureFailed, match=r"devices \[0\] not started: .*no-such-python"
    ):
        await measuring.measure_in_child([0], timeout_s=60)


async def test_a_hung_child_is_killed_at_the_timeout(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HCS_FAKE_TORCH", "hang")
    with pytest.raises(measuring.MeasureFailed, match=r"still running after 2 s; killed"):
        await measuring.measure_in_child([0], timeout_s=2, n=64, iterations=2)
    assert gone(child_of(fake_torch)["pid"])


async def test_a_cancelled_measurement_kills_its_child(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HCS_FAKE_TORCH", "hang")
    task = asyncio.get_running_loop().create_task(measuring.measure_in_child([0], timeout_s=600))
    await until(fake_torch.exists, timeout_s=30)  # the child is in the benchmark
    await until(lambda: bool(fake_torch.read_text()), timeout_s=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert gone(child_of(fake_torch)["pid"])


async def test_a_child_dies_with_the_agent_that_started_it(
    fake_torch: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HCS_FAKE_TORCH", "hang")
    root = str(Path(measuring.__file__).parent.parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([root, os.environ["PYTHONPATH"]]))
    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import asyncio; from agents import measuring;"
        " asyncio.run(measuring.measure_in_child([0], timeout_s=600))",
    )
    try:
        await until(lambda: fake_torch.exists() and bool(fake_torch.read_text()), timeout_s=30)
    finally:
        agent.kill()  # as SIGKILL or the OOM killer would
        await agent.wait()
    await until(lambda: gone(child_of(fake_torch)["pid"]), timeout_s=10)


async def test_the_agents_measurer_runs_the_child_by_default(fake_torch: Path) -> None:
    measurer = measuring.Measurer(timeout_s=60, available=lambda: True)
    await measurer.update([dev(0), dev(1)])
    assert set(measurer.tflops) == {"GPU-0", "GPU-1"} and not measurer.failures
    assert measurer.apply(dev(1), bench_tflops=None).telemetry.achieved_tflops_fp16 is not None


@pytest.mark.parametrize(
    ("device", "ready"),
    [
        (dev(0), True),
        (dev(0, telemetry=Telemetry(utilisation_pct=4.9)), True),
        (dev(0, telemetry=Telemetry(utilisation_pct=5.0)), False),
        (dev(0, vram_free_mib=81920 - 8192), True),  # a tenth of the memory: a driver's
        (dev(0, vram_free_mib=81920 - 8193), False),
        (dev(0, error="nvml: GPU is lost"), False),
    ],
)
def test_idle_means_no_error_little_use_and_no_more_memory_than_a_driver_holds(
    device: DeviceFingerprint, ready: bool
) -> None:
    assert measuring.idle(device) is ready


def test_idle_devices_as_their_tools_report_them_can_be_measured(db: profiles.ProfileDB) -> None:
    # at rest a 910B holds about 3 GiB of 64 (3,161 MiB in the fixture), the H100 0.5 of 80
    ascend = npu_smi.parse_info(fixture_text("npu-smi-info-910b.txt"), db=db).devices
    h100 = nvml_readings.convert(
        json.loads((FIXTURES / "nvml-readings-h100-vm.json").read_text()), db=db
    ).devices
    busy = [d.index for d in ascend if d.telemetry.utilisation_pct >= 5]
    assert busy == [2]  # AICore 12 % in the recording
    assert [d.index for d in ascend if measuring.idle(d)] == [0, 1, 3, 4, 5, 6, 7]
    assert measuring.idle(h100[0])
