"""What happened while ``hcs up`` ran, told once when it stops.

``Tally`` is pure: ``take(subject, data)`` counts one bus message.

* faults: device events worth a look (warning or fatal) that agents reported;
* verdicts and actions: the healer's (``kind`` ``verdict`` / ``action``);
* moves: a job's pod bound on a node other than the one it was bound on before;
* checkpoints: complete checkpoints that jobs reported.

``follow`` subscribes a tally to the subjects these come on.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from hcs_bus import messages, subjects
from hcs_bus.bus import Bus
from hcs_bus.messages import AllocationEvent, CheckpointEvent, HealthEvent

_health = messages.decoder_for(HealthEvent).decode
_alloc = messages.decoder_for(AllocationEvent).decode
_ckpt = messages.decoder_for(CheckpointEvent).decode
_UNREADABLE = (msgspec.MsgspecError, UnicodeDecodeError, RecursionError)


@dataclass
class Tally:
    faults: int = 0
    verdicts: int = 0
    actions: int = 0
    moves: int = 0
    checkpoints: int = 0
    _bound_on: dict[str, str] = field(default_factory=dict)  # job → node of its last bind

    def take(self, subject: str, data: bytes) -> None:
        try:
            if subject.startswith(subjects.HEALTH_PREFIX):
                self._health(subject, _health(data))
            elif subject.startswith(subjects.ALLOC_PREFIX):
                self._alloc(_alloc(data))
            elif subject.startswith(subjects.CKPT_PREFIX):
                if not subject.startswith(subjects.CKPT_REQUEST_PREFIX):
                    self.checkpoints += _ckpt(data).complete
        except _UNREADABLE:
            return  # not ours to count

    def _health(self, subject: str, event: HealthEvent) -> None:
        if subjects.is_healer_health(subject):
            self.verdicts += event.kind == "verdict"
            self.actions += event.kind == "action"
        elif event.severity != "info":
            self.faults += 1

    def _alloc(self, event: AllocationEvent) -> None:
        if event.state != "bound":
            return
        key = f"{event.pod.namespace}/{event.job or event.pod.name}"
        before = self._bound_on.get(key)
        if before is not None and before != event.node:
            self.moves += 1
        self._bound_on[key] = event.node

    def line(self) -> str:
        return (
            f"faults {self.faults}, verdicts {self.verdicts}, actions {self.actions}, "
            f"moves {self.moves}, checkpoints {self.checkpoints}"
        )


async def follow(bus: Bus, tally: Tally) -> list[Any]:
    """Subscriptions feeding ``tally``; unsubscribe them when done."""

    async def on_msg(msg: Any) -> None:
        tally.take(msg.subject, msg.data)

    wanted = (subjects.HEALTH_ALL, subjects.ALLOC_ALL, f"{subjects.CKPT_PREFIX}>")
    return [await bus.nc.subscribe(subject, cb=on_msg) for subject in wanted]
