"""Counting-process Cox ``Surv(start, stop, event)`` and frequency-weighted Cox equal pooled fits.

Oracles, fitted to full convergence on the pooled rows:

* lifelines ``CoxTimeVaryingFitter`` (Efron; ``strata``, ``weights_col``) with
  ``fit_options={"precision": 1e-10}``, and ``CoxPHFitter(weights_col=...)``;
* statsmodels ``PHReg(stop, X, status, entry=start, strata=, ties=)``, polished
  by Newton steps on its own score and Hessian until the step is below 1e-13,
  standard errors from its Hessian there. PHReg counts a row as at risk at its
  own entry time (``entry <= t``); R and lifelines use ``start < t <= stop``. The
  entries passed to PHReg are therefore moved 1e-9 later, far below any gap
  between distinct times of these data, which gives R's risk sets exactly;
* for integer weights, the unweighted fit on the rows repeated ``w`` times.

Tolerance: 1e-6 absolute on every coefficient and standard error (``TOL``).
The federations are split over at least three sites, patients never split, and
every site applies the disclosure rules: ``OPEN`` is ``min_count=1``, which
keeps ``k_cell = 2`` (cells, cross-cells, patient-level mode and dominance, the
differencing guard over rows and patients).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lifelines import CoxPHFitter, CoxTimeVaryingFitter
from lifelines.datasets import load_rossi, load_stanford_heart_transplants
from statsmodels.duration.hazard_regression import PHReg

import fedstats
from fedstats.contract import codec
from fedstats.contract.design import DesignSpec
from fedstats.errors import (
    DisclosureError,
    FormulaError,
    InconsistentColumnError,
    MalformedRequestError,
    StudyConfigurationError,
)

TOL = 1e-6
OPEN = fedstats.DisclosurePolicy(min_count=1)
STANFORD = ["age", "year", "surgery", "transplant"]
ENTRY_SHIFT = 1e-9


def phreg_reference(stop, X, status, entry, strata, ties):
    """PHReg's estimate polished to convergence; bse from its Hessian there."""
    model = PHReg(stop, X, status=status, entry=entry + ENTRY_SHIFT, strata=strata, ties=ties)
    beta = np.asarray(model.fit().params, dtype=float)
    for _ in range(50):
        step = np.linalg.solve(model.hessian(beta), model.score(beta))
        beta = beta - step
        if np.max(np.abs(step)) < 1e-13:
            break
    return beta, np.sqrt(np.diag(np.linalg.inv(-model.hessian(beta))))


def assert_close(result, params, bse):
    assert np.max(np.abs(result.params.to_numpy() - np.asarray(params))) < TOL
    assert np.max(np.abs(result.bse.to_numpy() - np.asarray(bse))) < TOL


def by_patient(frame: pd.DataFrame, site: np.ndarray) -> dict[str, pd.DataFrame]:
    """Sites' frames indexed by patient (the ``id`` column), one row per interval."""
    return {f"s{k}": frame[site == k].set_index("id") for k in np.unique(site)}


@pytest.fixture(scope="module")
def stanford():
    """Stanford heart transplant data (Crowley & Hu, JASA 1977), counting-process form: 103
    patients, 172 intervals; ``transplant`` switches from 0 to 1 at the transplant. The
    patients are allocated to three sites at random (seed 0; 58, 59 and 55 intervals): only
    16 patients had prior bypass ``surgery``, and the split ``id % 3`` leaves a site where
    one of them holds most of that column (refused, see the test below)."""
    frame = load_stanford_heart_transplants()
    allocation = np.random.default_rng(0).permutation(frame["id"].max() + 1) % 3
    site = allocation[frame["id"].to_numpy()]
    return frame, site


def test_a_stanford_split_where_one_patient_dominates_surgery_is_refused(stanford):
    """With ``id % 3`` one patient holds most of a site's ``surgery`` column (their rows
    counted together): the patient-level dominance rule refuses the design."""
    frame, _ = stanford
    fed = fedstats.Federation.in_process(
        by_patient(frame, frame["id"].to_numpy() % 3), disclosure=OPEN
    )
    formula = "Surv(start, stop, event) ~ " + " + ".join(STANFORD)
    with pytest.raises(DisclosureError, match="'surgery' has fewer than 2 patients") as refused:
        fedstats.CoxPH(formula).fit(fed)
    assert refused.value.rule == "cells"


def test_stanford_heart_stratified_by_site_matches_lifelines_and_phreg(stanford):
    """R: coxph(Surv(start, stop, event) ~ age + year + surgery + transplant + strata(site)),
    three sites, cell rules on."""
    frame, site = stanford
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    formula = "Surv(start, stop, event) ~ " + " + ".join(STANFORD)
    efron = fedstats.CoxPH(formula, strata="site").fit(fed)
    assert efron.converged and list(efron.params.index) == STANFORD
    reference = CoxTimeVaryingFitter().fit(
        frame.assign(site=site),
        id_col="id",
        event_col="event",
        start_col="start",
        stop_col="stop",
        strata=["site"],
        fit_options={"precision": 1e-10},
    )
    assert_close(efron, reference.params_[STANFORD], reference.standard_errors_[STANFORD])
    assert abs(efron.llf - reference.log_likelihood_) < 1e-8
    X = frame[STANFORD].to_numpy(float)
    for ties in ("breslow", "efron"):
        fit = fedstats.CoxPH(formula, ties=ties).fit(fed)
        expected = phreg_reference(frame["stop"], X, frame["event"], frame["start"], site, ties)
        assert_close(fit, *expected)


@pytest.mark.parametrize("ties", ["breslow", "efron"])
def test_stanford_heart_pooled_baseline_on_every_distinct_time_matches_phreg(stanford, ties):
    """strata=None on a grid holding every distinct start and stop: the pooled fit."""
    frame, site = stanford
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    grid = np.unique(np.concatenate([frame["start"], frame["stop"]]))
    formula = "Surv(start, stop, event) ~ " + " + ".join(STANFORD)
    fit = fedstats.CoxPH(formula, strata=None, ties=ties, grid=grid[grid > 0]).fit(fed)
    X = frame[STANFORD].to_numpy(float)
    strata = np.zeros(len(frame))
    assert_close(
        fit, *phreg_reference(frame["stop"], X, frame["event"], frame["start"], strata, ties)
    )
    assert fit.events_used == frame["event"].sum()
    if ties == "efron":
        reference = CoxTimeVaryingFitter().fit(
            frame,
            id_col="id",
            event_col="event",
            start_col="start",
            stop_col="stop",
            fit_options={"precision": 1e-10},
        )
        assert_close(fit, reference.params_[STANFORD], reference.standard_errors_[STANFORD])


def delayed_entry(seed: int, n: int = 600) -> pd.DataFrame:
    """Synthetic left-truncated data with a time-varying covariate: a third of the patients
    are followed from 0, the others enter at a whole step in ``(0, 2)``; each has a binary
    ``dose`` that switches on at a random time (lowering the hazard), a covariate ``x`` and a
    level of ``g``; event times are exponential given the covariates, censored at 8. Times
    are whole steps of 0.05, so that events tie. (With every entry uniform on ``[0, 2)`` the
    patients followed from 0 who never switch were one or two at a site, a cell the
    differencing guard over late entries refuses.)"""
    rng = np.random.default_rng(seed)
    step = 0.05
    rows = []
    for pid in range(n):
        entry = max(0, int(rng.integers(-20, 40)))
        x, g = rng.normal(), int(rng.integers(0, 2))
        rate = 0.2 * np.exp(0.5 * x + 0.3 * g)
        switch = entry + 1 + int(rng.exponential(2.0) / step)
        end = entry + 1 + int(rng.exponential(1 / rate) / step)
        if switch < min(end, 160):  # dose from the switch on, at a lower hazard
            rows.append((pid, entry, switch, 0, x, g, 0))
            entry = switch
            end = switch + 1 + int(rng.exponential(1 / (rate * np.exp(-0.4))) / step)
            dose = 1
        else:
            dose = 0
        stop, event = (end, 1) if end < 160 else (160, 0)
        rows.append((pid, entry, stop, event, x, g, dose))
    frame = pd.DataFrame(rows, columns=["id", "start", "stop", "event", "x", "g", "dose"])
    frame[["start", "stop"]] = (frame[["start", "stop"]] * step).round(2)
    return frame


def test_delayed_entry_with_strata_columns_matches_phreg_and_lifelines():
    """strata=["g"] within four sites: PHReg strata (site, g); lifelines strata site and g."""
    frame = delayed_entry(1)
    site = frame["id"].to_numpy() % 4
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    formula = "Surv(start, stop, event) ~ x + dose"
    X = frame[["x", "dose"]].to_numpy(float)
    combined = site * 2 + frame["g"].to_numpy()
    for ties in ("breslow", "efron"):
        fit = fedstats.CoxPH(formula, strata=["g"], ties=ties).fit(fed)
        expected = phreg_reference(frame["stop"], X, frame["event"], frame["start"], combined, ties)
        assert_close(fit, *expected)
    reference = CoxTimeVaryingFitter().fit(
        frame.assign(site=site),
        id_col="id",
        event_col="event",
        start_col="start",
        stop_col="stop",
        strata=["site", "g"],
        fit_options={"precision": 1e-10},
    )
    assert_close(fit, reference.params_[["x", "dose"]], reference.standard_errors_[["x", "dose"]])


def test_a_site_where_one_patient_alone_has_no_late_entry_is_refused():
    """The patients with a row entering after 0 are a row set of the differencing guard: where
    every patient of a site but one has such a row (a later interval counts), that set and the
    design's patients differ by one patient, and the site refuses. Entries uniform on
    ``[0, 2)`` made such sites by chance, hence the third of patients followed from 0 in
    :func:`delayed_entry`."""
    frame = delayed_entry(1)
    site = frame["id"].to_numpy() % 4
    patient = frame.groupby("id")["start"].agg(["first", "size"])
    one_row_from_zero = patient.index[
        (patient.index % 4 == 0) & (patient["first"] == 0) & (patient["size"] == 1)
    ]
    moved = frame["id"].isin(one_row_from_zero[1:])  # all of them but one enter late
    frame.loc[moved, "start"] = frame.loc[moved, "stop"] / 2
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    with pytest.raises(DisclosureError, match="rows entering after 0") as refused:
        fedstats.CoxPH("Surv(start, stop, event) ~ x + dose").fit(fed)
    assert refused.value.site == "s0" and refused.value.rule == "differencing"


@pytest.mark.parametrize("ties", ["breslow", "efron"])
def test_delayed_entry_pooled_baseline_with_categorical_terms(ties):
    """strata=None with C(g) as a term, on every distinct time: PHReg without strata."""
    frame = delayed_entry(2, n=400)
    site = frame["id"].to_numpy() % 3
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    grid = np.unique(np.concatenate([frame["start"], frame["stop"]]))
    fit = fedstats.CoxPH(
        "Surv(start, stop, event) ~ x + dose + C(g)", strata=None, ties=ties, grid=grid[grid > 0]
    ).fit(fed)
    X = frame[["x", "dose", "g"]].to_numpy(float)
    expected = phreg_reference(
        frame["stop"], X, frame["event"], frame["start"], np.zeros(len(frame)), ties
    )
    assert_close(fit, *expected)
    assert list(fit.params.index) == ["x", "dose", "C(g)[T.1]"]


def test_a_coarser_grid_keeps_consecutive_intervals_consecutive_and_reports_lost_events():
    """On a coarse grid, starts and stops are coarsened alike: the fit equals the pooled fit of
    the coarsened rows (PHReg), rows between two grid points are dropped, and the result says
    how many events it used."""
    frame = delayed_entry(3, n=500)
    site = frame["id"].to_numpy() % 3
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    grid = np.arange(0.5, 8.01, 0.5)
    fit = fedstats.CoxPH(
        "Surv(start, stop, event) ~ x + dose", strata=None, ties="breslow", grid=grid
    ).fit(fed)
    ext = np.concatenate(([0.0], grid))
    start = ext[np.searchsorted(ext, frame["start"], side="left")]
    stop = ext[np.searchsorted(ext, frame["stop"], side="left")]
    kept = start < stop
    coarse = frame[kept]
    expected = phreg_reference(
        stop[kept],
        coarse[["x", "dose"]].to_numpy(float),
        coarse["event"],
        start[kept],
        np.zeros(kept.sum()),
        "breslow",
    )
    assert_close(fit, *expected)
    assert fit.events_used == coarse["event"].sum() < frame["event"].sum()


def test_start_zero_gives_the_surv_time_event_fit():
    """Surv(start, stop, event) with every start 0 is Surv(stop, event), stratified and pooled."""
    rossi = load_rossi().assign(start=0.0)
    site = np.arange(len(rossi)) % 3
    frames = {f"s{k}": rossi[site == k].reset_index(drop=True) for k in range(3)}
    fed = fedstats.Federation.in_process(frames, disclosure=OPEN)
    terms = " ~ fin + age + prio"
    grid = np.arange(1.0, 53.0)
    for strata, kwargs in (("site", {}), (None, {"grid": grid})):
        counting = fedstats.CoxPH("Surv(start, week, arrest)" + terms, strata=strata, **kwargs).fit(
            fed
        )
        plain = fedstats.CoxPH("Surv(week, arrest)" + terms, strata=strata, **kwargs).fit(fed)
        assert np.max(np.abs(counting.params - plain.params)) < 1e-12
        assert np.max(np.abs(counting.bse - plain.bse)) < 1e-12


# ------------------------------------------------------------------------- frequency weights
def expanded(frame: pd.DataFrame, weights: str) -> pd.DataFrame:
    return frame.loc[frame.index.repeat(frame[weights].to_numpy())]


@pytest.fixture(scope="module")
def weighted_rossi():
    rossi = load_rossi()
    rng = np.random.default_rng(7)
    return rossi.assign(w=rng.integers(1, 4, len(rossi)), start=0.0), np.arange(len(rossi)) % 3


def sites_of(frame: pd.DataFrame, site: np.ndarray) -> dict[str, pd.DataFrame]:
    return {f"s{k}": frame[site == k].reset_index(drop=True) for k in np.unique(site)}


@pytest.mark.parametrize("outcome", ["Surv(week, arrest)", "Surv(start, week, arrest)"])
def test_integer_weights_equal_the_fit_on_repeated_rows_with_breslow_ties(weighted_rossi, outcome):
    """Exact oracle: each row repeated w times, unweighted (stratified by site and pooled)."""
    frame, site = weighted_rossi
    weighted = fedstats.Federation.in_process(sites_of(frame, site), disclosure=OPEN)
    repeated_site = np.repeat(site, frame["w"])
    repeated = fedstats.Federation.in_process(
        sites_of(expanded(frame, "w"), repeated_site), disclosure=OPEN
    )
    formula = outcome + " ~ fin + age + prio + C(race)"
    for strata, kwargs in (("site", {}), (None, {"grid": np.arange(1.0, 53.0)})):
        fit = fedstats.CoxPH(formula, strata=strata, ties="breslow", weights="w", **kwargs).fit(
            weighted
        )
        oracle = fedstats.CoxPH(formula, strata=strata, ties="breslow", **kwargs).fit(repeated)
        assert_close(fit, oracle.params, oracle.bse)
        assert abs(fit.llf - oracle.llf) < 1e-8


def test_weighted_efron_matches_lifelines_weights_col(weighted_rossi):
    """R: coxph(Surv(week, arrest) ~ fin + age + prio + strata(site), weights = w)."""
    frame, site = weighted_rossi
    fed = fedstats.Federation.in_process(sites_of(frame, site), disclosure=OPEN)
    fit = fedstats.CoxPH("Surv(week, arrest) ~ fin + age + prio", weights="w").fit(fed)
    reference = CoxPHFitter().fit(
        frame[["week", "arrest", "fin", "age", "prio", "w"]].assign(site=site),
        "week",
        "arrest",
        weights_col="w",
        strata=["site"],
        fit_options={"precision": 1e-10},
    )
    names = ["fin", "age", "prio"]
    assert_close(fit, reference.params_[names], reference.standard_errors_[names])


def test_weighted_counting_process_efron_matches_lifelines_time_varying(stanford):
    """Weighted Surv(start, stop, event) with Efron ties, stratified by site and pooled, against
    CoxTimeVaryingFitter(weights_col=...)."""
    frame, site = stanford
    rng = np.random.default_rng(3)
    patient_weight = rng.integers(1, 4, frame["id"].max() + 1)
    frame = frame.assign(w=patient_weight[frame["id"]].astype(float))
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    formula = "Surv(start, stop, event) ~ " + " + ".join(STANFORD)
    fit = fedstats.CoxPH(formula, weights="w").fit(fed)
    reference = CoxTimeVaryingFitter().fit(
        frame.assign(site=site),
        id_col="id",
        event_col="event",
        start_col="start",
        stop_col="stop",
        strata=["site"],
        weights_col="w",
        fit_options={"precision": 1e-10},
    )
    assert_close(fit, reference.params_[STANFORD], reference.standard_errors_[STANFORD])
    grid = np.unique(np.concatenate([frame["start"], frame["stop"]]))
    pooled = fedstats.CoxPH(formula, strata=None, grid=grid[grid > 0], weights="w").fit(fed)
    reference = CoxTimeVaryingFitter().fit(
        frame,
        id_col="id",
        event_col="event",
        start_col="start",
        stop_col="stop",
        weights_col="w",
        fit_options={"precision": 1e-10},
    )
    assert_close(pooled, reference.params_[STANFORD], reference.standard_errors_[STANFORD])


def test_weighted_efron_equals_repeated_rows_when_events_weigh_one():
    """Efron's tie correction treats a weighted event row as one event of mean weight (R,
    lifelines), so repeating rows is its exact oracle where events weigh 1 and only the
    censored rows are weighted; delayed entry, strata by site."""
    frame = delayed_entry(4, n=500)
    rng = np.random.default_rng(5)
    frame["w"] = np.where(frame["event"] == 1, 1, rng.integers(1, 4, len(frame)))
    site = frame["id"].to_numpy() % 3
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    big = expanded(frame.reset_index(drop=True), "w")
    repeated = fedstats.Federation.in_process(
        {f"s{k}": big[big["id"] % 3 == k].reset_index(drop=True) for k in range(3)},
        disclosure=OPEN,
    )
    formula = "Surv(start, stop, event) ~ x + dose"
    fit = fedstats.CoxPH(formula, weights="w").fit(fed)
    oracle = fedstats.CoxPH(formula).fit(repeated)
    assert_close(fit, oracle.params, oracle.bse)


# ------------------------------------------------------------------------- input and options
def one_site(frame: pd.DataFrame, n_sites: int = 3) -> fedstats.Federation:
    site = np.arange(len(frame)) % n_sites
    return fedstats.Federation.in_process(sites_of(frame, site), disclosure=OPEN)


@pytest.mark.parametrize(
    ("change", "column", "text"),
    [
        (lambda f: f.assign(start=f["stop"]), "start", "rows whose start is not before"),
        (lambda f: f.assign(start=-1.0), "start", "not finite numbers >= 0"),
        (lambda f: f.assign(start=np.inf), "start", "not finite numbers >= 0"),
    ],
)
def test_bad_intervals_are_refused_naming_site_column_and_count(change, column, text):
    frame = change(delayed_entry(6, n=60).drop(columns="id"))
    with pytest.raises(InconsistentColumnError) as raised:
        fedstats.CoxPH("Surv(start, stop, event) ~ x").fit(one_site(frame))
    message = str(raised.value)
    assert column in message and text in message and "'s0'" in message
    rows_at_s0 = len(frame[np.arange(len(frame)) % 3 == 0])
    assert f"has {rows_at_s0} " in message  # every row of the site is bad


def test_overlapping_intervals_of_one_patient_are_refused():
    frame = delayed_entry(7, n=90)
    frame.loc[frame.index[1], "start"] = 0.0  # some patient's rows overlap once ids repeat
    overlapping = pd.concat([frame, frame.iloc[[0]].assign(start=0.01)])
    with pytest.raises(InconsistentColumnError, match="overlap an earlier interval"):
        fedstats.CoxPH("Surv(start, stop, event) ~ x").fit(
            fedstats.Federation.in_process(
                {
                    "a": overlapping.set_index("id"),
                    "b": frame.set_index("id"),
                    "c": frame.set_index("id"),
                },
                disclosure=OPEN,
            )
        )


def test_a_column_named_twice_in_surv_is_a_formula_error():
    with pytest.raises(FormulaError, match="names one column twice"):
        fedstats.CoxPH("Surv(stop, stop, event) ~ x").fit(one_site(delayed_entry(8, n=60)))


def test_options_that_read_one_row_as_one_patient_refuse_the_counting_form(stanford):
    frame, site = stanford
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    formula = "Surv(start, stop, event) ~ age + transplant"
    with pytest.raises(StudyConfigurationError, match="robust"):
        fedstats.CoxPH(formula, robust=True)
    with pytest.raises(StudyConfigurationError, match="robust"):
        fedstats.CoxPH(formula, cluster="surgery")
    with pytest.raises(StudyConfigurationError, match="private Cox fit"):
        fedstats.CoxPH(formula, strata=None, grid=[100.0, 500.0]).fit(
            fed, privacy=fedstats.RecordDP(epsilon=2.0, rounds=5, bounds={"age": (-30, 30)})
        )
    fit = fedstats.CoxPH(formula).fit(fed)
    with pytest.raises(StudyConfigurationError, match="Harrell"):
        fedstats.concordance_index(fit, fed)
    with pytest.raises(StudyConfigurationError, match="robust"):
        fedstats.CoxPH("Surv(week, arrest) ~ fin", weights="w", robust=True)


@pytest.mark.parametrize("task", ["cox.concordance", "cox.robust", "cox.piecewise_summaries"])
def test_sites_refuse_one_row_per_patient_tasks_for_the_counting_form(stanford, task):
    """A coordinator that skips the model's checks meets the site's own."""
    frame, site = stanford
    fed = fedstats.Federation.in_process(by_patient(frame, site), disclosure=OPEN)
    fit = fedstats.CoxPH("Surv(start, stop, event) ~ age + transplant").fit(fed)
    args = {
        "design": fit.design,
        "beta": fit.params.to_numpy(),
        "cluster": None,
        "grid": np.array([100.0, 500.0]),
        "dp": {"noise_multipliers": {}},
    }
    silo = fedstats.Silo("s0", by_patient(frame, site)["s0"], policy=OPEN)
    reply = codec.decode(silo.handle(codec.encode({"task": task, "args": args})))
    assert reply["status"] == "error"
    assert reply["error"]["type"] == MalformedRequestError.__name__
    assert "one row as one patient" in reply["error"]["values"]["reason"]


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.floats(-5, 20), st.sampled_from([np.inf, -np.inf])),
            st.floats(0.01, 20),
        ),
        min_size=12,
        max_size=12,
    )
)
def test_any_start_column_is_answered_or_refused_with_the_count_of_bad_rows(intervals):
    """Start and stop columns read from a site's frame, whatever they hold: the site builds the
    design when every start is finite, >= 0 and before its stop, and otherwise refuses with an
    InconsistentColumnError naming the column and how many rows are bad."""
    start, stop = (np.array(v, dtype=float) for v in zip(*intervals, strict=True))
    frame = pd.DataFrame({"start": start, "stop": stop, "event": [0, 1] * 6, "x": np.arange(12.0)})
    spec = DesignSpec(
        formula="Surv(start, stop, event) ~ x",
        outcome="Surv(start, stop, event)",
        variables=("event", "start", "stop", "x"),
        levels={},
        columns=("x",),
        site_intercepts=False,
        sites=("s",),
        outcome_kind="survival",
    )
    silo = fedstats.Silo("s", frame, policy=OPEN)
    reply = codec.decode(
        silo.handle(codec.encode({"task": "prepare", "args": {"design": spec.to_wire()}}))
    )
    not_a_time = ~np.isfinite(start) | (start < 0)
    if not_a_time.any():
        assert reply["error"]["type"] == "InconsistentColumnError"
        assert reply["error"]["values"]["column"] == "start"
        assert f"has {int(not_a_time.sum())} " in reply["error"]["values"]["reason"]
    elif (start >= stop).any():
        assert reply["error"]["type"] == "InconsistentColumnError"
        assert f"has {int((start >= stop).sum())} rows" in reply["error"]["values"]["reason"]
    elif 0 < int((start > 0).sum()) < OPEN.k_cell or 0 < int((start == 0).sum()) < OPEN.k_cell:
        # the rows entering late (or at 0) would differ from every row on fewer than k_cell
        # rows: the differencing guard refuses the design (fedstats.site.differencing)
        assert reply["error"]["values"]["rule"] == "differencing"
    else:
        assert reply["status"] == "ok" and reply["result"]["n_obs"] == 12


def test_the_readme_example_runs_as_printed():
    """The README's "Time-varying covariates and delayed entry" example, executed."""
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    section = text.split("### Time-varying covariates and delayed entry", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    hazard = namespace["cox"].hazard_ratios()
    assert list(hazard.index) == ["age", "year", "surgery", "transplant"]
