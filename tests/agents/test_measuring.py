from __future__ import annotations

import json

import pytest

from agents import measuring
from agents.parsing import npu_smi, nvml_readings
from hcs_bus import profiles
from hcs_bus.messages import Compute, DeviceFingerprint, Telemetry
from tests.agents.conftest import FIXTURES, fixture_text
from tests.agents.test_changes import dev


def test_tflops_counts_two_n_cubed_operations_per_matmul() -> None:
    assert measuring.tflops(n=8192, iterations=20, elapsed_s=0.1) == pytest.approx(219.9, abs=0.1)
    assert measuring.acu_of(312.0) == 100.0
    with pytest.raises(ValueError, match="elapsed_s"):
        measuring.tflops(n=8192, iterations=1, elapsed_s=0)


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


@pytest.mark.skipif(measuring.backend() is None, reason=measuring.SKIP_REASON)
def test_a_real_device_measures_a_positive_throughput() -> None:
    assert (measuring.measure(0, n=2048, iterations=5) or 0) > 1.0


def referenced_profile(db: profiles.ProfileDB) -> tuple[profiles.Profile | None, str]:
    """The profile of GPU 0 where it has a benchmark figure, and why not."""
    found = measuring.backend()
    if found is None:
        return None, measuring.SKIP_REASON
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


def test_a_healthy_device_measures_near_its_models_figure(db: profiles.ProfileDB) -> None:
    profile, why = referenced_profile(db)
    if profile is None:
        pytest.skip(why)
    assert profile.bench_tflops_fp16 is not None
    measured = measuring.measure(0)
    assert measured is not None
    # on the H100 the figure came from, ten runs in a row gave 0.84 to 1.0 of it
    assert 0.75 < measured / profile.bench_tflops_fp16 < 1.2, (measured, profile.key)


def test_the_measurement_is_also_the_achieved_throughput_the_healer_compares() -> None:
    device = measuring.with_measured(dev(0), 238.04, bench_tflops=None)
    assert device.telemetry.achieved_tflops_fp16 == 238.0
    assert dev(0).telemetry.achieved_tflops_fp16 is None


def busy(index: int) -> DeviceFingerprint:
    return dev(index, telemetry=Telemetry(utilisation_pct=97.0), vram_free_mib=20000)


async def test_each_device_is_measured_once_and_only_while_idle() -> None:
    runs: list[int] = []

    def run(index: int) -> float:
        runs.append(index)
        return 200.0 + index

    measurer = measuring.Measurer(run=run, available=lambda: True)
    lost = dev(2, error="nvml: GPU is lost")
    await measurer.update([dev(0), busy(1), lost])
    assert runs == [0] and measurer.deferred == {"GPU-1"}
    await measurer.update([dev(0), busy(1), lost])
    assert runs == [0]  # measured once; still busy; still lost
    await measurer.update([dev(0), dev(1), lost])  # the job on GPU 1 ended
    assert runs == [0, 1] and measurer.deferred == set()
    measured = measurer.apply(dev(1), bench_tflops=201.0)
    assert measured.compute.tflops_fp16_measured == 201.0 and measured.compute.acu == 100.0
    assert measurer.apply(lost, bench_tflops=201.0).compute.tflops_fp16_measured is None


async def test_without_a_backend_nothing_is_measured_and_it_is_not_asked_again() -> None:
    asked: list[bool] = []

    def available() -> bool:
        asked.append(True)
        return False

    def run(index: int) -> float:
        raise AssertionError("measured without a backend")

    measurer = measuring.Measurer(run=run, available=available)
    for _ in range(3):
        await measurer.update([dev(0)])
    assert asked == [True] and measurer.unavailable
    assert measurer.apply(dev(0), bench_tflops=280.0) == dev(0)


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
