"""Weighted and stratified federated log-rank tests equal lifelines and statsmodels on the
pooled rows.

Every federation here spans at least three sites, on a grid holding every distinct
follow-up time and with a permissive disclosure policy (a threshold of 1), so the grid
counts are the pooled data's. The oracles:

* lifelines ``multivariate_logrank_test(T, G, E, weightings=..., p=..., q=...)`` -- the
  unstratified tests, Fleming–Harrington with ``q != 0`` included (lifelines has no
  stratified log-rank test);
* statsmodels ``survdiff(T, E, G, weight_type=None | "gb" | "tw" | "fh", strata=...,
  fh_p=...)`` -- stratified tests (statsmodels' Fleming–Harrington has ``q = 0`` only).

``min_count=1`` gives ``k_cell = 2``: with frequency weights no row may carry more than
half of a released weighted count (the dominance rule), so a grid of every raw lung time,
where most deaths are one row, ends the weighted counts at the first such death. The
frequency-weighted tests therefore recode the follow-up times globally to a coarse grid
(:func:`on_grid`, the same times for the sites and the oracle) and hold fewer sites.
"""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from lifelines.datasets import load_lung, load_rossi
from lifelines.statistics import multivariate_logrank_test
from statsmodels.duration.survfunc import survdiff

import fedstats
from fedstats import datasets
from fedstats.models import logrank

OPEN = fedstats.DisclosurePolicy(min_count=1)
TOLERANCE = 1e-8

WEIGHTINGS = [
    (None, {}),
    ("wilcoxon", {}),
    ("tarone-ware", {}),
    ("fleming-harrington", {"p": 1.0, "q": 0.0}),
    ("fleming-harrington", {"p": 0.0, "q": 1.0}),
    ("fleming-harrington", {"p": 1.0, "q": 1.0}),
    ("fleming-harrington", {"p": 0.5, "q": 2.0}),
]
STATSMODELS = [
    (None, {}, {}),
    ("wilcoxon", {}, {"weight_type": "gb"}),
    ("tarone-ware", {}, {"weight_type": "tw"}),
    ("fleming-harrington", {"p": 1.0}, {"weight_type": "fh", "fh_p": 1.0}),
    ("fleming-harrington", {"p": 2.5, "q": 0.0}, {"weight_type": "fh", "fh_p": 2.5}),
]


def split(frame: pd.DataFrame, sites: int) -> dict[str, pd.DataFrame]:
    site = np.arange(len(frame)) % sites
    return {
        f"s{k}": part.drop(columns="_site").reset_index(drop=True)
        for k, part in frame.assign(_site=site).groupby("_site")
    }


def every_time(frame: pd.DataFrame, time: str) -> np.ndarray:
    return np.sort(frame[time].unique()).astype(float)


LUNG_GRID = np.array([129.0, 204.0, 346.0, 605.0])
"""Days: the 22.5%, 45%, 67.5% and 90% quantiles of the lung data's death times, rounded up."""


def on_grid(frame: pd.DataFrame, grid: np.ndarray) -> pd.DataFrame:
    """The lung rows with each follow-up time recoded to the next point of ``grid`` and
    follow-up beyond the last point censored there: the coarsening a site applies, done once
    on the pooled data, so ``grid`` holds every distinct time of the recoded rows."""
    point = np.searchsorted(grid, frame.time, side="left")
    beyond = point >= len(grid)
    return frame.assign(
        time=grid[np.minimum(point, len(grid) - 1)], status=np.where(beyond, 0, frame.status)
    )


@pytest.fixture(scope="module")
def rossi() -> pd.DataFrame:
    frame = load_rossi()
    frame["prio_band"] = np.select([frame.prio == 0, frame.prio <= 2], ["none", "few"], "many")
    return frame


@pytest.fixture(scope="module")
def lung() -> pd.DataFrame:
    """NCCTG lung cancer (lifelines' copy of R's ``survival::lung``), censoring throughout."""
    frame = load_lung().dropna(subset=["ph.ecog"]).reset_index(drop=True)
    frame["ecog"] = frame["ph.ecog"].clip(upper=2).astype(int)  # 0, 1, 2+ (one patient had 3)
    return frame[["time", "status", "sex", "ecog"]]


@pytest.fixture(scope="module")
def tcga() -> tuple[dict[str, pd.DataFrame], pd.DataFrame]:
    """TCGA-BRCA's six regions, the natural silos of the FLamby benchmark."""
    frames = {
        name: frame[["time", "event", "prior_malignancy_yes", "race_white"]]
        for name, frame in datasets.tcga_brca().frames.items()
    }
    return frames, pd.concat(frames.values(), ignore_index=True)


@pytest.mark.parametrize(("weighting", "exponents"), WEIGHTINGS)
@pytest.mark.parametrize("group", ["fin", "prio_band"])
def test_weighted_logrank_equals_lifelines_on_rossi(rossi, group, weighting, exponents):
    """lifelines: ``multivariate_logrank_test(week, group, arrest, weightings, p, q)``."""
    fed = fedstats.Federation.in_process(split(rossi, 4), disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "week", "arrest", group, grid=every_time(rossi, "week"), weightings=weighting,
        **exponents,
    )  # fmt: skip
    reference = multivariate_logrank_test(
        rossi.week, rossi[group], rossi.arrest, weightings=weighting, **exponents
    )
    assert abs(result.statistic - reference.test_statistic) <= TOLERANCE
    assert abs(result.p_value - reference.p_value) <= TOLERANCE
    assert result.dof == rossi[group].nunique() - 1
    assert result.observed.sum() == rossi.arrest.sum()


@pytest.mark.parametrize(("weighting", "exponents"), WEIGHTINGS)
def test_weighted_logrank_equals_lifelines_on_lung_with_censoring(lung, weighting, exponents):
    """lifelines, three ECOG groups of the lung data over three sites; censoring between
    deaths makes S(t-) differ from the number at risk, so each weighting is its own test."""
    fed = fedstats.Federation.in_process(split(lung, 3), disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "time", "status", "ecog", grid=every_time(lung, "time"), weightings=weighting,
        **exponents,
    )  # fmt: skip
    reference = multivariate_logrank_test(
        lung.time, lung.ecog, lung.status, weightings=weighting, **exponents
    )
    assert abs(result.statistic - reference.test_statistic) <= TOLERANCE


def test_the_weightings_are_different_tests(lung):
    """Guard against a weighting silently ignored: the statistics differ from each other."""
    fed = fedstats.Federation.in_process(split(lung, 3), disclosure=OPEN)
    grid = every_time(lung, "time")
    statistics = [
        fedstats.logrank_test(fed, "time", "status", "ecog", grid=grid, weightings=w, **e).statistic
        for w, e in WEIGHTINGS
    ]
    assert len({round(s, 6) for s in statistics}) == len(WEIGHTINGS)


@pytest.mark.parametrize(("weighting", "exponents", "reference_weight"), STATSMODELS)
@pytest.mark.parametrize("strata", [None, "race", ["race", "wexp"]])
def test_stratified_logrank_equals_statsmodels_on_rossi(
    rossi, strata, weighting, exponents, reference_weight
):
    """statsmodels: ``survdiff(week, arrest, fin, weight_type, strata=race x wexp, fh_p)``."""
    fed = fedstats.Federation.in_process(split(rossi, 4), disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "week", "arrest", "fin", grid=every_time(rossi, "week"), strata=strata,
        weightings=weighting, **exponents,
    )  # fmt: skip
    columns = [] if strata is None else [strata] if isinstance(strata, str) else strata
    labels = rossi[columns].astype(str).agg("/".join, axis=1) if columns else None
    chisq, p_value = survdiff(
        rossi.week, rossi.arrest, rossi.fin, strata=labels, **reference_weight
    )
    assert abs(result.statistic - chisq) <= TOLERANCE
    assert abs(result.p_value - p_value) <= TOLERANCE
    assert result.strata == tuple(columns)


@pytest.mark.parametrize(("weighting", "exponents", "reference_weight"), STATSMODELS)
def test_stratified_logrank_equals_statsmodels_on_tcga_regions(
    tcga, weighting, exponents, reference_weight
):
    """Six real sites (TCGA-BRCA regions); a stratum (race) spans sites, so its counts add
    across them. statsmodels: ``survdiff(time, event, prior_malignancy, strata=race_white)``."""
    frames, pooled = tcga
    fed = fedstats.Federation.in_process(frames, disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "time", "event", "prior_malignancy_yes", grid=every_time(pooled, "time"),
        strata="race_white", weightings=weighting, **exponents,
    )  # fmt: skip
    chisq, _ = survdiff(
        pooled.time, pooled.event, pooled.prior_malignancy_yes, strata=pooled.race_white,
        **reference_weight,
    )  # fmt: skip
    assert abs(result.statistic - chisq) <= TOLERANCE


def synthetic_sites(seed: int) -> dict[str, pd.DataFrame]:
    """Three sites, three arms, two centres' worth of strata with their own baseline hazards."""
    rng = np.random.default_rng(seed)
    frames = {}
    for site, n in (("a", 300), ("b", 220), ("c", 150)):
        arm = rng.choice(["x", "y", "z"], n)
        stage = rng.choice(["early", "late"], n, p=[0.6, 0.4])
        scale = np.where(stage == "late", 200.0, 600.0) * np.where(arm == "z", 1.4, 1.0)
        event_time = np.ceil(rng.exponential(scale))
        censor = np.ceil(rng.uniform(50, 900, n))
        frames[site] = pd.DataFrame(
            {
                "days": np.minimum(event_time, censor),
                "died": (event_time <= censor).astype(int),
                "arm": arm,
                "stage": stage,
            }
        )
    return frames


@pytest.mark.parametrize(("weighting", "exponents", "reference_weight"), STATSMODELS)
def test_stratified_three_arms_equal_statsmodels_on_synthetic_sites(
    weighting, exponents, reference_weight
):
    frames = synthetic_sites(19)
    pooled = pd.concat(frames.values(), ignore_index=True)
    fed = fedstats.Federation.in_process(frames, disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "days", "died", "arm", grid=every_time(pooled, "days"), strata="stage",
        weightings=weighting, **exponents,
    )  # fmt: skip
    chisq, _ = survdiff(pooled.days, pooled.died, pooled.arm, strata=pooled.stage,
                        **reference_weight)  # fmt: skip
    assert abs(result.statistic - chisq) <= TOLERANCE
    assert result.dof == 2
    # the stratified test is not the unstratified one: stage confounds nothing here, but
    # its baseline hazards differ, so the two statistics differ
    plain = fedstats.logrank_test(fed, "days", "died", "arm", grid=every_time(pooled, "days"))
    assert abs(plain.statistic - result.statistic) > 1e-3


@pytest.mark.parametrize(("weighting", "exponents"), WEIGHTINGS)
def test_frequency_weighted_logrank_equals_lifelines_on_expanded_rows(lung, weighting, exponents):
    """Frequency weights: the test of the rows repeated ``w`` times (lifelines on the
    expanded rows: its own ``weights=`` leaves Fleming–Harrington's S unweighted). Two
    sites, follow-up recoded to :data:`LUNG_GRID` (three sites, or a finer grid, end the
    women's weighted counts early at a site)."""
    rng = np.random.default_rng(23)
    weighted = on_grid(lung.assign(w=rng.integers(1, 5, len(lung))), LUNG_GRID)
    fed = fedstats.Federation.in_process(split(weighted, 2), disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "time", "status", "sex", grid=every_time(weighted, "time"), weights="w",
        weightings=weighting, **exponents,
    )  # fmt: skip
    expanded = weighted.loc[weighted.index.repeat(weighted.w)]
    reference = multivariate_logrank_test(
        expanded.time, expanded.sex, expanded.status, weightings=weighting, **exponents
    )
    assert abs(result.statistic - reference.test_statistic) <= TOLERANCE
    assert result.observed.sum() == (weighted.w * weighted.status).sum()
    assert result.weights == "w"


def test_frequency_weighted_stratified_logrank_equals_statsmodels_on_expanded_rows(lung):
    """statsmodels: ``survdiff(time, status, sex, strata=ecog, weight_type="fh", fh_p=1.5)``
    on the rows repeated ``w`` times. Three sites, one per ECOG stratum (a stratum spans no
    site, as in hospitals by specialty), follow-up recoded to 204 and 605 days: with six
    cells (stratum x sex) per site a round-robin split or a finer grid leaves a cell whose
    deaths are one row of positive weight, which ends every cell's counts there."""
    rng = np.random.default_rng(29)
    weighted = lung.assign(w=rng.integers(0, 4, len(lung)))  # some rows weigh nothing
    weighted = on_grid(weighted, np.array([204.0, 605.0]))
    frames = {
        f"ecog{level}": part.reset_index(drop=True) for level, part in weighted.groupby("ecog")
    }
    fed = fedstats.Federation.in_process(frames, disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "time", "status", "sex", grid=every_time(weighted, "time"), weights="w",
        strata="ecog", weightings="fleming-harrington", p=1.5,
    )  # fmt: skip
    expanded = weighted.loc[weighted.index.repeat(weighted.w)]
    chisq, _ = survdiff(expanded.time, expanded.status, expanded.sex, strata=expanded.ecog,
                        weight_type="fh", fh_p=1.5)  # fmt: skip
    assert abs(result.statistic - chisq) <= TOLERANCE


def test_summary_names_the_test_its_strata_and_weights(rossi):
    fed = fedstats.Federation.in_process(split(rossi, 4), disclosure=OPEN)
    result = fedstats.logrank_test(
        fed, "week", "arrest", "fin", grid=every_time(rossi, "week"), strata="race",
        weightings="tarone-ware",
    )  # fmt: skip
    text = result.summary()
    assert "stratified Tarone-Ware test" in text
    assert "race" in text and "weighted O - E" in text
    assert "stratified Tarone-Ware" in result._repr_html_()
    assert result.difference.sum() == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"weightings": "peto-prentice"}, "weightings must be"),
        ({"weightings": "fleming-harrington"}, "needs p="),
        ({"weightings": "fleming-harrington", "p": -1.0}, "finite and >= 0"),
        ({"weightings": "fleming-harrington", "p": 1.0, "q": float("nan")}, "finite"),
        ({"weightings": "wilcoxon", "p": 1.0}, "fleming-harrington. only"),
        ({"strata": ["race", "race"]}, "twice"),
        ({"strata": "race", "strata_levels": {"wexp": [0, 1]}}, "every strata column"),
    ],
)
def test_bad_options_are_typed_errors_before_any_request(rossi, options, match):
    fed = fedstats.Federation.in_process(split(rossi, 4), disclosure=OPEN)
    with pytest.raises(fedstats.StudyConfigurationError, match=match):
        fedstats.logrank_test(fed, "week", "arrest", "fin", width=4, horizon=52, **options)


# ------------------------------------------------------------------ record-level privacy
def ledgers(tmp_path, sites, epsilon=50.0):
    import accounting

    books = {}
    for site in sites:
        ledger = accounting.Ledger(tmp_path / f"{site}.ledger")
        ledger.set_budget(
            accounting.Scope(unit="patient", owner=site, study="study"), epsilon=epsilon,
            delta=1e-6,
        )  # fmt: skip
        books[site] = ledger
    return books


def large_sites(seed: int = 3, n: int = 6000) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    frames = {}
    for site in ("a", "b", "c"):
        arm = rng.integers(0, 2, n)
        stage = rng.integers(0, 2, n)
        event_time = rng.exponential(np.where(arm == 1, 500, 420) * np.where(stage, 0.5, 1.0))
        censor = rng.uniform(100, 1500, n)
        frames[site] = pd.DataFrame(
            {"days": np.minimum(event_time, censor), "died": event_time <= censor,
             "arm": arm, "stage": stage}
        )  # fmt: skip
    return frames


@pytest.mark.parametrize(
    ("weighting", "exponents"),
    [(None, {}), ("tarone-ware", {}), ("fleming-harrington", {"p": 1.0, "q": 1.0})],
)
def test_private_stratified_weighted_test_is_near_the_exact_one_and_adds_the_noise(
    tmp_path, weighting, exponents
):
    """Under record-level privacy a stratified, weighted test is computed from the noisy
    counts, with the noise's covariance from the bootstrap (every weight recomputed per
    draw): at a small noise the statistic is near the exact one, and the noise share is
    positive and small."""
    frames = large_sites()
    exact_fed = fedstats.Federation.in_process(frames)
    options = {"strata": "stage", "weightings": weighting, "width": 30, "horizon": 1500,
               **exponents}  # fmt: skip
    exact = fedstats.logrank_test(exact_fed, "days", "died", "arm", **options)
    fed = fedstats.Federation.in_process(frames, ledgers=ledgers(tmp_path, frames), noise_seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error", fedstats.PrivacyUtilityWarning)
        private = fedstats.logrank_test(
            fed, "days", "died", "arm", levels=[0, 1], strata_levels={"stage": [0, 1]},
            privacy=fedstats.RecordDP(noise_multiplier=0.5), **options,
        )  # fmt: skip
    assert private.variance_method != exact.variance_method
    assert 0 < private.noise_share.max() < 0.2
    assert private.statistic == pytest.approx(exact.statistic, rel=0.15)
    assert private.test == exact.test and private.strata == ("stage",)


def test_private_weights_are_refused_and_private_strata_need_their_levels(tmp_path):
    frames = large_sites(n=200)
    fed = fedstats.Federation.in_process(frames, ledgers=ledgers(tmp_path, frames))
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-6)
    with pytest.raises(fedstats.StudyConfigurationError, match="frequency weights"):
        fedstats.logrank_test(fed, "days", "died", "arm", levels=[0, 1], weights="stage",
                              width=30, horizon=1500, privacy=privacy)  # fmt: skip
    with pytest.raises(fedstats.StudyConfigurationError, match="strata_levels="):
        fedstats.logrank_test(fed, "days", "died", "arm", levels=[0, 1], strata="stage",
                              width=30, horizon=1500, privacy=privacy)  # fmt: skip


def readme_snippet() -> str:
    """The README's python block on stratified and weighted log-rank tests, unindented."""
    readme = Path(__file__).resolve().parents[2] / "README.md"
    text = readme.read_text(encoding="utf-8")
    section = text[text.index("- Stratified and weighted log-rank tests") :]
    block = section[section.index("```python") + len("```python") : section.index("  ```\n")]
    return textwrap.dedent(block)


def test_the_readme_example_runs_and_releases_every_arrest(capsys):
    namespace: dict = {}
    exec(compile(readme_snippet(), "README.md:stratified log-rank", "exec"), namespace)
    test, km = namespace["test"], namespace["km"]
    assert test.observed.sum() == load_rossi().arrest.sum()  # no cell was cut
    assert test.strata == ("wexp",) and test.test == "Fleming-Harrington (p=1, q=1)"
    assert km.counts.weights == "n" and "stratified Fleming-Harrington" in capsys.readouterr().out


def test_stratified_weighted_test_over_secure_aggregation_equals_the_clear_one(lung):
    """Secure aggregation sums the strata-by-group counts (the coordinator sees only the
    totals): the same test as in the clear, to the fixed-point precision of the sums."""
    from fedstats.models.secure_aggregation import SecureAggregation

    weighted = lung.assign(w=np.random.default_rng(31).integers(1, 4, len(lung)))
    options = {"grid": every_time(lung, "time"), "strata": "ecog", "weights": "w",
               "weightings": "fleming-harrington", "p": 1.0, "q": 0.5}  # fmt: skip
    clear = fedstats.logrank_test(
        fedstats.Federation.in_process(split(weighted, 4), disclosure=OPEN),
        "time", "status", "sex", **options,
    )  # fmt: skip
    fed = fedstats.Federation.in_process(split(weighted, 4), disclosure=OPEN)
    hidden = fedstats.logrank_test(
        fed, "time", "status", "sex", secure_aggregation=SecureAggregation(), **options
    )
    assert abs(hidden.statistic - clear.statistic) <= 1e-7
    assert {"secagg.advertise", "secagg.unmask"} <= set(fed.inventory.to_frame()["task"])


def private_p_value(frames, books, seed: int, weighting: str, exponents: dict) -> float:
    """The p-value of a private stratified weighted test of ``arm`` on the study grid."""
    from test_kaplan_meier_private import GRID

    fed = fedstats.Federation.in_process(frames, ledgers=books, noise_seed=seed)
    return fedstats.logrank_test(
        fed, "t", "e", "arm", levels=[0, 1], strata="stage", strata_levels={"stage": [0, 1]},
        grid=GRID, weightings=weighting, privacy=fedstats.RecordDP(epsilon=1.0, delta=1e-6),
        **exponents,
    ).p_value  # fmt: skip


@pytest.mark.parametrize(
    ("weighting", "exponents"), [("tarone-ware", {}), ("fleming-harrington", {"p": 1.0, "q": 1.0})]
)
def test_private_stratified_weighted_test_holds_its_level(
    tmp_path, monkeypatch, weighting, exponents
):
    """The oracle is the null itself: arms drawn independently of survival within two
    strata of different hazards, 4 sites of 150 patients, epsilon 1 (the noise dominates).
    A test at level 0.05 rejects in about 5 % of 200 studies, within three standard errors:
    the bootstrap's covariance, with the weights recomputed per draw, carries the noise.
    The same tests without it reject far more often."""
    from test_kaplan_meier_private import ledgers as study_ledgers
    from test_kaplan_meier_private import study

    level, studies = 0.05, 200
    sites = [f"s{k}" for k in range(4)]
    books = study_ledgers(tmp_path, sites)
    p_values, naive = [], []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", fedstats.PrivacyUtilityWarning)
        for i in range(studies):
            frames = study(3000 + i, n_per_site=150)
            rng = np.random.default_rng(i)
            for frame in frames.values():  # a second stratum, dying twice as fast
                frame["stage"] = rng.integers(0, 2, len(frame))
                frame.loc[frame.stage == 1, "t"] = frame.t[frame.stage == 1] / 2
            p_values.append(private_p_value(frames, books, 9000 + i, weighting, exponents))
            with monkeypatch.context() as patch:  # the same noise, its covariance left out
                patch.setattr(logrank, "_noise_covariance", lambda c, d, rng, w: np.zeros((2, 2)))
                naive.append(private_p_value(frames, books, 9000 + i, weighting, exponents))
    rate = np.mean(np.array(p_values) < level)
    se = np.sqrt(level * (1 - level) / studies)
    assert level - 3 * se <= rate <= level + 3 * se, rate
    assert np.mean(np.array(naive) < level) > level + 6 * se
