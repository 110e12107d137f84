"""Checks for the values a request carries to the device: each raises a `ValueError` that
names the argument, its value and the allowed range, the message the server sends as a 400.

Integers must fit the 64-bit wire format between the front end and the engine; floats must
be finite as float32, the dtype the step stores them in (1e308 is finite in Python but
infinite on the device).
"""

import math
import operator

INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
FLOAT32_MAX = 3.4028234663852886e38


def check_int(name: str, value, low: int = INT64_MIN, high: int = INT64_MAX) -> int:
    """`value` as an int in [low, high]; a bool or a float is not an int."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an integer, got {value!r}.")
    try:
        value = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be an integer, got {value!r}.") from None
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value}.")
    return value


def check_float(name: str, value, low: float = -FLOAT32_MAX, high: float = FLOAT32_MAX, low_open: bool = False):
    """`value` as a finite float in [low, high] (or (low, high] with `low_open`)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{name} must be a number, got {value!r}.")
    value = float(value)
    is_in_range = (low < value if low_open else low <= value) and value <= high
    if not math.isfinite(value) or not is_in_range:
        interval = f"{'(' if low_open else '['}{low:g}, {high:g}]"
        raise ValueError(f"{name} must be a finite number in {interval}, got {value!r}.")
    return value


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}.")
    return value


def check_int_list(name: str, values, low: int = INT64_MIN, high: int = INT64_MAX) -> list[int]:
    """`values` as a list of ints, each in [low, high]."""
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a list of integers, got {values!r}.")
    checked = []
    for value in values:
        try:
            checked.append(check_int(name, value, low, high))
        except ValueError:
            raise ValueError(f"{name} must hold integers in [{low}, {high}], got {value!r} in it.") from None
    return checked


def check_str_list(name: str, values) -> list[str]:
    """`values` (a str or a list of them) as a list of non-empty strings."""
    if isinstance(values, str):
        values = [values]
    if isinstance(values, (bytes, dict)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a string or a list of strings, got {values!r}.")
    values = list(values)
    for value in values:
        if not isinstance(value, str):
            raise ValueError(f"{name} must hold strings, got {value!r} in it.")
        if not value:
            raise ValueError(f"{name} cannot contain an empty string.")
    return values
