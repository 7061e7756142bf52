"""The small-cell rules on design columns, against their definitions written plainly."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from fedstats.site.cell_rules import column_problem, problem_of_sorted_column


def plain_rules(values: np.ndarray, k: int) -> str | None:
    """Oracle: the mode rule with np.unique, the dominance rule with a full sort of deviations."""
    _, counts = np.unique(values, return_counts=True)
    differing = values.size - counts.max()
    if 0 < differing < k:
        return "mode"
    if k > 1 and differing >= k:
        deviation = np.abs(values - np.median(values))
        if deviation.sum() > 0 and np.sort(deviation)[-(k - 1) :].sum() > (
            (k - 1) / k * deviation.sum() * (1 + 1e-12)
        ):
            return "dominance"
    return None


@settings(max_examples=400, deadline=None)
@given(
    values=hnp.arrays(
        np.float64,
        st.integers(1, 60),
        elements=st.one_of(st.sampled_from([0.0, 1.0, 2.0]), st.floats(-1e3, 1e3, allow_nan=False)),
    ),
    k=st.integers(1, 6),
)
def test_column_rules_equal_their_plain_definitions(values, k):
    found = column_problem(values, k)
    kind = None if found is None else ("mode" if "most common" in found else "dominance")
    assert kind == plain_rules(values, k)


def test_an_indicator_of_one_patient_and_a_bump_are_refused_an_ordinary_column_is_not():
    rng = np.random.default_rng(1)
    age = rng.integers(30, 80, 300).astype(float)
    one = np.zeros(300)
    one[17] = 1.0
    bump = 1 / (1 + 1e6 * (age - age[17]) ** 2 + 1e6 * (np.arange(300) != 17))
    assert "most common" in column_problem(one, 3)
    assert "variation" in column_problem(bump, 3)
    assert column_problem(age, 3) is None
    assert column_problem((age >= 60).astype(float), 3) is None


@settings(max_examples=400, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.sampled_from([0.0, 1.0, -2.5, 7.0]),
            st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False),
        ),
        min_size=1,
        max_size=120,
    ),
    st.integers(1, 12),
)
def test_the_linear_time_rules_equal_the_rules_on_the_sorted_column(values, k):
    """The mode and dominance rules by selection give what they give on the fully sorted
    column (their definition) for any column and threshold."""
    column = np.asarray(values, dtype=np.float64)
    assert column_problem(column, k) == problem_of_sorted_column(np.sort(column), k)
