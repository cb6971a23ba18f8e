"""NVML on a real GPU (skipped where libnvidia-ml cannot be loaded)."""

from __future__ import annotations

import pytest

from agents import nvml
from agents.parsing import nvml_readings

pytestmark = pytest.mark.skipif(not nvml.available(), reason=nvml.SKIP_REASON)


def test_every_gpu_nvml_sees_becomes_a_fingerprint_with_a_profile(db) -> None:
    readings = nvml.read_all()
    parsed = nvml_readings.convert(readings, db=db)
    assert parsed.errors == () and len(parsed.devices) == len(readings) >= 1
    first = parsed.devices[0]
    assert first.uuid.startswith("GPU-") and first.vram_total_mib > 1024
    assert first.pci_bus_id.count(":") == 2 and first.compute_capability
    assert first.compute.acu_profile > 0, f"no profile for {readings[0]['name']!r}"
