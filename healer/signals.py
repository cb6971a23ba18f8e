"""Telemetry signals (pure): what in one fingerprint sample is fatal or a sign of
degradation, and the fleet medians a device is compared with."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import TYPE_CHECKING

from hcs_bus.messages import NodeFingerprint, Telemetry
from healer.histories import CounterSample, DeviceHistory, FingerprintSample

if TYPE_CHECKING:
    from healer.rules import Rules, TelemetryRules


def fatal_telemetry(telemetry: Telemetry, *, rules: Rules) -> str:
    """The fatal condition in a sample ('' when none)."""
    if telemetry.remap_failed:
        return "remap_failed"
    if telemetry.ecc_uncorrected >= rules.telemetry.ecc_uncorrected_fatal:
        return f"ecc_uncorrected {telemetry.ecc_uncorrected}"
    return ""


def degraded_signal(
    history: DeviceHistory, sample: FingerprintSample, *, now: float, rules: Rules
) -> str:
    """The first degraded signal in a sample ('' when none); records counters."""
    t = sample.telemetry
    return (
        _unexplained_throttle(t, rules=rules)
        or _rising_rates(history, t, now=now, rules=rules)
        or _slow(sample, rules=rules)
    )


def _unexplained_throttle(t: Telemetry, *, rules: Rules) -> str:
    odd = [r for r in t.throttle_reasons if r not in rules.telemetry.benign_throttle]
    if not odd:
        return ""
    hot = t.temperature_c >= rules.telemetry.hot_c
    capped = t.power_limit_w > 0 and t.power_w >= t.power_limit_w * rules.telemetry.power_fraction
    if hot or capped:
        return ""
    return "throttled without thermal/power cause: " + ",".join(sorted(odd))


def _rising_rates(history: DeviceHistory, t: Telemetry, *, now: float, rules: Rules) -> str:
    counters = history.counters
    if counters and (
        t.ecc_corrected < counters[-1].ecc_corrected or t.pcie_replay < counters[-1].pcie_replay
    ):
        counters.clear()  # a counter reset (driver reload): start again
    counters.append(CounterSample(now, t.ecc_corrected, t.pcie_replay))
    while counters and now - counters[0].time > rules.degraded_window_s:
        counters.popleft()
    first, last = counters[0], counters[-1]
    if last.time - first.time < rules.degraded_window_s / 2:
        return ""  # too short a span: one blip would look like a huge rate
    hours = (last.time - first.time) / 3600.0
    ecc = (last.ecc_corrected - first.ecc_corrected) / hours
    if ecc > rules.telemetry.ecc_corrected_per_h:
        return f"corrected ECC rising {ecc:.0f}/h"
    replay = (last.pcie_replay - first.pcie_replay) / hours
    if replay > rules.telemetry.pcie_replay_per_h:
        return f"PCIe replays rising {replay:.0f}/h"
    return ""


def _slow(sample: FingerprintSample, *, rules: Rules) -> str:
    t, margin = sample.telemetry, 1.0 - rules.telemetry.slow_margin
    median = sample.fleet_tflops_median
    if t.achieved_tflops_fp16 is not None and median and t.achieved_tflops_fp16 < median * margin:
        return f"achieved {t.achieved_tflops_fp16:g} TFLOPS < fleet median {median:g}"
    clock = sample.fleet_sm_clock_median
    busy = t.utilisation_pct >= rules.telemetry.busy_util_pct
    if busy and clock and 0 < t.sm_clock_mhz < clock * margin:
        return f"SM clock {t.sm_clock_mhz:g} MHz < fleet median {clock:g}"
    return ""


class Fleet:
    """Latest fingerprint of each node and per-model medians of their devices."""

    def __init__(self, rules: TelemetryRules, *, refresh_s: float = 5.0) -> None:
        self.rules = rules
        self.refresh_s = refresh_s
        self.nodes: dict[str, NodeFingerprint] = {}
        self._medians: dict[str, tuple[float | None, float | None]] = {}
        self._computed_at: float | None = None

    def update(self, fingerprints: Iterable[NodeFingerprint]) -> None:
        for fp in fingerprints:
            self.nodes[fp.node] = fp

    def medians(self, model: str, *, now: float) -> tuple[float | None, float | None]:
        """(achieved FP16 TFLOPS median, busy SM clock median) of a model, from the
        latest fingerprints, recomputed at most every ``refresh_s``."""
        if self._computed_at is None or now - self._computed_at >= self.refresh_s:
            self._medians, self._computed_at = self._compute(), now
        return self._medians.get(model, (None, None))

    def _compute(self) -> dict[str, tuple[float | None, float | None]]:
        tflops: dict[str, list[float]] = {}
        clocks: dict[str, list[float]] = {}
        for fp in self.nodes.values():
            for d in fp.devices:
                t = d.telemetry
                if t.achieved_tflops_fp16 is not None:
                    tflops.setdefault(d.model, []).append(t.achieved_tflops_fp16)
                if t.sm_clock_mhz > 0 and t.utilisation_pct >= self.rules.busy_util_pct:
                    clocks.setdefault(d.model, []).append(t.sm_clock_mhz)
        out: dict[str, tuple[float | None, float | None]] = {}
        for model in {*tflops, *clocks}:
            out[model] = (self._median(tflops.get(model)), self._median(clocks.get(model)))
        return out

    def _median(self, values: list[float] | None) -> float | None:
        if not values or len(values) < self.rules.min_fleet:
            return None
        return float(statistics.median(values))
