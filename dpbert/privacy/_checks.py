"""Argument checks shared by the privacy modules.

Every check raises ``ValueError`` whose message starts with the parameter's name and ends with
the offending value, e.g. ``sigma must be > 0, got -1``.
"""
from __future__ import annotations

import math
import numbers


def positive(name: str, value) -> float:
    """A finite real number > 0."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    return float(value)


def finite(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    return float(value)


def non_negative(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) \
            or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return float(value)


def probability(name: str, value) -> float:
    """A δ: strictly between 0 and 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < 1:
        raise ValueError(f"{name} must be in (0, 1), got {value!r}")
    return float(value)


def fraction(name: str, value) -> float:
    """A sampling probability or a fraction: in (0, 1]."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value <= 1:
        raise ValueError(f"{name} must be in (0, 1], got {value!r}")
    return float(value)


def integer(name: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def choice(name: str, value, options) -> str:
    if value not in options:
        raise ValueError(f"{name} must be one of {', '.join(map(str, options))}, got {value!r}")
    return value


def nearest_integer(x: float):
    """round(x) if x is an integer up to float rounding (relative 1e-12), else None.

    x is a ratio of integers with denominator <= n (e.g. s*B/n or epochs*n/B); a non-integer one is
    at least 1/n from an integer, far more than the float error, for any n below 1e11.
    """
    r = round(x)
    return int(r) if abs(x - r) <= 1e-12 * max(1.0, abs(x)) else None
