"""What a pod asks for, as the injector reads it at admission: the one
demand parser of ``hcs_bus.demands`` (shared with the scheduler, so both
parts agree on every pod), under the names the injector's modules use.
``PodError`` is ``hcs_bus.demands.DemandError``."""

from __future__ import annotations

from hcs_bus.demands import (
    ADVERTISED,
    COMPUTE,
    FIELDS,
    MAX_AMOUNT,
    SUBSTITUTIONS,
    TOPOLOGIES,
    UNITS,
    ContainerRef,
    Demand,
    annotations_of,
    containers,
    read,
    read_policy,
    show,
    split_list,
)
from hcs_bus.demands import DemandError as PodError

__all__ = [
    "ADVERTISED",
    "COMPUTE",
    "FIELDS",
    "MAX_AMOUNT",
    "SUBSTITUTIONS",
    "TOPOLOGIES",
    "UNITS",
    "ContainerRef",
    "Demand",
    "PodError",
    "annotations_of",
    "containers",
    "read",
    "read_policy",
    "show",
    "split_list",
]
