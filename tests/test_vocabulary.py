"""One vocabulary: every emitted kind is known to the healer, every Xid reader
agrees with the one table, and ``hcs.io/*`` names are spelled only in hcs_bus."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from typing import get_args

import pytest

from agents import probing, xids
from agents.probes import events as probe_events
from agents.probes import kernel_lines, tables
from hcs_bus import vocabulary
from hcs_bus.messages import HealthEvent, Severity
from hcs_bus.vocabulary import KIND_CLASSES, XIDS, Kind
from healer import rules
from healer.histories import DeviceHistory

ROOT = Path(__file__).resolve().parent.parent
EMITTERS = ("agents", "healer")
PARTS = ("agents", "scheduler", "injector", "healer", "hcs", "hcs_bus")
# How the healer's class of a lone Xid reads as the severity an agent stamps.
HEALER_AS_SEVERITY = {"fatal": "fatal", "warning": "warning", "application": "info"}


@pytest.fixture(scope="module")
def shipped_rules() -> rules.Rules:
    return rules.load(degraded_window_s=60.0, recovery_window_s=300.0)


def _values(node: ast.expr, consts: dict[str, set[str]]) -> set[str]:
    """The strings an expression can evaluate to: literals, module constants, ``Kind.X``."""
    found: set[str] = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
            found.add(sub.value)
        elif isinstance(sub, ast.Name):
            found |= consts.get(sub.id, set())
        elif isinstance(sub, ast.Attribute) and ast.unparse(sub.value).endswith("Kind"):
            member = Kind.__members__.get(sub.attr)
            found.add(member.value if member is not None else f"Kind.{sub.attr}?")
    return found


def _kind_positions(tree: ast.Module) -> dict[str, int]:
    """Functions building a HealthEvent from a ``kind`` parameter: name → its position."""
    out: dict[str, int] = {}
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef) or fn.returns is None:
            continue
        names = [a.arg for a in fn.args.args if a.arg not in ("self", "cls")]
        if "HealthEvent" in ast.unparse(fn.returns) and "kind" in names:
            out[fn.name] = names.index("kind")
    return out


def emitted_kinds(source: str) -> set[str]:
    """Every kind a module's source can put into a HealthEvent."""
    tree = ast.parse(source)
    consts: dict[str, set[str]] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name) and not isinstance(stmt.value, ast.Dict):
                consts[target.id] = _values(stmt.value, {})
    helpers = _kind_positions(tree)
    kinds: set[str] = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        callee = ast.unparse(call.func).rsplit(".", 1)[-1]
        if callee != "HealthEvent" and callee not in helpers:
            continue
        args = [k.value for k in call.keywords if k.arg == "kind"]
        at = helpers.get(callee)
        if at is not None and at < len(call.args):
            args.append(call.args[at])
        for arg in args:
            kinds |= _values(arg, consts)
    return kinds


def _sources(*parts: str) -> list[Path]:
    return sorted(p for part in parts for p in (ROOT / part).rglob("*.py"))


def _judge(kind: str, *, code: int | None = None, severity: Severity = "warning", r: rules.Rules):
    event = HealthEvent(
        node="n1", kind=kind, severity=severity, source="agent", time_s=1.0, device=0, code=code
    )
    return rules.judge(DeviceHistory("n1", 0), event, now=0.0, rules=r)


def test_the_scan_finds_a_new_literal_kind_the_vocabulary_lacks() -> None:
    source = (
        "KIND = 'gremlins'\n"
        "def _ev(node: str, kind: str) -> HealthEvent:\n"
        "    return HealthEvent(node=node, kind=kind)\n"
        "a = HealthEvent(kind=KIND)\n"
        "b = _ev('n', 'quantum_flux')\n"
        "c = HealthEvent(kind=Kind.XID if x else Kind.NO_SUCH)\n"
    )
    unknown = emitted_kinds(source) - KIND_CLASSES.keys()
    assert unknown == {"gremlins", "quantum_flux", "Kind.NO_SUCH?"}


def test_every_kind_the_agents_and_healer_emit_is_in_the_vocabulary() -> None:
    per_file = {p: emitted_kinds(p.read_text()) for p in _sources(*EMITTERS)}
    found = set().union(*per_file.values())
    unknown = {str(p.relative_to(ROOT)): k - KIND_CLASSES.keys() for p, k in per_file.items()}
    assert {p: k for p, k in unknown.items() if k} == {}
    # the scan sees the agents' own words, so it would see a new one
    assert {"row_remap_failure", "vram_over_quota", "detector_error", "xid", "verdict"} <= found


def test_every_probe_kind_reaches_the_healer_as_a_vocabulary_kind() -> None:
    for probe_kind in get_args(probe_events.Kind):
        assert probing.KINDS.get(probe_kind, probe_kind) in KIND_CLASSES, probe_kind


@pytest.mark.parametrize("kind", sorted(KIND_CLASSES))
def test_the_healer_classifies_every_vocabulary_kind(kind: str, shipped_rules: rules.Rules) -> None:
    j = _judge(kind, r=shipped_rules)
    assert not j.unknown
    assert j.evidence["class"] == KIND_CLASSES[kind]
    assert (j.verdict == "failed") == (KIND_CLASSES[kind] == "fatal")


def test_the_healer_still_calls_a_kind_nobody_emits_unknown(shipped_rules: rules.Rules) -> None:
    assert vocabulary.kind_class("quantum_flux") is None
    assert _judge("quantum_flux", severity="fatal", r=shipped_rules).unknown


@pytest.mark.parametrize("code", [*sorted(XIDS), 62, 999])
def test_every_xid_reader_agrees_with_the_healer(code: int, shipped_rules: rules.Rules) -> None:
    stamped = xids.severity(code)
    line = f"NVRM: Xid (PCI:0000:3b:00): {code}, pid=1, name=x"
    probed = kernel_lines.classify(line)
    assert probed is not None
    assert {stamped, tables.xid_severity(code), probed.severity} == {vocabulary.xid_class(code)}
    j = _judge("xid", code=code, severity=stamped, r=shipped_rules)
    assert HEALER_AS_SEVERITY[str(j.evidence["class"])] == stamped
    assert (j.verdict == "failed") == (stamped == "fatal")


def test_the_ebpf_projection_equals_the_table() -> None:
    path = ROOT / "agents" / "probes" / "xid_severity.json"
    raw = json.loads(path.read_text())
    assert frozenset(raw["fatal"]) == vocabulary.XID_FATAL
    assert frozenset(raw["info"]) == vocabulary.XID_INFO
    assert raw["default"] == vocabulary.xid_class(999) == "warning"
    one_line = [ln for ln in path.read_text().splitlines() if '"fatal"' in ln or '"info"' in ln]
    assert all(ln.rstrip().endswith(("],", "]")) for ln in one_line)  # ebpf/Makefile's sed


def test_every_xid_entry_says_what_it_is_and_where_its_class_comes_from() -> None:
    for code, entry in XIDS.items():
        assert entry.what and entry.source, code
    # the four codes the two old tables disagreed on, settled by NVIDIA's documentation
    assert {c: XIDS[c].cls for c in (48, 63, 64, 92)} == {
        48: "fatal",
        63: "warning",
        64: "fatal",
        92: "warning",
    }


def _literal_names(path: Path) -> list[str]:
    """``hcs.io/…`` string literals in code (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.startswith(vocabulary.PREFIX)
        and id(node) not in docstrings
    ]


def test_hcs_io_names_are_spelled_only_in_the_vocabulary() -> None:
    own = ROOT / "hcs_bus" / "vocabulary.py"
    found = [hit for p in _sources(*PARTS) if p != own for hit in _literal_names(p)]
    assert found == []
    assert _literal_names(own)  # the check sees literals where they are
