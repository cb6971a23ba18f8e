"""Fleet gauges, read from the scheduler's view when Prometheus scrapes.

Observable gauges (no cost per event): ``hcs_fleet_devices{vendor,model,health}``,
``hcs_fleet_vram_bytes{vendor,model,state}`` and ``hcs_fleet_acu{vendor,model,state}``
(state: total, free, reserved), ``hcs_namespace_reserved_vram_bytes{namespace}``
and ``hcs_namespace_reserved_acu{namespace}``, and what admissions promised and
no bind has spent yet: ``hcs_namespace_pledged_vram_bytes{namespace}`` and
``hcs_namespace_pledged_acu{namespace}`` (0 for a namespace holding
reservations only). Figures come from ``scheduler.view.figures``; one computation
serves every gauge of one scrape. Each replica reports its own view:
aggregate with ``max`` across replicas.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

from opentelemetry.metrics import CallbackOptions, Observation

from hcs_bus.telemetry import meter
from scheduler.view.figures import MIB, FleetFigures, fleet_figures
from scheduler.view.state import ClusterState

FRESH_S = 1.0  # one scrape reads all gauges within this

_states: weakref.WeakSet[ClusterState] = weakref.WeakSet()
_pledgers: weakref.WeakSet[Any] = weakref.WeakSet()


class Pledged(Protocol):
    """What ``scheduler.ledger.pledge_store.Pledger`` offers: per namespace, what its
    outstanding pledges hold (``vram_mib``, ``acu``) and how many."""

    def by_namespace(self) -> Mapping[str, tuple[Any, int]]: ...


_cache: dict[str, tuple[float, list[FleetFigures]]] = {}


def watch(state: ClusterState) -> None:
    """Report ``state``'s fleet in the gauges (for as long as it lives)."""
    _states.add(state)


def watch_pledges(pledger: Pledged) -> None:
    """Report ``pledger``'s outstanding pledges per namespace (while it lives)."""
    _pledgers.add(pledger)


def _pledged(_options: CallbackOptions, *, field: str, scale: float) -> Iterable[Observation]:
    namespaces = {ns for f in _figures() for ns in f.namespace_vram_bytes}
    held: dict[str, float] = dict.fromkeys(namespaces, 0.0)
    for pledger in list(_pledgers):
        for namespace, (total, _count) in pledger.by_namespace().items():
            held[namespace] = held.get(namespace, 0.0) + float(getattr(total, field)) * scale
    for namespace, amount in held.items():
        yield Observation(amount, {"namespace": namespace})


def _figures() -> list[FleetFigures]:
    now = time.monotonic()
    held = _cache.get("figures")
    if held is None or now - held[0] > FRESH_S:
        held = (now, [_read(state) for state in list(_states)])
        _cache["figures"] = held
    return held[1]


def _read(state: ClusterState) -> FleetFigures:
    """Figures of one view. Scrapes run on the metrics server's thread while the
    event loop changes the view: a view changed mid-read is read again."""
    for _ in range(3):
        try:
            return fleet_figures(list(state.nodes.values()))
        except RuntimeError:  # "dictionary changed size during iteration"
            continue
    return FleetFigures()


def _by_model(
    pick: Callable[[FleetFigures], Mapping[tuple[str, str, str], float]], third: str
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        for figures in _figures():
            for (vendor, model, value), amount in pick(figures).items():
                yield Observation(amount, {"vendor": vendor, "model": model, third: value})

    return callback


def _by_namespace(
    pick: Callable[[FleetFigures], Mapping[str, float]],
) -> Callable[[CallbackOptions], Iterable[Observation]]:
    def callback(_options: CallbackOptions) -> Iterable[Observation]:
        for figures in _figures():
            for namespace, amount in pick(figures).items():
                yield Observation(amount, {"namespace": namespace})

    return callback


_meter = meter("hcs.scheduler")
_meter.create_observable_gauge(
    "hcs_fleet_devices",
    callbacks=[_by_model(lambda f: f.devices, "health")],
    description="devices by vendor, model and health verdict",
)
_meter.create_observable_gauge(
    "hcs_fleet_vram_bytes",
    callbacks=[_by_model(lambda f: f.vram_bytes, "state")],
    unit="By",
    description="VRAM by vendor, model and state (total, free: placeable now, reserved)",
)
_meter.create_observable_gauge(
    "hcs_fleet_acu",
    callbacks=[_by_model(lambda f: f.acu, "state")],
    description="compute units (1 ACU = 1% of an A100-80G FP16) by vendor, model and state",
)
_meter.create_observable_gauge(
    "hcs_namespace_reserved_vram_bytes",
    callbacks=[_by_namespace(lambda f: f.namespace_vram_bytes)],
    unit="By",
    description="VRAM held by a namespace's reservations (reserved or bound)",
)
_meter.create_observable_gauge(
    "hcs_namespace_reserved_acu",
    callbacks=[_by_namespace(lambda f: f.namespace_acu)],
    description="ACU held by a namespace's reservations (reserved or bound)",
)
_meter.create_observable_gauge(
    "hcs_namespace_pledged_vram_bytes",
    callbacks=[lambda options: _pledged(options, field="vram_mib", scale=float(MIB))],
    unit="By",
    description="VRAM promised by a namespace's admissions and not yet spent by a bind",
)
_meter.create_observable_gauge(
    "hcs_namespace_pledged_acu",
    callbacks=[lambda options: _pledged(options, field="acu", scale=1.0)],
    description="ACU promised by a namespace's admissions and not yet spent by a bind",
)
