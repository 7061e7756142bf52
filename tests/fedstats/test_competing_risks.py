"""Federated competing risks equal pooled references: Aalen–Johansen vs lifelines'
``AalenJohansenFitter`` and, for Gray's variance, a pooled implementation of Gray (1988)
written here; Fine–Gray ``convention="finegray"`` vs a weighted Cox fit (lifelines'
``CoxTimeVaryingFitter``) of the pooled rows R's ``survival::finegray()`` expands to, and
``convention="crr"`` vs a pooled implementation of Fine & Gray (1999) as ``cmprsk::crr``
computes it, written here."""

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


def tied(seed: int = 31, n: int = 240) -> pd.DataFrame:
    """:func:`synthetic` with times rounded up to half units: many patients share a time,
    censorings share times with failures, and the causes share times."""
    frame = synthetic(seed=seed, n=n)
    return frame.assign(t=np.ceil(frame["t"] * 2) / 2)


def shared_times(frame: pd.DataFrame) -> dict[str, int]:
    """How many distinct times hold a censoring and a failure, and events of both causes."""
    at = frame.groupby("t")["status"]
    return {
        "censoring and failure": int(at.agg(lambda s: (s == 0).any() and (s > 0).any()).sum()),
        "both causes": int(at.agg(lambda s: (s == 1).any() and (s == 2).any()).sum()),
    }


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


def gray_reference(time: np.ndarray, status: np.ndarray, cause: int) -> tuple:
    """Gray's variance of the cumulative incidence (Gray, Ann Stat 1988), pooled, event time
    by event time: ``F(t) = sum_{t_j<=t} S(t_{j-1}) d_1j / n_j`` and ``Var F(t) = sum_{t_j<=t}
    [(F(t) - F_j)^2 (v_1j + v_2j) / (1 - h_j)^2 + S(t_{j-1})^2 v_1j - 2 (F(t) - F_j)
    S(t_{j-1}) v_1j / (1 - h_j)]``, ``h_j = (d_1j + d_2j) / n_j``, each cause's increment
    variance ``v_kj = d_kj (n_j - d_kj) / (n_j^2 (n_j - 1))`` (``d_kj / n_j^2`` when
    ``n_j = 1``). Returns the event times, ``F`` and ``Var F`` at them."""
    times = np.unique(time[status > 0])
    F, V, S, rows = 0.0, [], 1.0, []
    estimates = []
    for t in times:
        n = float(np.sum(time >= t))
        d1 = float(np.sum((time == t) & (status == cause)))
        d2 = float(np.sum((time == t) & (status > 0) & (status != cause)))
        v = [d / n**2 * ((n - d) / (n - 1) if n > 1 else 1.0) for d in (d1, d2)]
        left = 1 - (d1 + d2) / n
        F += S * d1 / n
        rows.append((F, S, v[0], v[0] + v[1], left))
        S *= left
        estimates.append(F)
        total = 0.0
        for Fj, Sj, v1, v12, lj in rows:
            g = F - Fj
            total += Sj**2 * v1
            if lj > 0:
                total += g**2 * v12 / lj**2 - 2 * g * Sj * v1 / lj
        V.append(total)
    return times, np.array(estimates), np.array(V)


@pytest.mark.parametrize("cause", [1, 2])
def test_gray_variance_equals_the_pooled_reference_with_tied_times(cause):
    """``gray_variance_`` (``cmprsk::cuminc``'s ``var``, checked live by ``test_r_oracle``)
    against :func:`gray_reference` on data with failures tied with censorings and across
    causes; every grid time, overall and per arm; ``variance="gray"`` puts it in the
    intervals and standard errors."""
    frame = tied()
    assert min(shared_times(frame).values()) >= 5
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    model = fedstats.CumulativeIncidence(
        "t", "status", cause=cause, group="arm", grid=grid, variance="gray"
    )
    result = model.fit(fed)
    for arm in ("a", "b", "c"):
        rows = frame[frame["arm"] == arm]
        times, F, V = gray_reference(rows["t"].to_numpy(), rows["status"].to_numpy(), cause)
        last = np.searchsorted(times, grid, side="right") - 1
        expected = np.where(last >= 0, V[np.maximum(last, 0)], 0.0)
        got = result.gray_variance_[arm].to_numpy()
        known = ~np.isnan(got)
        assert known[: np.searchsorted(grid, rows["t"].max()) + 1].all()
        assert np.max(np.abs(got[known] - expected[known])) <= 1e-10
        incidence = np.where(last >= 0, F[np.maximum(last, 0)], 0.0)
        assert np.max(np.abs(result.cumulative_incidence_[arm].to_numpy()[known] -
                             incidence[known])) <= 1e-12  # fmt: skip
    assert not np.allclose(result.gray_variance_, result.variance_, equal_nan=True)
    table = result.to_frame()
    assert np.allclose(table[("a", "std err")], np.sqrt(result.gray_variance_["a"]), equal_nan=True)
    assert "Gray's variance" in result.summary()
    delta = fedstats.CumulativeIncidence("t", "status", cause=cause, group="arm", grid=grid)
    assert "delta-method" in delta.fit(fed).summary()
    with pytest.raises(fedstats.errors.StudyConfigurationError, match="cmprsk::cuminc"):
        fedstats.CumulativeIncidence("t", "status", cause=cause, grid=grid, variance="aalen")


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


# ----------------------------------------------------------------- cmprsk::crr's conventions


def crr_reference(time: np.ndarray, status: np.ndarray, Z: np.ndarray, cause: int) -> dict:
    """``cmprsk::crr``'s estimate and standard errors, pooled, from Fine & Gray (JASA 1999).

    * ``G``: Kaplan–Meier of the censorings, the patients failing at a time still at risk
      of censoring then; patient ``j``'s weight at a failure time ``s`` is 1 while
      ``T_j >= s``, ``G(s-) / G(T_j-)`` after a competing event at ``T_j < s``, else 0;
    * Breslow's partial likelihood of the weighted risk sets, maximised by Newton's method;
    * the variance ``V (sum_i (eta_i + psi_i)(eta_i + psi_i)') V``, ``V`` the inverse
      information: ``eta_i = sum_s w_i(s) (Z_i - Zbar(s)) (dN_i(s) - r_i dLambda(s))`` and
      ``psi_i = sum_u q(u) / n(u) [I(T_i = u, censored) - I(T_i >= u) c(u) / n(u)]`` over
      the censoring times ``u``, ``q(u) = sum_{s >= u} sum_{j: T_j < u, competing} w_j(s) r_j
      (Z_j - Zbar(s)) dLambda(s)`` (the paper's ``I(s >= u > X_j)``).
    """
    n_patients, p = Z.shape
    censored, failed = status == 0, status == cause
    competing = (status > 0) & ~failed
    times = np.unique(time)
    at_risk = np.array([np.sum(time >= u) for u in times])
    censorings = np.array([np.sum(censored & (time == u)) for u in times])
    G = np.cumprod(1 - censorings / at_risk)

    def G_before(t: np.ndarray | float) -> np.ndarray:
        return np.r_[1.0, G][np.searchsorted(times, t, side="left")]

    failure_times = np.unique(time[failed])
    W = np.array([np.where(time >= s, 1.0, np.where(competing & (time < s),
                                                     G_before(s) / G_before(time), 0.0))
                  for s in failure_times])  # fmt: skip
    d = np.array([np.sum(failed & (time == s)) for s in failure_times])

    def sums(beta):
        r = np.exp(Z @ beta)
        S0, S1 = W @ r, (W * r) @ Z
        S2 = np.einsum("si,i,ij,ik->sjk", W, r, Z, Z)
        mean = S1 / S0[:, None]
        score = Z[failed].sum(axis=0) - d @ mean
        information = np.einsum(
            "s,sjk->jk", d, S2 / S0[:, None, None] - mean[:, :, None] * mean[:, None, :]
        )
        return r, S0, mean, score, information

    beta = np.zeros(p)
    for _ in range(100):
        step = np.linalg.solve(sums(beta)[4], sums(beta)[3])
        beta = beta + step
        if np.max(np.abs(step)) < 1e-14:
            break
    r, S0, mean, _, information = sums(beta)
    V = np.linalg.inv(information)
    dLambda = d / S0
    eta = np.zeros((n_patients, p))
    for k, s in enumerate(failure_times):
        dN = (failed & (time == s)).astype(float)
        eta += (W[k] * (dN - r * dLambda[k]))[:, None] * (Z - mean[k])
    psi = np.zeros((n_patients, p))
    for u, n_u, c_u in zip(times, at_risk, censorings, strict=True):
        if c_u == 0:
            continue
        before = competing & (time < u)
        q = np.zeros(p)
        for k, s in enumerate(failure_times):
            if s >= u:
                q += ((W[k] * r * before)[:, None] * (Z - mean[k])).sum(axis=0) * dLambda[k]
        dM = (censored & (time == u)).astype(float) - (time >= u) * c_u / n_u
        psi += np.outer(dM, q / n_u)
    U = eta + psi
    return {
        "params": beta,
        "bse": np.sqrt(np.diag(V @ U.T @ U @ V)),
        "model_bse": np.sqrt(np.diag(V)),
    }


@pytest.mark.parametrize("cause", [1, 2])
def test_fine_gray_equals_crr_conventions_with_tied_times(cause):
    """The default ``convention="crr"`` against :func:`crr_reference` (``cmprsk::crr`` itself
    in ``test_r_oracle``) on data whose failures tie with censorings and across causes,
    three sites, a grid of every distinct time: coefficients, ``crr``'s standard errors and
    the model-based ones. ``convention="finegray"`` differs on these data (its censoring
    curve and Efron's ties), and without the censoring term the errors differ too."""
    frame = tied()
    assert min(shared_times(frame).values()) >= 5
    fed = fedstats.Federation.in_process(split(frame, np.arange(len(frame)) % 3), disclosure=OPEN)
    grid = np.sort(frame["t"].unique())
    formula = "Surv(t, status) ~ x + C(arm)"
    Z = np.column_stack([frame["x"], frame["arm"] == "b", frame["arm"] == "c"]).astype(float)
    expected = crr_reference(frame["t"].to_numpy(), frame["status"].to_numpy(), Z, cause)
    result = fedstats.FineGray(formula, cause=cause, grid=grid).fit(fed)
    assert result.convention == "crr" and result.ties == "breslow"
    assert np.max(np.abs(result.params.to_numpy() - expected["params"])) <= 1e-8
    assert np.max(np.abs(result.bse.to_numpy() - expected["bse"])) <= 1e-8
    assert "cmprsk::crr" in result.summary()
    model_based = fedstats.FineGray(formula, cause=cause, grid=grid, robust=False).fit(fed)
    assert np.max(np.abs(model_based.bse.to_numpy() - expected["model_bse"])) <= 1e-8
    other = fedstats.FineGray(formula, cause=cause, grid=grid, convention="finegray").fit(fed)
    assert np.max(np.abs(other.params.to_numpy() - expected["params"])) > 1e-4
    assert not np.allclose(result.bse, model_based.bse, rtol=1e-3)


def test_the_crr_convention_has_breslow_ties_only():
    with pytest.raises(fedstats.errors.StudyConfigurationError, match="Breslow"):
        fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=[1.0], ties="efron")
    with pytest.raises(fedstats.errors.StudyConfigurationError, match="cmprsk::crr"):
        fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=[1.0], convention="cmprsk")
    assert fedstats.FineGray("Surv(t, status) ~ x", cause=1, grid=[1.0],
                             convention="finegray").ties == "efron"  # fmt: skip


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
