"""Federated competing risks equal pooled references: Aalen–Johansen vs lifelines'
``AalenJohansenFitter``; Fine–Gray vs a weighted Cox fit (lifelines'
``CoxTimeVaryingFitter``) of the pooled rows R's ``survival::finegray()`` expands to."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from lifelines import AalenJohansenFitter, CoxPHFitter, CoxTimeVaryingFitter, KaplanMeierFitter
from lifelines.datasets import load_canadian_senators

import fedstats
from fedstats.errors import StatusCodeError
from fedstats.site.handlers.competing import status_codes

OPEN = fedstats.DisclosurePolicy(min_count=1)


def split(frame: pd.DataFrame, site: np.ndarray) -> dict[str, pd.DataFrame]:
    return {
        f"s{k}": part.drop(columns="_site").reset_index(drop=True)
        for k, part in frame.assign(_site=site).groupby("_site")
    }


def synthetic(seed: int, n: int = 400) -> pd.DataFrame:
    """Two causes whose hazards depend on ``x`` and ``arm``, independent censoring; times on a
    0.01 lattice, so tied times occur."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    arm = rng.choice(["a", "b", "c"], n)
    shift = np.select([arm == "b", arm == "c"], [0.4, -0.3], 0.0)
    t1 = rng.exponential(1 / (0.08 * np.exp(0.6 * x + shift)))
    t2 = rng.exponential(1 / (0.06 * np.exp(-0.4 * x)))
    c = rng.uniform(2, 25, n)
    time = np.minimum.reduce([t1, t2, c])
    status = np.select([time == t1, time == t2], [1, 2], 0)
    return pd.DataFrame({"t": np.round(time, 2) + 0.01, "status": status, "x": x, "arm": arm})


def untied(frame: pd.DataFrame) -> pd.DataFrame:
    """Keep the first row of every follow-up time: lifelines' Aalen–Johansen jitters times
    shared by events of different causes, so the reference data have none."""
    return frame.drop_duplicates("t").reset_index(drop=True)


def senators() -> pd.DataFrame:
    """Canadian senators (lifelines' dataset, 1867 on): years in office until death (cause 1),
    resignation or retirement (cause 2), or still in office (0, censored). Appointments
    declined (3) and zero-day terms are left out. Sites: four regions."""
    raw = load_canadian_senators()
    raw = raw[(raw["reason"] != "Appointment declined") & (raw["diff_days"] > 0)]
    status = np.select([~raw["observed"], raw["reason"] == "Death"], [0, 1], 2)
    province = raw["Province / Territory"]
    region = np.select(
        [province == "Quebec", province == "Ontario",
         province.isin(["Nova Scotia", "New Brunswick", "Prince Edward Island",
                        "Newfoundland and Labrador"])],
        [0, 1, 2], 3,
    )  # fmt: skip
    appointed = pd.to_datetime(raw["start_date"]).dt.year
    return pd.DataFrame(
        {
            "years": raw["diff_days"].to_numpy() / 365.25,
            "status": status,
            "liberal": raw["Political Affiliation at Appointment"]
            .str.contains("Liberal Party")
            .astype(float)
            .to_numpy(),
            "decade": (appointed.to_numpy() - 1900) / 10.0,
            "region": region,
        }
    )


# ----------------------------------------------------------------- Aalen–Johansen


@pytest.mark.parametrize("cause", [1, 2])
def test_aalen_johansen_equals_lifelines_estimate_variance_and_interval(cause):
    """Reference: ``AalenJohansenFitter(calculate_variance=True).fit(t, status,
    event_of_interest=cause)`` on the pooled rows (no tied times, so no jitter)."""
    frame = untied(synthetic(seed=3))
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.CumulativeIncidence("t", "status", cause=cause, grid=grid).fit(fed)
    reference = AalenJohansenFitter(calculate_variance=True).fit(
        frame["t"], frame["status"], event_of_interest=cause
    )
    at = lambda series: series.reindex(grid, method="ffill").to_numpy()  # noqa: E731
    estimate = at(reference.cumulative_density_.iloc[:, 0])
    assert np.max(np.abs(result.cumulative_incidence_["all"].to_numpy() - estimate)) <= 1e-8
    variance = reference.variance_.copy()
    variance.index = reference.cumulative_density_.index
    assert np.max(np.abs(result.variance_["all"].to_numpy() - at(variance))) <= 1e-8
    bounds = reference.confidence_interval_
    lower, upper = at(bounds.min(axis=1)), at(bounds.max(axis=1))
    positive = estimate > 0
    assert (
        np.max(np.abs(result.confidence_interval_["lower"]["all"].to_numpy() - lower)[positive])
        <= 1e-8
    )
    assert (
        np.max(np.abs(result.confidence_interval_["upper"]["all"].to_numpy() - upper)[positive])
        <= 1e-8
    )


def test_grouped_incidence_equals_lifelines_per_group():
    frame = untied(synthetic(seed=5))
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 4), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.CumulativeIncidence("t", "status", cause=1, group="arm", grid=grid).fit(fed)
    assert list(result.cumulative_incidence_.columns) == ["a", "b", "c"]
    for arm in ("a", "b", "c"):
        rows = frame[frame["arm"] == arm]
        reference = AalenJohansenFitter().fit(rows["t"], rows["status"], event_of_interest=1)
        expected = reference.cumulative_density_.iloc[:, 0].reindex(grid, method="ffill")
        got = result.cumulative_incidence_[arm].to_numpy()
        known = ~np.isnan(got)
        assert known[: np.searchsorted(grid, rows["t"].max())].all()
        assert np.max(np.abs(got[known] - expected.to_numpy()[known])) <= 1e-8
    table = result.event_table
    assert table[("b", "events")].sum() == ((frame["arm"] == "b") & (frame["status"] == 1)).sum()
    assert "Aalen-Johansen" in result.summary()


def test_incidence_of_both_causes_and_survival_add_to_one():
    """``F_1 + F_2 + S = 1`` at every grid time: the estimator's defining identity, checked
    against lifelines' Kaplan–Meier of any event on a coarse grid."""
    frame = synthetic(seed=8)
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    curves = [
        fedstats.CumulativeIncidence("t", "status", cause=c, width=1, horizon=20).fit(fed)
        for c in (1, 2)
    ]
    grid = curves[0].grid
    coarse = grid[np.minimum(np.searchsorted(grid, frame["t"], side="left"), len(grid) - 1)]
    beyond = frame["t"].to_numpy() > grid[-1]
    died = (frame["status"].to_numpy() > 0) & ~beyond
    survival = KaplanMeierFitter().fit(coarse, died).survival_function_at_times(grid).to_numpy()
    total = sum(c.cumulative_incidence_["all"].to_numpy() for c in curves) + survival
    assert np.max(np.abs(total - 1)) <= 1e-12


# ----------------------------------------------------------------- Fine–Gray reference


def finegray_rows(frame: pd.DataFrame, time: str, status: str, cause: int) -> pd.DataFrame:
    """The counting-process rows of R's ``survival::finegray()`` for ``cause``.

    ``G`` is lifelines' Kaplan–Meier of the censoring times, with the event times moved
    just before themselves (R's convention: censorings at a time follow its events). A
    patient with a competing event at ``T`` keeps a row ``(0, T]`` and, for every later event
    time ``tau`` of the cause, a row ``(previous, tau]`` of weight ``G(tau-) / G(T-)``.
    """
    t, s = frame[time].to_numpy(), frame[status].to_numpy()
    km = KaplanMeierFitter().fit(t - 1e-7 * (s > 0), event_observed=(s == 0))
    G_before = lambda values: km.survival_function_at_times(values - 1e-6).to_numpy()  # noqa: E731
    cause_times = np.unique(t[s == cause])
    rows = []
    for i, row in enumerate(frame.to_dict("records")):
        rows.append({**row, "id": i, "start": 0.0, "stop": t[i],
                     "event": float(s[i] == cause), "w": 1.0})  # fmt: skip
        if s[i] > 0 and s[i] != cause:
            later = cause_times[cause_times > t[i]]
            if len(later):
                weights = G_before(later) / G_before(np.array([t[i]]))[0]
                starts = np.r_[t[i], later[:-1]]
                for a, b, w in zip(starts, later, weights, strict=True):
                    rows.append({**row, "id": i, "start": a, "stop": b, "event": 0.0, "w": w})
    return pd.DataFrame(rows)


def weighted_cox(rows: pd.DataFrame, covariates: list[str]) -> CoxTimeVaryingFitter:
    """lifelines' ``CoxTimeVaryingFitter`` (Efron ties) on weighted (start, stop] rows."""
    fitter = CoxTimeVaryingFitter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter.fit(
            rows[["id", "start", "stop", "event", "w", *covariates]],
            id_col="id",
            event_col="event",
            start_col="start",
            stop_col="stop",
            weights_col="w",
            fit_options={"precision": 1e-12},
        )
    return fitter


def test_fine_gray_equals_weighted_cox_on_finegray_rows_synthetic():
    """Reference (R): ``fg <- finegray(Surv(t, factor(status)) ~ ., data, etype = "1")``;
    ``coxph(Surv(fgstart, fgstop, fgstatus) ~ x + arm, weights = fgwt, data = fg)``, here
    with the rows built as ``finegray()`` does and fitted by lifelines."""
    frame = synthetic(seed=11)
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.FineGray(
        "Surv(t, status) ~ x + C(arm)", cause=1, grid=grid, convention="finegray"
    ).fit(fed)
    rows = finegray_rows(frame, "t", "status", cause=1)
    rows = rows.assign(arm_b=(rows["arm"] == "b") * 1.0, arm_c=(rows["arm"] == "c") * 1.0)
    reference = weighted_cox(rows, ["x", "arm_b", "arm_c"])
    expected = reference.params_.to_numpy()
    assert result.converged
    assert np.max(np.abs(result.params.to_numpy() - expected)) <= 1e-6
    ratios = result.subdistribution_hazard_ratios()
    assert np.allclose(ratios["hazard_ratio"], np.exp(expected), rtol=1e-5)
    assert "robust (sandwich)" in result.summary()
    model_based = fedstats.FineGray(
        "Surv(t, status) ~ x + C(arm)", cause=1, grid=grid, robust=False, convention="finegray"
    ).fit(fed)
    assert (
        np.max(np.abs(model_based.bse.to_numpy() - reference.standard_errors_.to_numpy())) <= 1e-6
    )
    assert "model-based" in model_based.summary()


def test_fine_gray_breslow_equals_reference_without_ties():
    """Without tied event times Breslow's and Efron's partial likelihoods coincide."""
    frame = untied(synthetic(seed=12, n=300))
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.FineGray(
        "Surv(t, status) ~ x", cause=2, grid=grid, ties="breslow", convention="finegray"
    ).fit(fed)
    expected = weighted_cox(finegray_rows(frame, "t", "status", cause=2), ["x"]).params_.to_numpy()
    assert np.max(np.abs(result.params.to_numpy() - expected)) <= 1e-6


@pytest.mark.parametrize("cause", [1, 2])
def test_fine_gray_equals_weighted_cox_on_canadian_senators(cause):
    """Real data: the Canadian senate, four regions as sites; tied times of different
    causes are kept (Efron ties on both sides)."""
    frame = senators()
    fed = fedstats.Federation.in_process(split(frame, frame["region"].to_numpy()), disclosure=OPEN)
    grid = np.sort(frame["years"].unique())
    result = fedstats.FineGray(
        "Surv(years, status) ~ liberal + decade", cause=cause, grid=grid, convention="finegray"
    ).fit(fed)
    rows = finegray_rows(frame, "years", "status", cause)
    expected = weighted_cox(rows, ["liberal", "decade"]).params_.to_numpy()
    assert np.max(np.abs(result.params.to_numpy() - expected)) <= 1e-6


def lin_wei_sandwich(rows: pd.DataFrame, beta: np.ndarray, covariates: list[str]) -> np.ndarray:
    """The robust covariance of a weighted Breslow Cox fit on (start, stop] rows clustered by
    ``id``, from its textbook definition (Lin & Wei, JASA 1989; Therneau & Grambsch, 2000,
    section 7.2), event time by event time: ``V (sum_i U_i U_i') V`` with ``U_i`` the sum over
    patient ``i``'s rows of ``w_r [dN_r - Y_r r_r dLambda] (x_r - xbar)``. R's ``coxph(...,
    weights = fgwt, cluster = id)`` on ``finegray()`` rows reports it; lifelines' robust
    errors ignore the rows' delayed entry, so they cannot serve here."""
    X = rows[covariates].to_numpy()
    start, stop = rows["start"].to_numpy(), rows["stop"].to_numpy()
    event, w = rows["event"].to_numpy() > 0, rows["w"].to_numpy()
    risk = np.exp(X @ beta)
    U = np.zeros_like(X)
    information = np.zeros((X.shape[1], X.shape[1]))
    for tau in np.unique(stop[event]):
        at_risk = (start < tau) & (tau <= stop)
        weight = (w * risk)[at_risk]
        S0, S1 = weight.sum(), weight @ X[at_risk]
        S2 = (X[at_risk] * weight[:, None]).T @ X[at_risk]
        dying = event & (stop == tau)
        mean, hazard = S1 / S0, w[dying].sum() / S0
        information += w[dying].sum() * (S2 / S0 - np.outer(mean, mean))
        U[dying] += X[dying] - mean
        U[at_risk] -= risk[at_risk, None] * hazard * (X[at_risk] - mean)
    clustered = pd.DataFrame(U * w[:, None]).groupby(rows["id"].to_numpy()).sum().to_numpy()
    V = np.linalg.inv(information)
    return V @ clustered.T @ clustered @ V


@pytest.mark.parametrize("cause", [1, 2])
def test_fine_gray_robust_covariance_equals_the_sandwich_on_finegray_rows(cause):
    frame = untied(synthetic(seed=12, n=300))
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.FineGray(
        "Surv(t, status) ~ x + C(arm)", cause=cause, grid=grid, convention="finegray"
    ).fit(fed)
    rows = finegray_rows(frame, "t", "status", cause)
    rows = rows.assign(arm_b=(rows["arm"] == "b") * 1.0, arm_c=(rows["arm"] == "c") * 1.0)
    expected = lin_wei_sandwich(rows, result.params.to_numpy(), ["x", "arm_b", "arm_c"])
    assert np.max(np.abs(result.cov_params().to_numpy() - expected)) <= 1e-8


def test_fine_gray_robust_errors_equal_lifelines_without_competing_events():
    """Without competing events Fine–Gray is Cox's model: reference ``CoxPHFitter(robust=True)``
    (lifelines' sandwich over patients; no ties, so Efron's and Breslow's agree)."""
    frame = untied(synthetic(seed=21, n=300))
    frame["status"] = np.minimum(frame["status"], 1)
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=grid).fit(fed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = CoxPHFitter().fit(
            frame[["t", "status", "x"]], "t", "status", robust=True,
            fit_options={"precision": 1e-12},
        )  # fmt: skip
    assert np.max(np.abs(result.params.to_numpy() - reference.params_.to_numpy())) <= 1e-6
    assert np.max(np.abs(result.bse.to_numpy() - reference.standard_errors_.to_numpy())) <= 1e-6


def test_fine_gray_on_a_coarse_grid_equals_the_reference_on_coarsened_times():
    """Times are coarsened up to the next grid point (those after the last point are censored
    there); Efron's ties on both sides."""
    frame = synthetic(seed=13)
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    result = fedstats.FineGray(
        "Surv(t, status) ~ x", cause=1, width=2, horizon=20, convention="finegray"
    ).fit(fed)
    grid = result.grid
    point = np.searchsorted(grid, frame["t"], side="left")
    coarse = frame.assign(
        t=grid[np.minimum(point, len(grid) - 1)],
        status=np.where(point >= len(grid), 0, frame["status"]),
    )
    rows = finegray_rows(coarse, "t", "status", cause=1)
    reference = weighted_cox(rows, ["x"])
    assert np.max(np.abs(result.params.to_numpy() - reference.params_.to_numpy())) <= 1e-6


def test_fine_gray_with_missing_covariates_drops_the_same_rows_as_the_reference():
    frame = synthetic(seed=14)
    frame.loc[frame.index % 17 == 0, "x"] = np.nan
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    result = fedstats.FineGray(
        "Surv(t, status) ~ x", cause=2, grid=grid, missing="drop", convention="finegray"
    ).fit(fed)
    complete = frame.dropna().reset_index(drop=True)
    reference = weighted_cox(finegray_rows(complete, "t", "status", cause=2), ["x"])
    assert np.max(np.abs(result.params.to_numpy() - reference.params_.to_numpy())) <= 1e-6
    assert sum(result.provenance.n_dropped.values()) == frame["x"].isna().sum()
    assert "complete cases" in result.summary()


@settings(max_examples=60, deadline=None)
@given(
    values=st.lists(
        st.one_of(
            st.integers(-3, 5),
            st.floats(allow_nan=True, allow_infinity=True, width=32),
            st.sampled_from(["1", "x", None, True]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_status_codes_are_read_or_refused_with_the_count_of_bad_values(values):
    """Whatever a site's status column holds: its codes (missing kept missing), or a typed
    error counting exactly the present values that are not non-negative integers."""
    column = pd.Series(values, dtype=object)
    present = [v for v in values if v is not None and not (isinstance(v, float) and np.isnan(v))]

    def valid(v) -> bool:
        try:
            number = float(v)
        except ValueError:
            return False
        return np.isfinite(number) and number >= 0 and number == int(number)

    bad = sum(not valid(v) for v in present)
    if bad:
        with pytest.raises(StatusCodeError) as raised:
            status_codes("site", "status", column)
        assert raised.value.count == bad and raised.value.column == "status"
    else:
        codes = status_codes("site", "status", column)
        assert np.array_equal(np.isnan(codes), column.isna().to_numpy())
        assert np.array_equal(codes[~np.isnan(codes)], [float(v) for v in present])


def test_secure_aggregation_gives_the_same_curves_and_fit():
    frame = synthetic(seed=15)
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    model = fedstats.CumulativeIncidence("t", "status", cause=2, group="arm", grid=grid)
    clear, hidden = model.fit(fed), model.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    pd.testing.assert_frame_equal(hidden.event_table, clear.event_table, check_dtype=False)
    pd.testing.assert_frame_equal(hidden.cumulative_incidence_, clear.cumulative_incidence_)
    assert hidden.n_obs == {"all sites": len(frame)} and "secure aggregation" in hidden.summary()
    fine_gray = fedstats.FineGray("Surv(t, status) ~ x + C(arm)", cause=1, grid=grid)
    clear_fit = fine_gray.fit(fed)
    hidden_fit = fine_gray.fit(fed, secure_aggregation=fedstats.SecureAggregation())
    assert np.max(np.abs(hidden_fit.params - clear_fit.params)) <= 1e-9
    assert np.max(np.abs(hidden_fit.bse - clear_fit.bse)) <= 1e-9
    assert hidden_fit.provenance.n_obs == {"all sites": len(frame)}
