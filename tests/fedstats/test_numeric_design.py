"""A design of numeric terms only is taken from the values, and equals formulaic's byte for byte.

:func:`fedstats.contract.design_matrix.right_hand_side` skips formulaic's model matrix
when every term is one numeric factor (formulaic lays the design out from stand-in
numbers). The oracle is formulaic itself: the model frame of the same values
(:func:`fedstats.contract.design.model_frame`), column by column and as the site's whole
design (every array of :class:`~fedstats.site.handlers.design.SiteDesign`), on formulas
in any order, without an intercept, with ``I()`` and functions, and with integer columns.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fedstats
from fedstats.contract import design_matrix
from fedstats.contract.design import model_frame, parse_formula
from fedstats.contract.design_matrix import NumericColumns, right_hand_side
from fedstats.site.handlers.design import build_design
from fedstats.site.silo import Silo

NAMES = ["age", "bmi", "dose", "x_1", "count"]


def values_of(parsed, frame: pd.DataFrame) -> dict:
    """Each factor's values, as the site computes them (columns, or its own evaluator)."""
    from fedstats.contract.formula_grammar import evaluate

    out = {}
    for factor in parsed.factors:
        if factor.kind == "expression":
            out[factor.name] = evaluate(factor, {v: frame[v] for v in factor.variables})
        else:
            out[factor.name] = frame[factor.column].to_numpy()
    return out


@st.composite
def numeric_designs(draw):
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    frame = pd.DataFrame(
        {
            "age": rng.normal(50, 10, n),
            "bmi": rng.uniform(15, 40, n),
            "dose": rng.integers(0, 5, n),  # an integer column
            "x_1": rng.normal(size=n).astype(np.float32),
            "count": rng.integers(1, 9, n).astype(np.int32),
            "y": rng.integers(0, 2, n),
        }
    )
    terms = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=5, unique=True))
    extra = draw(
        st.lists(
            st.sampled_from(["I(age ** 2)", "log(bmi)", "I(dose * 2)", "sqrt(count)"]),
            max_size=2,
            unique=True,
        )
    )
    intercept = draw(st.sampled_from(["", " - 1", " + 0"]))
    formula = "y ~ " + " + ".join(terms + extra) + intercept
    return formula, frame


@given(numeric_designs())
def test_a_numeric_design_is_formulaics_model_matrix(case):
    formula, frame = case
    try:
        parsed = parse_formula(formula)
    except fedstats.errors.FormulaError:
        return  # a spelling the grammar refuses is no design
    values = values_of(parsed, frame)
    fast = right_hand_side(parsed, values, len(frame))
    full = model_frame(parsed, values, len(frame))[0]
    assert isinstance(fast, NumericColumns)
    assert list(fast.columns) == list(full.columns)
    for name in full.columns:
        ours = np.asarray(fast[name], dtype=np.float64)
        assert ours.tobytes() == full[name].to_numpy(dtype=np.float64).tobytes(), name


@pytest.mark.parametrize(
    ("formula", "column"),
    [
        ("y ~ age + flag", "flag"),  # booleans are levels to formulaic
        ("y ~ age + C(dose)", None),  # categorical
        ("y ~ age + age:bmi", None),  # an interaction: a term of two factors
        ("y ~ age * bmi", None),
    ],
)
def test_designs_that_are_not_numeric_columns_go_to_formulaic(formula, column):
    frame = pd.DataFrame({"age": [1.0, 2, 3, 4], "bmi": [2.0, 1, 4, 3], "dose": [1, 2, 1, 2],
                          "flag": [True, False, True, True], "y": [0, 1, 0, 1]})  # fmt: skip
    parsed = parse_formula(formula)
    values = values_of(parsed, frame)
    if "C(dose)" in formula:
        values["C(dose)"] = pd.Categorical(frame["dose"], categories=[1, 2])
    assert isinstance(right_hand_side(parsed, values, 4), pd.DataFrame)


def test_a_missing_value_is_left_to_formulaic_to_refuse():
    parsed = parse_formula("y ~ age + bmi")
    values = {"age": np.array([1.0, np.nan, 3.0]), "bmi": np.array([1.0, 2.0, 3.0])}
    with pytest.raises(fedstats.errors.FormulaError):
        right_hand_side(parsed, values, 3)


@pytest.mark.parametrize(
    "formula",
    ["y ~ age + bmi + dose", "y ~ bmi + I(age ** 2) + log(bmi) - 1", "y ~ dose + age"],
)
def test_the_site_design_equals_the_one_formulaic_builds(formula, monkeypatch):
    """Every array of the site's design (X, outcome, rows) with the numeric path and with
    formulaic forced, byte for byte."""
    rng = np.random.default_rng(3)
    n = 400
    frame = pd.DataFrame({"age": rng.normal(50, 10, n), "bmi": rng.uniform(15, 40, n),
                          "dose": rng.integers(0, 5, n), "y": rng.integers(0, 2, n)})  # fmt: skip
    federation = fedstats.Federation.in_process({"a": frame, "b": frame.copy()})
    spec = fedstats.LogisticRegression(formula).agree(federation, "layout").spec
    fast = build_design(Silo("a", frame)._context, spec)
    monkeypatch.setattr(
        design_matrix, "numeric_layout", lambda formula: None
    )  # formulaic for every design
    full = build_design(Silo("a", frame)._context, spec)
    assert fast.X.tobytes() == full.X.tobytes()
    assert fast.X.shape == full.X.shape == (n, len(spec.columns))
    for field in ("y", "rows"):
        assert getattr(fast, field).tobytes() == getattr(full, field).tobytes()
