"""Health rules: pure judgement of one device from its recent history.

``judge(history, event, *, now, rules)`` takes a ``HealthEvent`` or a
``FingerprintSample``, records it in the device's history (the only state it
touches) and answers a ``Judgement``: the verdict, its evidence, whether it
changed, and a graded health score. No I/O, no clock: ``now`` is given.

What one event is comes from the shared vocabulary (``hcs_bus.vocabulary``):
the class of each health kind and the one Xid table, the same the agents stamp
their severities from. Rules that look past one event live in
``healer/data/rules.yaml``:

* **Fatal → failed at once.** Xid codes the table calls fatal (48 double-bit
  ECC, 64 row-remap failure, 74 NVLink, 79 fallen off the bus, 94/95 ECC
  containment, 119/120 GSP); ``xid.pairs`` (a code fatal with a partner within
  ``pair_window_s``, either order); ``xid.storms`` (92: many within a window);
  kinds the vocabulary calls fatal (device_lost, row_remap_failure, aer_fatal,
  …); vendor health kinds at a fatal severity (``kinds.fatal_at_severity``:
  Ascend critical); ``kinds.thresholds`` (uncorrected ECC beyond a count); in
  telemetry, ``remap_failed`` or a volatile uncorrected ECC count ≥
  ``ecc_uncorrected_fatal``; a device missing from its node's fingerprint (lost).
* **Application Xids** (the table's info codes: 13, 31, 43, 45, 68) are counted
  as info and never isolate a device.
* **Unknown kinds** (none of the vocabulary's) are counted (``history.unknown``)
  and reported with ``Judgement.unknown``; they never change a verdict.
* **Degraded** needs a signal sustained for ``degraded_window_s``: throttling
  not explained by heat or power, corrected-ECC or PCIe-replay rates rising
  beyond a per-hour rate, achieved FP16 TFLOPS or SM clock (when busy) below
  the same model's fleet median by ``slow_margin``, or a burst of
  ``warning_burst`` warnings within the window.
* **Recovery** needs ``recovery_window_s`` without any signal or warning
  (hysteresis), and a fingerprint showing the device present.
* **Flapping**: apart from escalation to failed, a device's verdict changes at
  most once per ``min_change_interval_s``.
* **Score**: failed 0, degraded ≤ ``degraded_score``, healthy 100 minus
  ``warning_penalty`` per warning within ``score_window_s`` (capped).

Node verdict (``judge_node``): lost when fingerprints stopped or every device
is lost; failed if any device failed; degraded if any degraded.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Literal

import msgspec
import yaml

from hcs_bus import vocabulary
from hcs_bus.errors import ConfigError
from hcs_bus.messages import HealthEvent, Verdict
from healer import signals
from healer.histories import (
    DeviceHistory,
    Evidence,
    FingerprintSample,
    Judgement,
    NodeJudgement,
    SeenEvent,
)

__all__ = ["Rules", "Storm", "judge", "judge_node", "load", "score"]

DATA = Path(__file__).parent / "data" / "rules.yaml"
EventClass = Literal["fatal", "application", "warning", "info", "unknown"]
# Kinds whose ``code`` is an NVIDIA Xid.
_XID_KINDS = (vocabulary.Kind.XID.value, vocabulary.Kind.FALLEN_OFF_BUS.value)


class Storm(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    count: int
    window_s: float


class XidRules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pairs: dict[str, list[int]] = {}
    pair_window_s: float = 600.0
    storms: dict[str, Storm] = {}


class KindRules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    fatal_at_severity: dict[str, frozenset[str]] = {}
    thresholds: dict[str, Storm] = {}


class TelemetryRules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    ecc_uncorrected_fatal: int = 2
    benign_throttle: frozenset[str] = frozenset()
    hot_c: float = 85.0
    power_fraction: float = 0.95
    ecc_corrected_per_h: float = 100.0
    pcie_replay_per_h: float = 1000.0
    slow_margin: float = 0.15
    busy_util_pct: float = 50.0
    min_fleet: int = 3


class Rules(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The decoded ``rules.yaml`` plus the windows from settings.healer."""

    xid: XidRules = XidRules()
    kinds: KindRules = KindRules()
    telemetry: TelemetryRules = TelemetryRules()
    warning_burst: int = 20
    min_change_interval_s: float = 30.0
    score_window_s: float = 600.0
    warning_penalty: int = 5
    max_penalty: int = 30
    degraded_score: int = 60
    degraded_taint_effect: Literal["PreferNoSchedule", "NoSchedule"] = "PreferNoSchedule"
    # taint a node once this share of its devices is out (docs/architecture.md#health)
    taint_failed_share: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] = 0.5
    node_stale_s: float = 60.0
    degraded_window_s: float = 60.0
    recovery_window_s: float = 300.0

    @property
    def keep_s(self) -> float:
        """How long events are kept: the longest window any rule looks back."""
        storms = [s.window_s for s in (*self.xid.storms.values(), *self.kinds.thresholds.values())]
        return max(self.xid.pair_window_s, self.degraded_window_s, self.recovery_window_s, *storms)


def load(
    path: Path | None = None,
    *,
    degraded_window_s: float,
    recovery_window_s: float,
    taint_failed_share: float | None = None,
) -> Rules:
    """Rules from the YAML file (strictly decoded) and the windows of settings
    (and the taint threshold, when settings give one)."""
    source = path or DATA
    try:
        raw = yaml.safe_load(source.read_text()) or {}
        raw.update(degraded_window_s=degraded_window_s, recovery_window_s=recovery_window_s)
        if taint_failed_share is not None:
            raw.update(taint_failed_share=taint_failed_share)
        return msgspec.convert(raw, Rules, strict=False)
    except (OSError, yaml.YAMLError, msgspec.ValidationError) as exc:
        raise ConfigError(f"health rules {source}: {exc}") from exc


def judge(
    history: DeviceHistory,
    event: HealthEvent | FingerprintSample,
    *,
    now: float,
    rules: Rules,
) -> Judgement:
    if isinstance(event, HealthEvent):
        return _judge_event(history, event, now=now, rules=rules)
    return _judge_sample(history, event, now=now, rules=rules)


def _judge_event(
    history: DeviceHistory, event: HealthEvent, *, now: float, rules: Rules
) -> Judgement:
    if event.source == "healer":
        return _answer(history, now=now, rules=rules, changed=False, evidence={"ignored": "own"})
    seen = SeenEvent(now, event.kind, event.code, event.severity)
    history.events.append(seen)
    _prune(history, now=now, keep_s=rules.keep_s)
    cls, why = classify(history, seen, rules=rules)
    evidence: Evidence = {"kind": event.kind, "class": cls, "why": why}
    if event.code is not None:
        evidence["code"] = event.code
    if cls == "unknown":
        history.unknown += 1
        return _answer(
            history, now=now, rules=rules, changed=False, evidence=evidence, unknown=True
        )
    if cls == "fatal":
        return _escalate(history, now=now, rules=rules, reason=why, evidence=evidence)
    if cls == "warning":
        history.warnings.append(now)
        history.good_since = None
        burst = sum(1 for t in history.warnings if now - t <= rules.degraded_window_s)
        if burst >= rules.warning_burst:
            return _degrade(
                history,
                now=now,
                rules=rules,
                reason=f"{burst} warnings",
                evidence=evidence,
                sustained=True,
            )
    return _answer(history, now=now, rules=rules, changed=False, evidence=evidence)


def classify(history: DeviceHistory, seen: SeenEvent, *, rules: Rules) -> tuple[EventClass, str]:
    """What one event means given the device's recent events."""
    if seen.kind in _XID_KINDS and seen.code is not None:
        found = _classify_xid(history, seen, rules=rules)
        if found is not None:
            return found
    kinds = rules.kinds
    cls = vocabulary.kind_class(seen.kind)
    if cls == "fatal":
        return "fatal", seen.kind
    if seen.severity in kinds.fatal_at_severity.get(seen.kind, ()):
        return "fatal", f"{seen.kind} {seen.severity}"
    storm = kinds.thresholds.get(seen.kind)
    if storm is not None and _count(history, seen.kind, None, seen.time, storm.window_s) >= (
        storm.count
    ):
        return "fatal", f"{seen.kind} x{storm.count} in {storm.window_s:g}s"
    if cls is None:
        return "unknown", f"unknown kind {seen.kind!r}"
    return cls, seen.kind


def _classify_xid(
    history: DeviceHistory, seen: SeenEvent, *, rules: Rules
) -> tuple[EventClass, str] | None:
    code = seen.code
    assert code is not None
    xid = rules.xid
    table_class = vocabulary.xid_class(code)
    if table_class == "fatal":
        return "fatal", f"xid {code}"
    if table_class == "info":
        return "application", f"xid {code} (application)"
    for first, partners in xid.pairs.items():
        pair = {int(first), *partners}
        if code not in pair:
            continue
        wanted = partners if code == int(first) else [int(first)]
        for other in wanted:
            if _count(history, seen.kind, other, seen.time, xid.pair_window_s, any_xid=True):
                return "fatal", f"xid {code} with xid {other}"
    storm = xid.storms.get(str(code))
    if storm is not None:
        count = _count(history, seen.kind, code, seen.time, storm.window_s, any_xid=True)
        if count >= storm.count:
            return "fatal", f"xid {code} storm x{count} in {storm.window_s:g}s"
    return None


def _count(
    history: DeviceHistory,
    kind: str,
    code: int | None,
    now: float,
    window_s: float,
    *,
    any_xid: bool = False,
) -> int:
    kinds = _XID_KINDS if any_xid else (kind,)
    return sum(
        1
        for e in history.events
        if e.kind in kinds and (code is None or e.code == code) and now - e.time <= window_s
    )


def _judge_sample(
    history: DeviceHistory, sample: FingerprintSample, *, now: float, rules: Rules
) -> Judgement:
    history.model = sample.model or history.model
    if not sample.present or sample.error:
        history.lost = True
        reason = f"device lost: {sample.error}" if sample.error else "device lost"
        return _escalate(
            history, now=now, rules=rules, reason=reason, evidence={"kind": "device_lost"}
        )
    history.lost = False
    fatal = signals.fatal_telemetry(sample.telemetry, rules=rules)
    if fatal:
        return _escalate(history, now=now, rules=rules, reason=fatal, evidence={"kind": fatal})
    bad = signals.degraded_signal(history, sample, now=now, rules=rules)
    if bad:
        history.good_since = None
        if history.bad_since is None:
            history.bad_since, history.bad_reason = now, bad
        sustained = now - history.bad_since >= rules.degraded_window_s
        evidence: Evidence = {"signal": bad, "since_s": round(now - history.bad_since, 3)}
        return _degrade(
            history, now=now, rules=rules, reason=bad, evidence=evidence, sustained=sustained
        )
    history.bad_since, history.bad_reason = None, ""
    if history.good_since is None:
        history.good_since = now
    return _maybe_recover(history, now=now, rules=rules)


def _escalate(
    history: DeviceHistory, *, now: float, rules: Rules, reason: str, evidence: Evidence
) -> Judgement:
    history.good_since = None
    if history.verdict == "failed":
        return _answer(history, now=now, rules=rules, changed=False, evidence=evidence)
    return _change(history, "failed", now=now, rules=rules, reason=reason, evidence=evidence)


def _degrade(
    history: DeviceHistory,
    *,
    now: float,
    rules: Rules,
    reason: str,
    evidence: Evidence,
    sustained: bool,
) -> Judgement:
    if history.verdict != "healthy" or not sustained or not _may_change(history, now, rules):
        return _answer(history, now=now, rules=rules, changed=False, evidence=evidence)
    return _change(history, "degraded", now=now, rules=rules, reason=reason, evidence=evidence)


def _maybe_recover(history: DeviceHistory, *, now: float, rules: Rules) -> Judgement:
    assert history.good_since is not None
    healthy_s = now - history.good_since
    evidence: Evidence = {"healthy_s": round(healthy_s, 3)}
    if (
        history.verdict == "healthy"
        or healthy_s < rules.recovery_window_s
        or not _may_change(history, now, rules)
    ):
        return _answer(history, now=now, rules=rules, changed=False, evidence=evidence)
    reason = f"healthy for {healthy_s:g}s"
    return _change(history, "healthy", now=now, rules=rules, reason=reason, evidence=evidence)


def _may_change(history: DeviceHistory, now: float, rules: Rules) -> bool:
    return history.changed_at is None or now - history.changed_at >= rules.min_change_interval_s


def _change(
    history: DeviceHistory,
    verdict: Verdict,
    *,
    now: float,
    rules: Rules,
    reason: str,
    evidence: Evidence,
) -> Judgement:
    evidence = {**evidence, "reason": reason, "was": history.verdict}
    history.verdict, history.changed_at, history.reason = verdict, now, reason
    return _answer(history, now=now, rules=rules, changed=True, evidence=evidence)


def _answer(
    history: DeviceHistory,
    *,
    now: float,
    rules: Rules,
    changed: bool,
    evidence: Evidence,
    unknown: bool = False,
) -> Judgement:
    history.score = score(history, now=now, rules=rules)
    return Judgement(history.verdict, evidence, changed, history.score, unknown)


def score(history: DeviceHistory, *, now: float, rules: Rules) -> int:
    """Graded health 0–100: failed 0, degraded ≤ degraded_score, healthy minus penalties."""
    if history.verdict == "failed":
        return 0
    recent = sum(1 for t in history.warnings if now - t <= rules.score_window_s)
    penalty = min(rules.max_penalty, recent * rules.warning_penalty)
    if history.bad_since is not None:
        penalty = min(rules.max_penalty, penalty + rules.warning_penalty)
    if history.verdict == "degraded":
        return max(0, min(rules.degraded_score, 100 - penalty))
    return 100 - penalty


def _prune(history: DeviceHistory, *, now: float, keep_s: float) -> None:
    events = history.events
    while events and now - events[0].time > keep_s:
        events.popleft()


def judge_node(histories: Iterable[DeviceHistory], *, stale: bool) -> NodeJudgement:
    """A node's verdict from its devices' verdicts and whether its fingerprints stopped."""
    devices = list(histories)
    if stale:
        return NodeJudgement("lost", reason="fingerprints stopped")
    failed = tuple(sorted(h.device for h in devices if h.verdict == "failed"))
    degraded = tuple(sorted(h.device for h in devices if h.verdict == "degraded"))
    real = [h for h in devices if h.device >= 0]  # -1 holds events about the whole node
    if real and all(h.lost for h in real):
        return NodeJudgement("lost", failed=failed, reason="every device lost")
    if failed:
        reasons = "; ".join(f"{h.device}: {h.reason}" for h in devices if h.verdict == "failed")
        return NodeJudgement("failed", failed, degraded, reasons)
    if degraded:
        reasons = "; ".join(f"{h.device}: {h.reason}" for h in devices if h.verdict == "degraded")
        return NodeJudgement("degraded", failed, degraded, reasons)
    return NodeJudgement("healthy")
