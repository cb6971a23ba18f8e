from __future__ import annotations

import pytest

from agents import measuring
from tests.agents.test_changes import dev


def test_tflops_counts_two_n_cubed_operations_per_matmul() -> None:
    assert measuring.tflops(n=8192, iterations=20, elapsed_s=0.1) == pytest.approx(219.9, abs=0.1)
    assert measuring.acu_of(312.0) == 100.0
    with pytest.raises(ValueError, match="elapsed_s"):
        measuring.tflops(n=8192, iterations=1, elapsed_s=0)


def test_measured_compute_sits_beside_the_profile_and_wins() -> None:
    device = measuring.with_measured(dev(0), 265.2)
    assert device.compute.acu_profile == 100 and device.compute.acu_measured == 85.0
    assert device.compute.acu == 85.0
    assert measuring.with_measured(dev(0), None).compute.acu_measured is None


@pytest.mark.skipif(measuring.backend() is None, reason=measuring.SKIP_REASON)
def test_a_real_device_measures_a_positive_throughput() -> None:
    assert (measuring.measure(0, n=2048, iterations=5) or 0) > 1.0
