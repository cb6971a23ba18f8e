"""Which pods use which devices (pure), from AllocationEvents on HCS_ALLOC.

The healer evicts only pods bound to the affected devices, and asks their
jobs to checkpoint first; this is where it learns who they are.
"""

from __future__ import annotations

from dataclasses import dataclass

from hcs_bus.messages import AllocationEvent


@dataclass(frozen=True, slots=True)
class Binding:
    namespace: str
    name: str
    uid: str
    node: str
    devices: frozenset[int]
    job: str | None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class Bindings:
    """Current pod → node + device indices, kept from reserved/bound/released/expired."""

    def __init__(self) -> None:
        self._pods: dict[str, Binding] = {}
        self._by_node: dict[str, set[str]] = {}

    def __len__(self) -> int:
        return len(self._pods)

    def apply(self, event: AllocationEvent) -> None:
        key = f"{event.pod.namespace}/{event.pod.name}"
        if event.state not in ("reserved", "bound"):
            if not _stale(self._pods.get(key), event):
                self._drop(key)
            return
        self._drop(key)
        binding = Binding(
            namespace=event.pod.namespace,
            name=event.pod.name,
            uid=event.pod.uid,
            node=event.node,
            devices=frozenset(d.index for d in event.devices),
            job=event.job,
        )
        self._pods[key] = binding
        self._by_node.setdefault(event.node, set()).add(key)

    def _drop(self, key: str) -> None:
        old = self._pods.pop(key, None)
        if old is not None:
            keys = self._by_node.get(old.node)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._by_node[old.node]

    def on_devices(self, node: str, devices: tuple[int, ...] | frozenset[int]) -> list[Binding]:
        """Pods on ``node`` that use any of ``devices`` (sorted by name)."""
        wanted = set(devices)
        found = [self._pods[k] for k in self._by_node.get(node, ())]
        return sorted((b for b in found if b.devices & wanted), key=lambda b: b.key)

    def on_node(self, node: str) -> list[Binding]:
        return sorted((self._pods[k] for k in self._by_node.get(node, ())), key=lambda b: b.key)


def _stale(current: Binding | None, event: AllocationEvent) -> bool:
    """A release of an earlier pod of the same name (a StatefulSet's replacement
    was bound before the old one's release arrived) must not forget the new one."""
    return bool(current and current.uid and event.pod.uid and current.uid != event.pod.uid)
