"""What a coordinator could learn through a GLM's new arguments, and the sites' refusals.

The attacks:

* **weights as a row selector** — a 0/1 column as frequency weights sums over
  a subset exactly as an indicator term would: a subset below ``k`` rows, or
  one that differs from an earlier population by a few rows, gives those
  patients' values by subtraction;
* **a dominating weight** — one row weighted 1,000 times makes every sum
  that row's value up to a small remainder;
* **weights in a private release** — the noise is calibrated to rows that
  count once; a weight multiplies one patient's influence past it;
* **an unbounded outcome in a private release** — a Poisson count or a
  Gaussian measurement has no bound, so no sensitivity;
* **a crafted measurement** — a "continuous outcome" that is a constant
  except for one patient makes the score that patient's value;
* **another family on the same design** — the request's family must match
  the outcome kind the site checked;
* **a protocol's family, weights and exposure** — an approved Poisson model
  is not a licence for another family, weighting or exposure.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
import statsmodels.formula.api as smf
from hypothesis import given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.errors import (
    DisclosureError,
    InconsistentColumnError,
    MalformedRequestError,
    NoEventsError,
    ProtocolError,
    StudyConfigurationError,
)
from fedstats.site.protocol import Protocol
from fedstats.site.weights import frequency_weights

K = fedstats.DisclosurePolicy().k_cell


def frame(n: int = 400, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    data = pd.DataFrame(
        {
            "age": rng.normal(60, 10, n).round(1),
            "smoker": rng.integers(0, 2, n),
            "years": rng.uniform(0.5, 6.0, n).round(2),
            "ones": np.ones(n),
        }
    )
    data["cases"] = rng.poisson(0.2 * data.years * np.exp(0.3 * data.smoker))
    data["sbp"] = (120 + 0.4 * data.age + rng.normal(0, 10, n)).round(1)
    return data


def federation(data: pd.DataFrame, **kwargs) -> fedstats.Federation:
    return fedstats.Federation.in_process({"s": data}, **kwargs)


def test_weights_that_select_fewer_than_k_rows_are_refused():
    data = frame()
    data["picked"] = 0
    data.loc[[3, 7], "picked"] = 1
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("sbp ~ age", family="gaussian", weights="picked").fit(federation(data))
    assert info.value.rule == "cells" and "picked > 0" in info.value.reason


def test_a_weight_that_dominates_the_sums_is_refused():
    data = frame()
    data["w"] = 1.0
    data.loc[11, "w"] = 1000.0
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("sbp ~ age", family="gaussian", weights="w").fit(federation(data))
    assert info.value.rule == "cells" and "of the total weight" in info.value.reason


def test_weights_that_drop_one_patient_from_an_answered_population_are_refused():
    data = frame()
    data["all_but_one"] = 1
    data.loc[42, "all_but_one"] = 0
    fed = federation(data, disclosure=fedstats.DisclosurePolicy(k_cell=K))
    fedstats.GLM("sbp ~ age", family="gaussian").fit(fed)
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("sbp ~ age", family="gaussian", weights="all_but_one").fit(fed)
    assert info.value.rule in ("differencing", "cells")


def private_args(spec: fedstats.DesignSpec) -> dict:
    return {
        "design": spec.to_wire(),
        "dp": {
            "noise_multipliers": {"n_obs": 1.0},
            "study": "study",
            "analysis": "a",
            "note": "",
        },
    }


@pytest.mark.parametrize(
    ("model", "why"),
    [
        (fedstats.GLM("sbp ~ age", family="gaussian"), "no bound"),
        (fedstats.GLM("cases ~ age", family="poisson"), "no bound"),
        (fedstats.GLM("smoker ~ age", family="binomial", weights="years"), "frequency weights"),
    ],
)
def test_a_private_release_of_an_unbounded_or_weighted_design_is_refused(model, why):
    data = frame()
    spec = model.agree(federation(data), "a").spec
    private = federation(data, disclosure=fedstats.DisclosurePolicy(require_privacy=True))
    with pytest.raises(DisclosureError) as info:
        private.request("prepare", private_args(spec), analysis="a")
    assert why in info.value.reason


def test_private_fits_of_unbounded_outcomes_or_weights_are_refused_at_the_coordinator():
    fed = federation(frame())
    privacy = fedstats.RecordDP(epsilon=1.0, rounds=2, bounds={"age": (20, 100)})
    with pytest.raises(StudyConfigurationError, match="no bound"):
        fedstats.GLM("cases ~ age", family="poisson").fit(fed, privacy=privacy)
    with pytest.raises(StudyConfigurationError, match="weights"):
        fedstats.GLM("smoker ~ age", family="binomial", weights="years").fit(fed, privacy=privacy)


def test_a_measurement_that_singles_out_one_patient_is_refused():
    data = frame()
    data["spike"] = 0.0
    data.loc[17, "spike"] = 183.0
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("spike ~ age", family="gaussian").fit(federation(data))
    assert info.value.rule == "cells" and "spike" in info.value.reason


def test_a_family_other_than_the_designs_outcome_kind_is_refused():
    data = frame()
    fed = federation(data)
    spec = fedstats.GLM("sbp ~ age", family="gaussian").agree(fed, "a").spec
    args = {"design": spec.to_wire(), "beta": np.zeros(2), "family": "poisson"}
    with pytest.raises(MalformedRequestError, match="needs a count outcome"):
        fed.request("glm.summaries", args, analysis="a")


def test_a_count_outcome_that_is_zero_for_everyone_at_a_site_is_refused():
    data = frame().assign(cases=0)
    with pytest.raises(NoEventsError):
        fedstats.GLM("cases ~ age", family="poisson").fit(federation(data))


def test_a_bad_exposure_names_the_site_column_and_count():
    data = frame()
    data.loc[[1, 2, 3], "years"] = 0.0
    with pytest.raises(InconsistentColumnError) as info:
        fedstats.GLM("cases ~ age", family="poisson", exposure="years").fit(federation(data))
    assert info.value.site == "s" and info.value.column == "years"
    assert "3 exposures" in str(info.value)


PROTOCOL = {
    "title": "Infection rates",
    "analysis": [
        {
            "name": "rates",
            "model": "glm",
            "family": "poisson",
            "formula": "cases ~ age + smoker",
            "exposure": "years",
        }
    ],
}


@pytest.mark.parametrize(
    ("model", "term"),
    [
        (fedstats.GLM("cases ~ age + smoker", family="gaussian", exposure=None), "gaussian"),
        (fedstats.GLM("cases ~ age + smoker", family="poisson"), "None"),
        (
            fedstats.GLM(
                "cases ~ age + smoker", family="poisson", exposure="years", weights="ones"
            ),
            "ones",
        ),
    ],
)
def test_the_protocol_fixes_a_glms_family_exposure_and_weights(model, term):
    data = frame()
    protocol = Protocol.from_mapping(PROTOCOL)
    fed = federation(data, protocols={"s": protocol})
    approved = fedstats.GLM("cases ~ age + smoker", family="poisson", exposure="years").fit(fed)
    assert approved.converged
    with pytest.raises(ProtocolError) as info:
        model.fit(federation(data, protocols={"s": protocol}))
    assert info.value.term == term


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.floats(allow_nan=True, allow_infinity=True),
            st.integers(-5, 10**6),
            st.booleans(),
            st.text(max_size=4),
            st.none(),
        ),
        min_size=1,
        max_size=30,
    )
)
def test_any_weights_column_is_read_or_refused_by_name(values):
    try:
        weights = frequency_weights("s", pd.Series(values, dtype=object, name="w"), "w")
    except InconsistentColumnError as error:
        assert error.site == "s" and error.column == "w"
    else:
        assert np.isfinite(weights).all() and (weights >= 0).all() and (weights > 0).any()


def test_coefficients_that_make_one_row_dominate_a_poisson_reply_are_refused():
    """With beta large on age, exp(x'beta) of the oldest patient dwarfs the rest: the score's
    ratio to its intercept entry would be that patient's age. (The dominance rule, behind the
    path rule: sites that verify paths refuse these coefficients first, as
    tests/security/test_verified_paths.py shows.)"""
    data = frame()
    fed = federation(data, verified_paths=False)
    spec = fedstats.GLM("cases ~ age + smoker", family="poisson").agree(fed, "a").spec
    oldest = float(data.age.max())
    beta = np.array([30.0 - 50.0 * oldest, 50.0, 0.0])
    args = {"design": spec.to_wire(), "beta": beta, "family": "poisson"}
    with pytest.raises(DisclosureError) as info:
        fed.request("glm.summaries", args, analysis="a")
    assert info.value.rule == "dominance"
    # had they been answered, these coefficients would give the oldest patient's age
    mu = np.exp(beta[0] + beta[1] * data.age)
    score = np.array([np.sum(data.cases - mu), np.sum(data.age * (data.cases - mu))])
    assert score[1] / score[0] == pytest.approx(oldest, rel=1e-6)


@pytest.mark.parametrize("role", ["offset", "exposure"])
def test_an_offset_or_exposure_that_singles_out_one_row_is_refused(role):
    data = frame()
    data["spiked"] = 1.0
    data.loc[9, "spiked"] = 1e6
    data["log_spiked"] = np.log(data["spiked"])
    column = "log_spiked" if role == "offset" else "spiked"
    with pytest.raises(DisclosureError) as info:
        fedstats.GLM("cases ~ age", family="poisson", **{role: column}).fit(federation(data))
    assert info.value.rule == "cells"


def test_a_trial_step_a_site_refuses_as_dominated_is_halved(monkeypatch):
    """The coordinator's side of the dominance rule: a trial point refused with rule
    ``dominance`` (an overshooting step) is halved like one that lowers the likelihood, and
    the fit still equals statsmodels'."""
    from fedstats.site.handlers import glm as glm_site

    data = frame()
    real, calls = glm_site.check_fitted_dominance, []

    def refuse_the_third(ctx, fitted):  # the first trial of a Newton step
        calls.append(1)
        if len(calls) == 3:
            raise DisclosureError(site=ctx.name, task=None, reason="dominated", rule="dominance")
        real(ctx, fitted)

    monkeypatch.setattr(glm_site, "check_fitted_dominance", refuse_the_third)
    fed = federation(data)
    result = fedstats.GLM("cases ~ age + smoker", family="poisson", exposure="years").fit(fed)
    model = smf.glm(
        "cases ~ age + smoker", data, family=sm.families.Poisson(), exposure=data["years"]
    )
    reference = model.fit(start_params=model.fit(tol=1e-13).params, tol=1e-13)
    assert result.converged
    assert np.max(np.abs(result.params - reference.params[result.params.index])) < 1e-8
    assert [r.status for r in fed.inventory.records() if r.status != "ok"] == ["refused"]
