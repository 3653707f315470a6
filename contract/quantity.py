"""Kubernetes quantities ("500m", "64Gi", "1e3", 2), parsed one way for every part of Tessera.

The apiserver accepts quantities far beyond any real amount ("1e400" is a valid cpu request), so
every amount that enters is checked here: negative, non-finite and absurdly large values are
refused with a ValueError naming the value, never turned into an overflow or an infinity that
would poison a queue's totals. The bound, 2^63 - 1, is the largest amount a Kubernetes quantity
can report as an integer (`Quantity.Value()`), far above any cluster's cpu, memory or GPUs.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

MAX_QUANTITY = Decimal(2**63 - 1)

_QUANTITY = re.compile(
    r"^\+?(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"((?P<binary>Ki|Mi|Gi|Ti|Pi|Ei)|(?P<decimal>[numkMGTPE])|[eE](?P<exponent>[+-]?[0-9]+))?$"
)
_DECIMAL_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_BINARY_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
# Exponents past this are out of range whatever the mantissa (the regex bounds nothing).
_MAX_EXPONENT = 40


def parse_decimal(value: object) -> Decimal:
    """A quantity as an exact, finite, non-negative Decimal no larger than MAX_QUANTITY."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"expected a number or a quantity string, got {value!r}")
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"{value!r} must be a finite, non-negative amount")
        number = Decimal(value)
    else:
        match = _QUANTITY.match(value.strip())
        if match is None:
            raise ValueError(f"{value!r} is not a non-negative Kubernetes quantity (e.g. 4, 500m, 64Gi)")
        try:
            number = Decimal(match["number"])
        except InvalidOperation:
            raise ValueError(f"{value!r} is not a Kubernetes quantity") from None
        if match["binary"]:
            number *= _BINARY_SUFFIX[match["binary"]]
        elif match["decimal"]:
            number *= _DECIMAL_SUFFIX[match["decimal"]]
        elif match["exponent"]:
            exponent = int(match["exponent"])
            if exponent > _MAX_EXPONENT and number != 0:
                raise ValueError(f"{value!r} is larger than any real amount (at most {MAX_QUANTITY})")
            number = number.scaleb(max(exponent, -_MAX_EXPONENT))
    if number < 0:
        raise ValueError(f"{value!r} must be a finite, non-negative amount")
    if number > MAX_QUANTITY:
        raise ValueError(f"{value!r} is larger than any real amount (at most {MAX_QUANTITY})")
    return number


def parse_quantity(value: object) -> float:
    """A quantity as a plain float, for sums and shares ("500m" -> 0.5, "64Gi" -> 68719476736.0)."""
    return float(parse_decimal(value))


def parse_quantity_ceil(value: object) -> int:
    """A quantity as an integer rounded up, as the apiserver rounds byte counts ("1.5" -> 2)."""
    return int(parse_decimal(value).to_integral_value(rounding="ROUND_CEILING"))
