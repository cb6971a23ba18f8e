"""What the rules look at and what they answer (pure data, no I/O).

``DeviceHistory`` is the recent past of one device as the healer saw it:
recent discrete events, when a degraded signal started (``bad_since``), when
the device was last seen healthy from then on (``good_since``), counter
samples for rates, and its current verdict with the time it last changed.
All times are the healer's own clock (the event loop's), never a producer's.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from hcs_bus.messages import Telemetry, Verdict

NodeVerdict = Literal["healthy", "degraded", "failed", "lost"]
Evidence = dict[str, str | int | float | bool]


@dataclass(frozen=True, slots=True)
class SeenEvent:
    time: float
    kind: str
    code: int | None
    severity: str


@dataclass(frozen=True, slots=True)
class CounterSample:
    time: float
    ecc_corrected: int
    pcie_replay: int


@dataclass(slots=True)
class DeviceHistory:
    node: str
    device: int
    model: str = ""
    verdict: Verdict = "healthy"
    changed_at: float | None = None
    reason: str = ""
    lost: bool = False
    events: deque[SeenEvent] = field(default_factory=lambda: deque(maxlen=512))
    warnings: deque[float] = field(default_factory=lambda: deque(maxlen=512))
    counters: deque[CounterSample] = field(default_factory=lambda: deque(maxlen=512))
    bad_since: float | None = None
    bad_reason: str = ""
    good_since: float | None = None
    unknown: int = 0
    score: int = 100


@dataclass(frozen=True, slots=True)
class FingerprintSample:
    """One device as one fingerprint showed it, with its model's fleet medians.

    ``present=False`` means the device vanished from the node's fingerprint
    (or reported an error): the device is lost.
    """

    node: str
    device: int
    model: str
    telemetry: Telemetry
    present: bool = True
    error: str | None = None
    fleet_tflops_median: float | None = None
    fleet_sm_clock_median: float | None = None


@dataclass(frozen=True, slots=True)
class Judgement:
    verdict: Verdict
    evidence: Evidence
    changed: bool
    health_score: int = 100
    unknown: bool = False


@dataclass(frozen=True, slots=True)
class NodeJudgement:
    verdict: NodeVerdict
    failed: tuple[int, ...] = ()
    degraded: tuple[int, ...] = ()
    reason: str = ""
