"""The plan note (``hcs.io/plan``): the class and size admission planned for a
pod. The injector writes it (and signs its exact text, ``hcs.io/plan-sig``:
``injector.plans``); the scheduler reads it at filter and bind
(``scheduler.plan.pods``). One schema for both, pure::

    {"vendor":"nvidia","model":"A100-80G","devices":2,"vram_mib_per_device":81920,
     "whole_device":true,"acu_per_device":100.0}

Encoded compactly in field order, every field written. Decoded strictly: an
unknown field is refused, and so is a missing one except ``acu_per_device``
(0 when absent). ``whole_device`` has no default: a note that does not say
whether the pod takes whole devices or slices is refused, never read as
slices (a device the plan gave whole would be shared).
"""

from __future__ import annotations

import msgspec

from hcs_bus.messages import Plan


class PlanNote(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``hcs.io/plan`` annotation: what admission decided for the pod."""

    vendor: str
    model: str
    devices: int
    vram_mib_per_device: int
    whole_device: bool
    acu_per_device: float = 0.0

    @property
    def key(self) -> str:
        """The planned class, ``vendor/model``."""
        return f"{self.vendor}/{self.model}"


_ENCODER = msgspec.json.Encoder(order="deterministic")
_DECODER = msgspec.json.Decoder(PlanNote)


def note_of(plan: Plan) -> PlanNote:
    """The note of a plan."""
    return PlanNote(
        vendor=plan.vendor,
        model=plan.model,
        devices=plan.devices,
        vram_mib_per_device=plan.vram_mib_per_device,
        whole_device=plan.whole_device,
        acu_per_device=plan.acu_per_device,
    )


def encode(note: PlanNote) -> str:
    """The annotation's text (what the signature covers)."""
    return _ENCODER.encode(note).decode()


def decode(text: str) -> PlanNote:
    """The note in ``text``; ``msgspec.ValidationError`` (the field named) or
    ``msgspec.DecodeError`` when it is not one."""
    return _DECODER.decode(text)
