"""Values as a study's JSON files hold them: plain numbers, ``null`` for what is not finite.

JSON has no NaN or infinity and no NumPy scalars; every fit record, result
file and status file is written through these, so each file says "no
value" the same way (``null``) and reads back without a custom decoder.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np


def json_number(value: Any) -> Any:
    """``value`` as JSON: NumPy scalars as Python numbers, NaN and infinities as ``None``."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def json_numbers(values: Iterable[Any]) -> list[Any]:
    """An array of numbers as a JSON list of floats (``None`` where not finite)."""
    return [json_number(float(v)) for v in np.asarray(values, dtype=np.float64)]


def json_tree(value: Any) -> Any:
    """``value`` with tuples as lists, mappings as dicts (string keys) and numbers as JSON."""
    if isinstance(value, Mapping):
        return {str(k): json_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_tree(v) for v in value]
    return json_number(value)
