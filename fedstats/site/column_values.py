"""Reading a site's columns as numbers: follow-up times, 0/1 flags, and any numeric column.

One place for the checks every survival, count and weighted task makes on
the columns a request names, so that each refuses the same bad values with
the same typed error naming the site, the column and how many rows are bad.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from fedstats.errors import InconsistentColumnError, NonBinaryOutcomeError


def as_numbers(values: pd.Series) -> np.ndarray:
    """The values as float64: booleans as 0/1, anything that is not a number as NaN."""
    raw = values.astype("float64") if values.dtype == bool else values
    return pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)


def follow_up_times(site: str, column: str, values: pd.Series) -> np.ndarray:
    """Follow-up times as float64: finite numbers ``>= 0``, or refused with the count of
    bad rows (:class:`~fedstats.errors.InconsistentColumnError`)."""
    time = as_numbers(values)
    bad = ~np.isfinite(time) | (time < 0)
    if bad.any():
        raise InconsistentColumnError(
            site=site,
            column=column,
            reason=f"has {int(bad.sum())} follow-up times that are not finite numbers >= 0",
        )
    return time


def event_flags(site: str, column: str, values: pd.Series) -> np.ndarray:
    """0/1 event indicators as float64, or refused with the count of other values
    (:class:`~fedstats.errors.NonBinaryOutcomeError`)."""
    event = as_numbers(values)
    other = int((~np.isin(event, (0.0, 1.0))).sum())
    if other:
        raise NonBinaryOutcomeError(site=site, column=column, count=other)
    return event
