"""Kubernetes quantities: ``16Gi``, ``500Mi``, ``100``, ``1.5``, ``250m``."""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

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


class QuantityError(ValueError):
    pass


def parse_quantity(text: str | int | float) -> Decimal:
    if isinstance(text, int | float):
        return Decimal(str(text))
    match = _QUANTITY.match(text.strip())
    if not match:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity")
    try:
        number = Decimal(match.group(1))
    except InvalidOperation as exc:
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from exc
    return number * _SUFFIX[match.group(2) or ""]


def bytes_to_mib(value: Decimal) -> int:
    """Round up to whole MiB (a request is never shrunk)."""
    return int(-(-value // MIB))


def quantity_mib(text: str | int | float) -> int:
    """A memory quantity in MiB. A bare number is taken as bytes, as Kubernetes does."""
    return bytes_to_mib(parse_quantity(text))


def format_mib(mib: int) -> str:
    if mib % 1024 == 0:
        return f"{mib // 1024}Gi"
    return f"{mib}Mi"
