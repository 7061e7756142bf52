"""Sums over a design's rows taken block by block, so each block is read from memory once.

An exact reply of a Newton round is a handful of sums over the design's rows at the
round's coefficients: the linear predictor ``eta = X beta + o``, the score ``X' r`` and the
information ``X' diag(w) X`` (IRLS; McCullagh & Nelder, *Generalized Linear Models*, 2nd ed.,
1989, §2.5). Computed on whole columns, each step is a pass over ``X`` and writes an
``n x p`` temporary (``X * w``) that the next pass reads back. Taken over blocks of rows
small enough to stay in the processor's cache (:func:`row_blocks`), every step of a block
reads the block where the previous one left it, and the design is read from memory once
per round.

The information is summed as ``sum_b A_b' A_b`` with ``A_b = diag(sqrt(w_b)) X_b`` (weights
``w >= 0``): numpy computes ``A' A`` as one symmetric rank-``k`` update (BLAS ``syrk``), half
the work of a general product, and the total is symmetric to the last bit
(:class:`Information`). Sums over blocks equal the sums over all rows up to rounding
(the order of additions differs, by about one unit in the last place per block).
"""

from __future__ import annotations

from collections.abc import Iterator

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


class Information:
    """``X' diag(w) X`` summed block by block: :meth:`add` each block's rows and weights,
    then :meth:`total`."""

    def __init__(self, n_columns: int) -> None:
        self._sum = np.zeros((n_columns, n_columns))

    def add(self, rows: np.ndarray, weights: np.ndarray) -> None:
        """Add ``rows' diag(weights) rows`` (``weights >= 0``; a NaN weight makes the total NaN,
        as the whole-column product would)."""
        scaled = rows * np.sqrt(weights)[:, None]
        self._sum += scaled.T @ scaled

    def total(self) -> np.ndarray:
        """The summed information (a fresh, C-contiguous float64 array)."""
        return np.ascontiguousarray(self._sum)
