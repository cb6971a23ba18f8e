"""The simulated-fleet file (``python -m agents --fleet FILE``), decoded strictly.

::

    nodes:
      - name: gpu-a100-0
        network_group: ng-a          # becomes label hcs.io/network-group
        rdma_fabric: ib-a            # label hcs.io/rdma-fabric
        labels: {topology.kubernetes.io/zone: z1}
        devices: {model: nvidia/A100-80G, count: 8}
        topology: nvlink    # a nvlink|hccs|xgmi|mlulink mesh, or pcie (default: profile's)
        failures:
          - {at_s: 30, device: 3, kind: xid, code: 79, repeat: 5, every_s: 0.5}
          - {at_s: 45, device: 1, kind: slow, to: 0.6}
          - {at_s: 60, device: 6, kind: fall_off_bus}

A bad file raises ConfigError with ONE line naming the field path and value.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from agents.labels import label_key_problem, label_value_problem
from hcs_bus import subjects
from hcs_bus.errors import ConfigError
from hcs_bus.messages import LinkType
from hcs_bus.profiles import Profile, ProfileDB
from hcs_bus.profiles import load as load_profiles

FailureKind = Literal[
    "xid", "ecc_storm", "slow", "fall_off_bus", "recover", "thermal_throttle", "detector_error"
]


class _Strict(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    pass


class Failure(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One scripted failure. ``device`` None means the whole node."""

    at_s: float
    kind: FailureKind
    device: int | None = None
    code: int | None = None
    to: float | None = None
    repeat: int = 1
    every_s: float = 0.5
    count: int = 20


class Devices(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    model: str
    count: int


class NodeSpec(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    name: str
    devices: Devices | tuple[Devices, ...]
    network_group: str = "default"
    rdma_fabric: str | None = None
    labels: dict[str, str] = {}
    topology: LinkType | None = None
    failures: tuple[Failure, ...] = ()

    @property
    def device_groups(self) -> tuple[Devices, ...]:
        return self.devices if isinstance(self.devices, tuple) else (self.devices,)


class Fleet(_Strict, frozen=True, kw_only=True, forbid_unknown_fields=True):
    nodes: tuple[NodeSpec, ...]
    report_interval_s: float | None = None
    noise_pct: float = 1.0
    seed: int = 0


_AT = re.compile(r"at `\$((?:\.[^.`\[]+|\[\d+\])*)`")


def load(path: str | Path, *, db: ProfileDB | None = None) -> Fleet:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"fleet file {path}: cannot read: {exc.strerror}") from exc
    return loads(text, db=db, origin=str(path))


def loads(text: str, *, db: ProfileDB | None = None, origin: str = "fleet") -> Fleet:
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{origin}:{where}: {problem}") from exc
    if not isinstance(raw, dict):
        raise ConfigError(f"{origin}: top level must be a mapping with 'nodes', got {raw!r:.60}")
    try:
        fleet = msgspec.convert(raw, Fleet, strict=True)
    except msgspec.ValidationError as exc:
        raise ConfigError(_explain(origin, raw, str(exc))) from exc
    check(fleet, db=db or load_profiles(), origin=origin)
    return fleet


def _explain(origin: str, raw: Any, message: str) -> str:
    found = _AT.search(message)
    reason = _AT.sub("", message).rstrip(" -")
    if found is None:
        return f"{origin}: {reason}"
    path = found.group(1).lstrip(".")
    value = _value_at(raw, found.group(1))
    shown = "" if value is _MISSING else f" (value {value!r:.80})"
    return f"{origin}: {path}: {reason}{shown}"


_MISSING = object()


def _value_at(raw: Any, path: str) -> Any:
    for step in re.findall(r"\.([^.\[]+)|\[(\d+)\]", path):
        key, index = step
        try:
            raw = raw[int(index)] if index else raw[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return raw


def check(fleet: Fleet, *, db: ProfileDB, origin: str = "fleet") -> None:
    """Meaning checks the schema cannot express; the first problem is raised."""
    if not fleet.nodes:
        raise ConfigError(f"{origin}: nodes: must list at least one node (value [])")
    seen: set[str] = set()
    for i, node in enumerate(fleet.nodes):
        where = f"{origin}: nodes[{i}]"
        try:
            subjects.node_token(node.name)
        except subjects.SubjectError as exc:
            raise ConfigError(f"{where}.name: {exc} (value {node.name!r})") from exc
        if node.name in seen:
            raise ConfigError(f"{where}.name: listed twice (value {node.name!r})")
        seen.add(node.name)
        _check_labels(node, where=where)
        total = _check_devices(node, db=db, where=where)
        for j, failure in enumerate(node.failures):
            _check_failure(failure, devices=total, where=f"{where}.failures[{j}]")


def _check_labels(node: NodeSpec, *, where: str) -> None:
    """Everything that becomes a Node label must be one Kubernetes accepts."""
    values = {"network_group": node.network_group, "rdma_fabric": node.rdma_fabric or ""}
    values.update({f"labels.{key}": value for key, value in node.labels.items()})
    for key in node.labels:
        problem = label_key_problem(key)
        if problem:
            raise ConfigError(f"{where}.labels: key {problem} (value {key!r})")
    for field, value in values.items():
        problem = label_value_problem(value)
        if problem:
            raise ConfigError(f"{where}.{field}: a label value {problem} (value {value!r})")


def _check_devices(node: NodeSpec, *, db: ProfileDB, where: str) -> int:
    total = 0
    many = isinstance(node.devices, tuple)
    for k, group in enumerate(node.device_groups):
        at = f"{where}.devices[{k}]" if many else f"{where}.devices"
        try:
            db.get(group.model)
        except KeyError as exc:
            raise ConfigError(f"{at}.model: {exc.args[0]} (value {group.model!r})") from exc
        if not 1 <= group.count <= 64:
            raise ConfigError(f"{at}.count: must be 1..64 (value {group.count!r})")
        total += group.count
    return total


def _check_failure(failure: Failure, *, devices: int, where: str) -> None:
    if failure.at_s < 0:
        raise ConfigError(f"{where}.at_s: must be >= 0 (value {failure.at_s!r})")
    if failure.device is not None and not 0 <= failure.device < devices:
        raise ConfigError(
            f"{where}.device: node has devices 0..{devices - 1} (value {failure.device!r})"
        )
    if failure.kind == "xid" and failure.code is None:
        raise ConfigError(f"{where}.code: kind xid needs an Xid code (value None)")
    if failure.kind == "slow" and (failure.to is None or not 0.0 < failure.to <= 1.0):
        raise ConfigError(
            f"{where}.to: kind slow needs a fraction in (0, 1] (value {failure.to!r})"
        )
    if failure.repeat < 1 or failure.every_s <= 0:
        raise ConfigError(
            f"{where}.repeat: must be >= 1 with every_s > 0 (value {failure.repeat!r})"
        )
    if failure.kind != "detector_error" and failure.kind != "recover" and failure.device is None:
        raise ConfigError(f"{where}.device: kind {failure.kind} needs a device (value None)")


def profiles_of(node: NodeSpec, *, db: ProfileDB) -> list[Profile]:
    """One profile per device index, in index order."""
    return [db.get(g.model) for g in node.device_groups for _ in range(g.count)]
