"""Parameter validation shared by every chapter and model config.

Every check raises :class:`ParameterError` with a one-line message naming the parameter, the value
received and what is allowed, so that a bad papermill parameter fails before any computation.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Integral, Real
from typing import Any

__all__ = ["ParameterError", "check_choice", "check_int", "check_float", "check_bool"]


class ParameterError(ValueError):
    """A parameter has a value outside its allowed set (raised before any computation)."""


def check_choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return ``value`` if it is one of ``allowed``, else raise :class:`ParameterError`."""
    allowed = tuple(allowed)
    if value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ParameterError(f"{name}={value!r} is not allowed; choose one of: {choices}")
    return value


def check_int(name: str, value: Any, minimum: int | None = 1, maximum: int | None = None) -> int:
    """Return ``value`` if it is an integer in ``[minimum, maximum]``, else raise."""
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise ParameterError(f"{name}={value!r} must be an integer")
    if minimum is not None and value < minimum:
        raise ParameterError(f"{name}={value!r} must be an integer >= {minimum}")
    if maximum is not None and value > maximum:
        raise ParameterError(f"{name}={value!r} must be an integer <= {maximum}")
    return int(value)


def check_float(
    name: str,
    value: Any,
    minimum: float | None = None,
    maximum: float | None = None,
    strict: bool = False,
) -> float:
    """Return ``value`` as a float if it is finite and within the bounds, else raise.

    ``strict=True`` excludes the bounds themselves (e.g. ``minimum=0, strict=True`` means ``> 0``).
    """
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ParameterError(f"{name}={value!r} must be a finite number")
    low_bad = minimum is not None and (value <= minimum if strict else value < minimum)
    high_bad = maximum is not None and (value >= maximum if strict else value > maximum)
    if low_bad or high_bad:
        op_lo, op_hi = (">", "<") if strict else (">=", "<=")
        parts = []
        if minimum is not None:
            parts.append(f"{op_lo} {minimum}")
        if maximum is not None:
            parts.append(f"{op_hi} {maximum}")
        raise ParameterError(f"{name}={value!r} must be {' and '.join(parts)}")
    return float(value)


def check_bool(name: str, value: Any) -> bool:
    """Return ``value`` if it is a boolean (not a string such as ``"false"``), else raise."""
    if not isinstance(value, bool):
        raise ParameterError(f"{name}={value!r} must be True or False")
    return value
