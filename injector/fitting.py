"""Would the kubelet of a node of the planned class admit this pod?

Pure. The kubelet compares the pod's effective request of each extended
resource its node advertises (``ai.compute/vram`` in bytes, ``ai.compute/acu``,
``ai.compute/devices``) with the node's allocatable and fails the pod with
``OutOf<key>`` when it asks for more. Free capacity changes by the second and
is the extender's business; what admission can know is the most any node of
the planned class advertises (``Plan.node_capacity``). A pod asking for more
can never run there, so it is refused now, naming the key, the amount and the
largest node, instead of being admitted and failing at the node.
"""

from __future__ import annotations

from collections.abc import Mapping

from hcs_bus.demands import UNITS, Demand, show


def refusal(demand: Demand, *, node_capacity: Mapping[str, int], where: str) -> str | None:
    """Why no node of the class ``where`` could admit the pod, or None."""
    problems = []
    for key, amount in demand.amounts.items():
        largest = node_capacity.get(key)
        if largest is not None and amount > largest:
            unit = UNITS.get(key, "")
            problems.append(
                f"{key}: the pod asks for {show(amount)} {unit} but the largest {where} "
                f"node advertises {largest} {unit} (the kubelet would refuse it: OutOf{key})"
            )
    if not problems:
        return None
    return "no node can hold this pod: " + "; ".join(problems)
