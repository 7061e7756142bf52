"""The pooled Cox model's per-group sums (:class:`fedstats.cox_math.GroupedRows`) equal the
same sums taken row by row.

The oracle: for each group, ``sum w``, ``sum w x`` and ``sum w x x'`` (its upper triangle,
row by row) over the group's rows, ``w = v exp(x' beta)``, accumulated with ``np.add.at``
in the rows' own order. Groups may be empty, hold one row or many, and a block may hold
one group or several (the block size is lowered so that rows span many blocks).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedstats import cox_math
from fedstats.cox_math import GroupedRows, pack_symmetric
from fedstats.site.design_cache import footprint


def row_by_row(X, v, group, n_groups, beta):
    w = v * np.exp(X @ beta)
    p = X.shape[1]
    S0, S1 = np.zeros(n_groups), np.zeros((n_groups, p))
    S2 = np.zeros((n_groups, p, p))
    np.add.at(S0, group, w)
    np.add.at(S1, group, w[:, None] * X)
    np.add.at(S2, group, w[:, None, None] * X[:, :, None] * X[:, None, :])
    return S0, S1, pack_symmetric(S2)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 400),
    p=st.integers(1, 6),
    n_groups=st.integers(1, 50),
    block_bytes=st.sampled_from([64, 2048, 1 << 20]),
)
def test_group_sums_equal_the_sums_row_by_row(seed, n, p, n_groups, block_bytes):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    v = rng.integers(0, 4, n).astype(float)
    group = rng.integers(0, n_groups, n)
    beta = rng.normal(scale=0.3, size=p)
    original = cox_math._BLOCK_BYTES
    cox_math._BLOCK_BYTES = block_bytes
    try:
        rows = GroupedRows.of(X, v, group, n_groups)
    finally:
        cox_math._BLOCK_BYTES = original
    for ours, oracle in zip(rows.sums(beta), row_by_row(X, v, group, n_groups, beta), strict=True):
        np.testing.assert_allclose(ours, oracle, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n", [0, 1, 5000])
def test_a_site_cache_counts_the_group_matrices(n):
    rng = np.random.default_rng(n)
    rows = GroupedRows.of(rng.normal(size=(n, 3)), np.ones(n), rng.integers(0, 40, n), 40)
    sparse = sum(m.data.nbytes + m.indices.nbytes + m.indptr.nbytes for m in rows.adders)
    assert footprint(rows) == rows.XT.nbytes + rows.v.nbytes + rows.groups.nbytes + (
        rows.firsts.nbytes + rows.cuts.nbytes + sparse
    )
    assert n == 0 or sparse >= 16 * n  # a value and a column index per row
