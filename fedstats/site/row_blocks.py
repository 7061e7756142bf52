"""Sums over a design's rows taken block by block, so each block is read from memory once.

An exact reply of a Newton round is a handful of sums over the design's rows at the
round's coefficients: the linear predictor ``eta = X beta + o``, the score ``X' r`` and the
information ``X' diag(w) X`` (IRLS; McCullagh & Nelder, *Generalized Linear Models*, 2nd ed.,
1989, §2.5). Computed on whole columns, each step is a pass over ``X`` and writes an
``n x p`` temporary (``X * w``) that the next pass reads back. Taken over blocks of rows
small enough to stay in the processor's cache (:func:`row_blocks`), every step of a block
reads the block where the previous one left it, and the design is read from memory once
per round; a design kept as its columns is copied into one cache-sized block at a time
(:func:`column_blocks`) and never built whole.

The information is summed as ``sum_b A_b' A_b`` with ``A_b = diag(sqrt(w_b)) X_b`` (weights
``w >= 0``): numpy computes ``A' A`` as one symmetric rank-``k`` update (BLAS ``syrk``), half
the work of a general product, and the total is symmetric to the last bit
(:class:`Information`). Sums over blocks equal the sums over all rows up to rounding
(the order of additions differs, by about one unit in the last place per block).

The products are ``numpy.dot``, not ``@``: ``dot`` releases the interpreter lock around
its BLAS call, while ``matmul`` ran no faster on two threads than on one (numpy 2.4: two
threads took a block's ``A' A`` 0.9 times as fast as one with ``@``, 2.0 times with
``dot``; numpy issue 11821), so sites answering in threads of one process
(:mod:`fedstats.in_process`) would take turns at every block. Both call the same BLAS
routines.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import numpy as np

BLOCK_BYTES = 1 << 20
"""The size of one block of design rows (1 MiB): with its weighted copy it stays within a
core's L2 cache."""


def row_blocks(n_rows: int, n_columns: int) -> Iterator[slice]:
    """Consecutive slices of ``n_rows`` rows, each about :data:`BLOCK_BYTES` of a float64
    design of ``n_columns`` columns (at least 256 rows)."""
    size = max(256, BLOCK_BYTES // (8 * max(n_columns, 1)))
    for start in range(0, n_rows, size):
        yield slice(start, min(start + size, n_rows))


def column_blocks(columns: Sequence[np.ndarray], n_rows: int) -> Iterator[tuple[slice, np.ndarray]]:
    """The design whose ``columns`` are given, a block of rows at a time (:func:`row_blocks`):
    each block copied into one column-major buffer, reused from block to block and round to
    round (read a block before taking the next). Only the block is ever written: the design
    is not built whole."""
    p = len(columns)
    buffer = workspace("block", max(256, BLOCK_BYTES // (8 * max(p, 1))), p)
    for rows in row_blocks(n_rows, p):
        block = buffer[: rows.stop - rows.start]
        for j, column in enumerate(columns):
            block[:, j] = column[rows]
        yield rows, block


class Information:
    """``X' diag(w) X`` summed block by block: :meth:`add` each block's rows and weights,
    then :meth:`total`."""

    def __init__(self, n_columns: int) -> None:
        self._sum = np.zeros((n_columns, n_columns))

    def add(self, rows: np.ndarray, weights: np.ndarray) -> None:
        """Add ``rows' diag(weights) rows`` (``weights >= 0``; a NaN weight makes the total NaN,
        as the whole-column product would)."""
        m, p = rows.shape
        scaled = workspace("scaled", max(256, BLOCK_BYTES // (8 * max(p, 1)), m), p)[:m]
        np.multiply(rows, np.sqrt(weights)[:, None], out=scaled)
        self._sum += np.dot(scaled.T, scaled)

    def total(self) -> np.ndarray:
        """The summed information (a fresh, C-contiguous float64 array)."""
        return np.ascontiguousarray(self._sum)


_WORKSPACES = threading.local()


def workspace(name: str, n_rows: int, n_columns: int) -> np.ndarray:
    """A column-major float64 scratch array of this thread's, kept from call to call: the
    blocks of every round reuse the same memory instead of asking the system for fresh pages
    each time. Its contents are whatever the last user left."""
    kept = getattr(_WORKSPACES, "arrays", None)
    if kept is None:
        kept = _WORKSPACES.arrays = {}
    array = kept.get(name)
    if array is None or array.shape != (n_rows, n_columns):
        array = kept[name] = np.empty((n_rows, n_columns), order="F")
    return array
