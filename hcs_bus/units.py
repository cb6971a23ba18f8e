"""Kubernetes quantities: ``16Gi``, ``500Mi``, ``100``, ``1.5``, ``250m``; the
``ai.compute/*`` extended resources and the unit each is counted in on a Node
and in a pod (the kubelet compares the two numbers as they are)."""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, InvalidOperation

_SUFFIX = {
    "": Decimal(1),
    "m": Decimal("0.001"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
}
_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(m|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)?$")
MIB = 2**20

# Extended resources on Node status and in pod requests, in the same unit.
VRAM_RESOURCE = "ai.compute/vram"  # bytes (a pod writes 16Gi)
ACU_RESOURCE = "ai.compute/acu"  # whole ACU (1 ACU = 1 % of an A100-80G's dense FP16)
DEVICES_RESOURCE = "ai.compute/devices"  # whole devices


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int | float) -> Decimal:
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2) or ""]
    except InvalidOperation as exc:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from exc
    except ArithmeticError as exc:  # decimal.Overflow: e.g. "1e9999999999"
        raise QuantityError(f"{text!r} is too large") from exc


def bytes_to_mib(value: Decimal) -> int:
    """Round up to whole MiB (a request is never shrunk). Decimal ``//``
    truncates toward zero, so the ceiling is taken explicitly."""
    return int((Decimal(value) / MIB).to_integral_value(rounding=ROUND_CEILING))


def mib_to_bytes(mib: int) -> int:
    """MiB (as devices report memory) to bytes (as pods request ``ai.compute/vram``)."""
    return mib * MIB


def quantity_mib(text: str | int | float) -> int:
    """A memory quantity in MiB. A bare number is taken as bytes, as Kubernetes does."""
    return bytes_to_mib(parse_quantity(text))


def format_mib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"
