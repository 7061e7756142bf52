"""The guard's near-copy search over remembered columns held in several matrices decides as
over one matrix of them all.

The differencing guard compares a request's new columns with the columns it remembers
and with the request's earlier new columns, held apart and never stacked
(:func:`fedstats.site.near_copies.near_copies` takes the remembered columns as a sequence
of columns or matrices of them, with each one's least and greatest value). The oracle is
the same search over the columns stacked into one matrix, extremes computed there: equal
verdicts, column by column, for parts of every length (one row, empty, longer than a
block) and for the columns one by one (the guard's form), on columns built to be copies,
affine images and near-copies of the remembered ones.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fedstats.site.near_copies import near_copies


def remembered_and_new(seed: int, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    stored = rng.normal(size=(m, n))
    base = stored[rng.integers(0, m)] if m else rng.normal(size=n)
    kind = rng.integers(0, 4)
    if kind == 0:
        column = base.copy()  # a copy
    elif kind == 1:
        column = 3.0 * base - 2.0  # an affine image
    elif kind == 2:
        column = base.copy()
        column[rng.integers(0, n, 2)] += 5.0  # a near-copy: two rows changed
    else:
        column = rng.normal(size=n)  # unrelated
    return stored, column


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    cuts=st.lists(st.integers(0, 30), max_size=4),
    n=st.sampled_from([50, 400]),
    k=st.sampled_from([2, 3, 5]),
)
def test_parts_decide_as_one_matrix(seed, cuts, n, k):
    m = sum(cuts) if cuts else 0
    stored, column = remembered_and_new(seed, m, n)
    parts, start = [], 0
    for size in cuts:
        parts.append(stored[start : start + size])
        start += size
    extremes = (stored.min(axis=1, initial=np.inf), stored.max(axis=1, initial=-np.inf))
    whole = near_copies(stored, column, k)
    split = near_copies(parts, column, k, extremes=extremes)
    assert np.array_equal(whole[0], split[0]) and np.array_equal(whole[1], split[1])
    one_by_one = near_copies(list(stored), column, k, extremes=extremes)
    assert np.array_equal(whole[0], one_by_one[0]) and np.array_equal(whole[1], one_by_one[1])


def test_a_short_first_part_before_a_long_one():
    """A study's second analysis: three remembered columns, then twenty of the request's
    own (the first part is shorter than the search's block of rows)."""
    rng = np.random.default_rng(4)
    stored = rng.normal(size=(23, 300))
    column = stored[21].copy()
    column[[7, 90]] += 4.0
    extremes = (stored.min(axis=1), stored.max(axis=1))
    whole = near_copies(stored, column, 3)
    split = near_copies((stored[:3], stored[3:]), column, 3, extremes=extremes)
    assert whole[0][21] and np.array_equal(whole[0], split[0])
    assert np.array_equal(whole[1], split[1])
