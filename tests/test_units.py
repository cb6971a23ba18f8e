"""Kubernetes quantities as HCS reads them: every bad one is a QuantityError
naming the text, never a decimal exception from deep inside."""

from __future__ import annotations

from decimal import Decimal

import pytest

from hcs_bus.units import QuantityError, bytes_to_mib, parse_quantity, quantity_mib


@pytest.mark.parametrize(
    ("text", "value"),
    [("16Gi", Decimal(16 * 2**30)), ("500m", Decimal("0.5")), ("2", Decimal(2)), (3, Decimal(3))],
)
def test_quantities_are_read_with_their_suffix(text: str | int, value: Decimal) -> None:
    assert parse_quantity(text) == value


@pytest.mark.parametrize("text", ["1e9999999999", "9e999999Pi", "1e99999999Ki"])
def test_an_absurdly_large_quantity_is_a_quantity_error_naming_it(text: str) -> None:
    with pytest.raises(QuantityError, match="too large"):
        parse_quantity(text)


@pytest.mark.parametrize("text", ["", "nan", "inf", "16GB", "1.2.3", "--1"])
def test_a_malformed_quantity_is_a_quantity_error(text: str) -> None:
    with pytest.raises(QuantityError, match="not a Kubernetes quantity"):
        parse_quantity(text)


def test_a_part_of_a_mib_rounds_up() -> None:
    assert bytes_to_mib(Decimal(2**20 + 1)) == 2
    assert quantity_mib("16Gi") == 16384
