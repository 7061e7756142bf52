"""Exact order statistics from a sampled bracket equal a full sort's, whatever the column.

:mod:`fedstats.site.order_statistics` feeds the small-cell rules and the differencing
guard, so a wrong median or extreme would loosen a refusal. The oracle is ``numpy.sort``
of the same column; the columns include the orders a sample can be fooled by (sorted,
reversed, a value repeated on a sampled stride, ties at the median), infinities and NaN.
"""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from fedstats.site import order_statistics
from fedstats.site.cell_rules import column_problem, problem_of_sorted_column
from fedstats.site.order_statistics import ends, middle

LONG = order_statistics._SHORT + 1  # the shortest column a bracket is tried on


def check_against_sort(values: np.ndarray, counts: list[int]) -> None:
    ordered = np.sort(values)
    n = len(values)
    for count in counts:
        kept = max(0, min(count, n))
        low, high = ends(values, count)
        assert np.array_equal(low, ordered[:kept], equal_nan=True)
        assert np.array_equal(high, ordered[n - kept :], equal_nan=True)
    if n:
        low, high = middle(values)
        expected = [ordered[(n - 1) // 2], ordered[n // 2]]
        assert np.array_equal([low, high], expected, equal_nan=True)


def adversarial_columns(n: int, rng: np.random.Generator) -> list[np.ndarray]:
    step = max(1, n // order_statistics.SAMPLE)
    strided = rng.normal(size=n)
    strided[::step] = -10.0  # the whole sample holds the smallest value
    sampled_high = rng.normal(size=n)
    sampled_high[::step] = 10.0  # the whole sample holds the largest value
    ties = np.repeat([1.0, 2.0, 3.0], [n // 2 - 3, 7, n - n // 2 - 4])
    with_nan = rng.normal(size=n)
    with_nan[rng.integers(0, n, 3)] = np.nan
    with_inf = rng.normal(size=n)
    with_inf[: n // 3] = np.inf
    with_inf[-5:] = -np.inf
    return [
        rng.normal(size=n),
        np.sort(rng.normal(size=n)),
        np.sort(rng.normal(size=n))[::-1].copy(),
        strided,
        sampled_high,
        ties,
        rng.permutation(ties),
        np.zeros(n),
        rng.integers(0, 2, n).astype(float),
        with_nan,
        with_inf,
    ]


def test_long_columns_of_every_troublesome_order_match_a_full_sort():
    rng = np.random.default_rng(20261127)
    for n in (LONG, 3 * LONG + 7, 100_003):
        for values in adversarial_columns(n, rng):
            check_against_sort(values, [0, 1, 2, 4, 20, 127, 128, 160, 1280, n - 1, n, n + 5])


@given(
    arrays(
        np.float64,
        st.integers(LONG, LONG + 300),
        elements=st.floats(-5, 5, allow_nan=False) | st.sampled_from([0.0, 1.0, np.inf]),
    ),
    st.lists(st.integers(0, 300), min_size=1, max_size=4),
)
def test_any_long_column_matches_a_full_sort(values, counts):
    check_against_sort(values, counts)


@given(arrays(np.float64, st.integers(1, 60), elements=st.floats(allow_nan=True)))
def test_short_columns_match_a_full_sort(values):
    check_against_sort(values, [0, 1, 2, 3, 59, 61])


def test_the_cell_rules_decide_a_long_column_as_a_full_sort_does():
    """``column_problem`` (median, mode, dominance from selections) against the same rule
    computed from the sorted column (``problem_of_sorted_column``), on columns built to sit
    at the rules' edges: one, two and three rows away from the mode; a dominated bump."""
    rng = np.random.default_rng(7)
    n = 2 * LONG
    columns = []
    for off in (1, 2, 3, 4):
        values = np.zeros(n)
        values[rng.choice(n, off, replace=False)] = rng.normal(size=off)
        columns.append(values)
    bump = rng.normal(size=n) * 1e-6
    bump[rng.integers(0, n)] = 1e3
    columns += [bump, rng.normal(size=n), rng.integers(0, 3, n).astype(float)]
    for values in columns:
        for k in (2, 3, 5):
            assert column_problem(values, k) == problem_of_sorted_column(np.sort(values), k)
