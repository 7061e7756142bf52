"""Bad input gives a typed error naming the site and the column, never a bare traceback."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.errors import (
    ConvergenceWarning,
    FormulaError,
    InconsistentColumnError,
    MissingColumnError,
    MissingValuesError,
    NoEventsError,
    NonBinaryOutcomeError,
    PerfectSeparationError,
    SeparationWarning,
    UnknownLevelError,
)


def site(n: int, seed: int, **extra) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame(
        {
            "age": rng.normal(60, 10, n).round(),
            "sex": rng.integers(0, 2, n),
            "stage": rng.choice(["I", "II", "III"], n),
            "y": (rng.random(n) < 0.4).astype(int),
        }
    )
    for key, value in extra.items():
        df[key] = value
    return df


def federation(**overrides: pd.DataFrame) -> fedstats.Federation:
    frames = {"north": site(120, 1), "south": site(150, 2), "east": site(90, 3)}
    frames.update(overrides)
    return fedstats.Federation.in_process(frames)


FORMULA = "y ~ age + sex + C(stage)"


def test_missing_column_names_site_and_column():
    fed = federation(south=site(150, 2).drop(columns="age"))
    with pytest.raises(MissingColumnError) as info:
        fedstats.LogisticRegression(FORMULA).fit(fed)
    assert (info.value.site, info.value.column) == ("south", "age")
    assert "harmonise" in str(info.value)


def test_non_binary_outcome_names_site_column_and_count():
    bad = site(90, 3)
    bad.loc[:4, "y"] = 2
    fed = federation(east=bad)
    with pytest.raises(NonBinaryOutcomeError) as info:
        fedstats.LogisticRegression(FORMULA).fit(fed)
    assert (info.value.site, info.value.column, info.value.count) == ("east", "y", 5)


def test_nan_in_covariate_names_site_column_and_count():
    bad = site(120, 1)
    bad.loc[[3, 7, 11, 20, 30, 40], "age"] = np.nan
    fed = federation(north=bad)
    with pytest.raises(MissingValuesError) as info:
        fedstats.LogisticRegression(FORMULA).fit(fed)
    assert (info.value.site, info.value.column, info.value.count) == ("north", "age", 6)
    assert "6 missing value(s)" in str(info.value)


def test_a_count_below_the_cell_threshold_is_withheld_from_the_error():
    """An error reply passes the small-cell rule too: 2 missing values (< k_cell 3) are 'a few'."""
    bad = site(120, 1)
    bad.loc[[3, 7], "age"] = np.nan
    fed = federation(north=bad)
    with pytest.raises(MissingValuesError) as info:
        fedstats.LogisticRegression(FORMULA).fit(fed)
    assert (info.value.site, info.value.column, info.value.count) == ("north", "age", None)
    assert "2 missing" not in str(info.value)
    assert "fewer than the site's small-cell" in str(info.value)


def test_missing_drop_fits_complete_cases_and_reports_the_count():
    bad = site(120, 1)
    bad.loc[[3, 7, 11], "age"] = np.nan
    fed = federation(north=bad)
    result = fedstats.LogisticRegression(FORMULA, missing="drop").fit(fed)
    assert result.provenance.n_dropped == {"north": 3, "south": 0, "east": 0}
    assert result.n_obs_by_site["north"] == 117
    assert any("dropped" in note for note in result.notes)


def test_level_unknown_to_the_agreed_levels_names_site_column_and_level():
    fed = federation()
    with pytest.raises(UnknownLevelError) as info:
        fedstats.LogisticRegression(FORMULA, levels={"stage": ["I", "II"]}).fit(fed)
    assert info.value.column == "stage" and info.value.level == "III"
    assert info.value.site in {"north", "south", "east"}


def test_levels_missing_at_one_site_still_give_the_agreed_design():
    only_two = site(90, 3)
    only_two["stage"] = np.where(only_two["stage"] == "III", "II", only_two["stage"])
    fed = federation(east=only_two)
    result = fedstats.LogisticRegression(FORMULA).fit(fed)
    assert list(result.params.index) == [
        "Intercept",
        "age",
        "sex",
        "C(stage)[T.II]",
        "C(stage)[T.III]",
    ]


def test_site_with_no_events_is_refused():
    none = site(90, 3).assign(y=0)
    fed = federation(east=none)
    with pytest.raises(NoEventsError) as info:
        fedstats.LogisticRegression(FORMULA).fit(fed)
    assert (info.value.site, info.value.column) == ("east", "y")
    assert "disclose every patient's outcome" in str(info.value)


def test_site_where_everyone_has_the_event_is_refused():
    fed = federation(east=site(90, 3).assign(y=1))
    with pytest.raises(NoEventsError, match="'y' = 1"):
        fedstats.LogisticRegression(FORMULA).fit(fed)


def test_column_typed_differently_across_sites():
    fed = federation(south=site(150, 2).assign(sex=lambda d: d["sex"].map({0: "F", 1: "M"})))
    with pytest.raises(InconsistentColumnError, match="'sex'"):
        fedstats.LogisticRegression(FORMULA).fit(fed)


def test_stateful_transform_is_refused_before_any_site_fits():
    fed = federation()
    with pytest.raises(FormulaError, match="stateful"):
        fedstats.LogisticRegression("y ~ center(age) + sex").fit(fed)


@pytest.mark.parametrize("formula", ["y age", "y + sex ~ age", "y ~ age +"])
def test_malformed_formula(formula):
    with pytest.raises(FormulaError):
        fedstats.LogisticRegression(formula).fit(federation())


def test_collinear_design_names_the_columns():
    frames = {
        n: f.assign(age2=2 * f["age"])
        for n, f in {"north": site(120, 1), "south": site(150, 2)}.items()
    }
    fed = fedstats.Federation.in_process(frames)
    with pytest.raises(FormulaError, match=r"age.*age2.*collinear"):
        fedstats.LogisticRegression("y ~ age + age2").fit(fed)


def test_perfect_separation_raises():
    frames = {}
    for i, name in enumerate(["a", "b"]):
        df = site(80, i)
        df["y"] = (df["age"] > 60).astype(int)
        frames[name] = df
    fed = fedstats.Federation.in_process(frames)
    with pytest.raises(PerfectSeparationError, match="perfect separation"):
        fedstats.LogisticRegression("y ~ age").fit(fed)


def test_quasi_complete_separation_warns_and_is_not_converged():
    frames = {}
    for i, name in enumerate(["a", "b"]):
        df = site(80, i)
        df["flag"] = (np.arange(80) < 12).astype(int)
        df.loc[df["flag"] == 1, "y"] = 1  # flag = 1 always has the event
        frames[name] = df
    fed = fedstats.Federation.in_process(frames)
    with pytest.warns(SeparationWarning, match="flag"):
        result = fedstats.LogisticRegression("y ~ age + flag").fit(fed)
    assert not result.converged
    assert result.params["flag"] > 10


def test_non_convergence_warns():
    fed = federation()
    with pytest.warns(ConvergenceWarning, match="did not converge in 2 rounds"):
        result = fedstats.LogisticRegression(FORMULA, maxiter=2).fit(fed)
    assert not result.converged and "NO" in result.summary()


def test_converged_fit_emits_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fedstats.LogisticRegression(FORMULA).fit(federation()).converged


@pytest.mark.parametrize("bad", [{"maxiter": 0}, {"tol": 0.0}, {"missing": "ignore"}])
def test_bad_options_are_refused(bad):
    with pytest.raises(fedstats.StudyConfigurationError):
        fedstats.LogisticRegression(FORMULA, **bad).fit(federation())


def test_fit_needs_a_federation():
    with pytest.raises(fedstats.StudyConfigurationError, match="Federation"):
        fedstats.LogisticRegression(FORMULA).fit(site(100, 1))


def test_frames_must_be_dataframes():
    with pytest.raises(fedstats.StudyConfigurationError, match="site 'x'"):
        fedstats.Federation.in_process({"x": np.zeros((3, 3))})
