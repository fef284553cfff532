"""How a privacy number is written for a person: exact enough, never rounded the flattering way.

A δ is printed with at least 6 significant digits and rounded UP (a true 1.0001e-05 must never
read 1e-05, a 1e-9 never 0); an ε is rounded up too (``fmt_epsilon``). ``double_at_least`` is the
value stored where a reader may round (ML Metadata keeps a double to 6 decimals): the smallest
number at that precision that is not below the exact value, so a stored δ never understates it.
"""
from __future__ import annotations

import math
from decimal import ROUND_CEILING, Decimal

#: Significant digits of a printed δ.
DELTA_DIGITS = 6


def _round_up(value: float, digits: int) -> Decimal:
    # 15 significant digits first: a float sum such as 1e-9 + 1e-5 = 1.0001000000000001e-05 must
    # print 1.0001e-05, not round its last binary digit up to 1.00011e-05.
    d = Decimal(format(float(value), ".15g"))
    if d == 0:
        return d
    exponent = d.adjusted() - (digits - 1)
    return d.quantize(Decimal(1).scaleb(exponent), rounding=ROUND_CEILING)


def round_up(value: float, digits: int) -> float:
    """``value`` rounded UP to ``digits`` significant digits (a stored δ that must not understate)."""
    return float(_round_up(value, digits))


def _text(value, digits: int, none: str) -> str:
    if value is None:
        return none
    value = float(value)
    if math.isnan(value):
        return "n/a"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if value == 0:
        return "0"
    rounded = _round_up(value, digits)
    text = f"{rounded:.{digits - 1}e}" if (abs(value) < 1e-3 or abs(value) >= 1e6) else format(rounded, "f")
    if "e" in text:
        mantissa, exp = text.split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        return f"{mantissa}e{int(exp):+03d}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def fmt_delta(value, none: str = "-") -> str:
    """δ with ≥ 6 significant digits, rounded up: 1.0001e-05 → ``1.0001e-05``, 1e-9 → ``1e-09``."""
    return _text(value, DELTA_DIGITS, none)


def fmt_epsilon(value, digits: int = 4, none: str = "-") -> str:
    """ε with ``digits`` significant digits, rounded up (never below the value); ``inf``, ``n/a``."""
    return _text(value, digits, none)


def double_at_least(value: float, decimals: int = 6) -> float:
    """The value rounded UP to ``decimals`` decimals (what ML Metadata keeps of a double): a stored
    δ = 1e-9 reads back 1e-06, not 0. Non-finite values are returned as they are."""
    value = float(value)
    if not math.isfinite(value):
        return value
    scaled = value * 10 ** decimals
    # A float product may land a hair above an exact decimal (1e-05 * 1e6 = 10.000000000000002).
    return math.ceil(scaled - 1e-9 * abs(scaled)) / 10 ** decimals
