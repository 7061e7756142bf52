"""The frame a site holds: its own copy, each numeric column one contiguous, read-only array.

Every rule, design and round at a site reads the frame a column at a time: the
missing-value and cell rules, the differencing guard's near-copy check, the design's
columns and each Newton round's blocks. A :class:`~fedstats.site.silo.Silo` therefore
holds its own deep copy of the frame it is given, laid out column by column (pandas
keeps a frame built from one 2-D array as that array's transpose, so each of its columns
would be a strided view, every ``p``-th value, copied again at each design), each numeric
column a read-only array of its own.

Nothing at the site writes to its frame, and with the copy nobody outside does either:
the caller keeps its own frame, free to change it, and the site's columns stay the values
the site answered about. So a design reads the frame's columns without copying them, and
the differencing guard remembers such a column by reference
(:func:`immutable`), where any other column is remembered as a copy of its own.
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd


def held_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """The site's own copy of ``frame``: the same values, index, columns and ``attrs`` (so it
    hashes alike, :func:`fedstats.site.differencing.frame_digest`, and declares the same
    fingerprint), each numeric column a fresh contiguous array made read-only before any
    view of it exists (a view taken earlier would stay writable), held by the frame as it
    is (not consolidated into a block)."""
    columns: dict[int, object] = {}
    for position, (_, series) in enumerate(frame.items()):
        if numpy_numeric(series):
            values = np.array(series.to_numpy(), dtype=series.dtype, order="C", copy=True)
            values.flags.writeable = False
            columns[position] = values
        else:
            columns[position] = series.array.copy()
    held = pd.DataFrame(columns, index=frame.index.copy(), copy=False)
    held.columns = frame.columns.copy()
    held.attrs = copy.deepcopy(frame.attrs)  # what harmonize declares (its fingerprint)
    return held.set_flags(allows_duplicate_labels=frame.flags.allows_duplicate_labels)


def numpy_numeric(series: pd.Series) -> bool:
    """Whether ``series`` holds numbers or booleans in one numpy array (not an extension
    array: nullable integers, strings, categories)."""
    return isinstance(series.dtype, np.dtype) and series.dtype.kind in "biuf"


def buffer_of(array: np.ndarray) -> np.ndarray:
    """The array that owns ``array``'s memory: ``array`` itself, or the base of its view."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def immutable(array: np.ndarray) -> bool:
    """Whether no array can write to ``array``'s values: the array owning its memory is
    read-only. A read-only view of a writable array is not. numpy cannot tell whether a
    writable view was taken before an owner was made read-only, so the site makes its
    arrays read-only as it creates them (:func:`held_frame`, the differencing guard's
    copies); an array over bytes (a record read back) is read-only from the start."""
    return not buffer_of(array).flags.writeable
