"""Checks of plain Python arguments: one-line ValueErrors naming the argument, its range and what it got.

Dataset loaders and generators, partitioners and the robust aggregators' options check their scalar
arguments here, so that one kind of mistake reads the same everywhere ("num_clients must be an integer
>= 1, got 0"). A run's settings are checked against their declared ranges by
`jaxfl.experiment.config.check_value`; traced arrays, inside compiled code, by
`jaxfl.primitives._validation`.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np


def _shown(bound: float) -> str:
    return str(bound) if isinstance(bound, numbers.Integral) else f"{bound:g}"


def range_text(
    low: float = -math.inf, high: float | None = None, *, low_open: bool = False, high_open: bool = False
) -> str:
    """'>= 0', '> 0', 'in [0, 1)', ...: the range a checked value must lie in ('' when unbounded)."""
    if high is None or high == math.inf:
        return "" if low == -math.inf else f"{'>' if low_open else '>='} {_shown(low)}"
    left, right = "(" if low_open else "[", ")" if high_open else "]"
    return f"in {left}{_shown(low)}, {_shown(high)}{right}"


def _is_int(value: Any) -> bool:
    # bool is an Integral, but `num_clients=True` is a mistake, not a 1.
    return isinstance(value, numbers.Integral) and not isinstance(value, bool | np.bool_)


def check_int(
    name: str,
    value: Any,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    note: str = "",
    optional: bool = False,
) -> int | None:
    """`value` as an int in [minimum, maximum] (None when `optional` and None), else a ValueError.

    `note` follows the range in the message (e.g. ' (the number of examples)').
    """
    if value is None and optional:
        return None
    if not _is_int(value) or value < minimum or (maximum is not None and value > maximum):
        allowed = f"an integer {range_text(minimum, maximum)}{note}{' or null' if optional else ''}"
        raise ValueError(f"{name} must be {allowed}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value: Any,
    *,
    low: float = -math.inf,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
) -> float:
    """`value` as a finite float in the given range, else a ValueError."""
    is_real = isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
    number = float(value) if is_real else None
    inside = (
        number is not None
        and math.isfinite(number)
        and (number > low if low_open else number >= low)
        and (high is None or (number < high if high_open else number <= high))
    )
    if not inside:
        bounds = range_text(low, high, low_open=low_open, high_open=high_open)
        raise ValueError(f"{name} must be a finite number{' ' + bounds if bounds else ''}, got {value!r}")
    return number


def check_fraction(name: str, value: Any) -> float:
    """`value` as a float in the open interval (0, 1), else a ValueError."""
    return check_number(name, value, low=0.0, high=1.0, low_open=True, high_open=True)


def check_choice(name: str, value: Any, allowed: Sequence[Any]) -> Any:
    """`value` if it is one of `allowed`, else a ValueError listing them."""
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")
    return value


def check_keywords(caller: str, given: Collection[str], allowed: Collection[str]) -> None:
    """A TypeError, as Python's own, for keywords of a `**kwargs: Unpack[...]` that the TypedDict lacks.

    `allowed` is the TypedDict's keys (`TypedDict.__annotations__`), or another
    declaration of them.
    """
    unknown = sorted(set(given) - set(allowed))
    if unknown:
        raise TypeError(
            f"{caller}() got unexpected keyword arguments {unknown}; valid: {', '.join(allowed)}"
        )

