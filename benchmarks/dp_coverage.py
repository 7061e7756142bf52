"""Coverage of the private 95 % intervals of the true parameters, by setting.

In one run, prints one JSON line. For every setting it simulates ``--studies``
independent studies with known data-generating parameters, fits the private
model to each with fresh privacy noise, and reports per coefficient (or time
point) the share of studies whose 95 % interval covers the TRUE value (the
parameter the data were drawn from, not the study's exact fit), with its
Monte Carlo standard error; the share of studies that raised
:class:`fedstats.PrivacyUtilityWarning`; the mean noise share; the wall time
and the seconds per fit. A fit that fedstats refuses (a ``FedstatsError``) is
counted in ``failed_fits`` by error and left out of the shares. The private
intervals add the privacy noise's variance to the sampling variance
(Ferrando, Wang & Sheldon, "Parametric bootstrap for differentially private
confidence intervals", AISTATS 2022).

Settings:

* ``logistic_eps{0.3,1,2}_{4x250,10x1000}_{clear,secure}`` (12): record-level
  DP logistic regression (delta 1e-6, 4 noisy Newton rounds), 4 sites x 250 or
  10 sites x 1,000 patients, with secure aggregation (distributed noise) or
  without (each site noises its own reply). Covariates x1, x2, x3 uniform on
  their public bounds (-2, 2); ``y ~ Bernoulli(expit(-0.5 + 0.5 x1 - 0.3 x2 +
  0.2 x3))``.
* ``cox_eps{1,4}`` (2): record-level DP Cox regression (delta 1e-6, 6 rounds,
  a baseline per site) on the grid 1.5, 3, ..., 15; 4 sites x 1,000 patients,
  x1 ~ U(-1, 1), x2 ~ Bernoulli(0.4), exponential event times with rate
  ``0.1 (1 + 0.5 s) exp(0.5 x1 - 0.7 x2)`` at site s, censoring U(0, 15). The
  hazard is constant in time, so the model (a baseline constant between grid
  points) holds exactly; true log hazard ratios (0.5, -0.7).
* ``km_eps1`` (1): record-level DP Kaplan-Meier (epsilon 1, delta 1e-6) on
  the grid 1, ..., 6, 4 sites x 300 patients, exponential event times with
  mean 5, each patient censored at a random grid point or never (so the grid
  estimate is unbiased); survival at times 1, 3 and 5, true ``exp(-t / 5)``.

Target: coverage in [0.93, 0.975] for every coefficient of a setting
(``meets_target``); where a setting misses it, ``warned_in_every_study`` says
whether every one of its studies raised the warning (a miss the user was told
of). At 500 studies the Monte Carlo standard error of a coverage near 0.95 is
about 0.01.

Each site keeps one privacy ledger (budget far beyond any run) across the
studies. The privacy noise is seeded: the studies of a setting use noise seeds
100 apart from a base drawn from ``--seed`` and the setting's name (site k adds
k + 1), so every figure is reproducible, and a setting's figures do not depend
on which other settings run.

BLAS runs on one thread unless ``OPENBLAS_NUM_THREADS`` (or ``OMP_``/``MKL_``) is set: the
fits are many and their matrices small, so threads only contend for the cores.

    .venv/bin/python benchmarks/dp_coverage.py [--studies 500] [--settings a,b] [--seed 2026]
        [--jobs 2]

``--jobs N`` runs the settings in N processes (one per core): the figures are
those of a run one by one, since each setting's streams depend only on
``--seed`` and its name.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import os  # noqa: E402

# Thousands of fits of small matrices (a Cox fit's bootstrap: ~8,000 eigendecompositions of
# 42 x 42): threaded BLAS only contends for the cores, 70 times slower on a loaded 2-core
# machine. One thread unless the caller says otherwise; set before numpy is imported.
for _variable in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402
import zlib  # noqa: E402
from collections import Counter  # noqa: E402
from collections.abc import Callable, Mapping  # noqa: E402
from concurrent.futures import ProcessPoolExecutor  # noqa: E402
from dataclasses import dataclass  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.special import expit  # noqa: E402

import accounting  # noqa: E402
import fedstats  # noqa: E402

TARGET = (0.93, 0.975)
DEFAULT_STUDIES = 500
DELTA = 1e-6
SEED_SPACING = 100  # site k's noise is seeded noise_seed + k + 1: studies never share a seed
LEDGER_EPSILON, LEDGER_DELTA = 1e9, 0.5  # a budget no run reaches
STUDY = "study"

LOGISTIC_FORMULA = "y ~ x1 + x2 + x3"
LOGISTIC_TRUTH = {"Intercept": -0.5, "x1": 0.5, "x2": -0.3, "x3": 0.2}
LOGISTIC_BOUND = 2.0
LOGISTIC_BOUNDS = {x: (-LOGISTIC_BOUND, LOGISTIC_BOUND) for x in ("x1", "x2", "x3")}
LOGISTIC_ROUNDS = 4

COX_FORMULA = "Surv(time, event) ~ x1 + x2"
COX_TRUTH = {"x1": 0.5, "x2": -0.7}
COX_BOUNDS = {"x1": (-1.0, 1.0), "x2": (0.0, 1.0)}
COX_GRID = np.arange(1.5, 15.01, 1.5)
COX_ROUNDS = 6

KM_MEAN_TIME = 5.0
KM_GRID = np.arange(1.0, 7.0)
KM_TIMES = (1.0, 3.0, 5.0)
KM_TRUTH = {f"S({t:g})": float(np.exp(-t / KM_MEAN_TIME)) for t in KM_TIMES}

# Seconds per study of each setting, relative (a run of 60 studies on one core): the order in
# which --jobs hands settings to its workers, the slowest first.
RELATIVE_COST = {
    "cox_eps4": 4.3, "logistic_eps2_10x1000_secure": 3.4, "cox_eps1": 3.3,
    "logistic_eps2_10x1000_clear": 2.8, "logistic_eps1_10x1000_secure": 1.7,
    "logistic_eps1_10x1000_clear": 1.6, "logistic_eps0.3_10x1000_secure": 1.2,
    "logistic_eps2_4x250_clear": 1.0, "logistic_eps2_4x250_secure": 1.0,
}  # fmt: skip

Frames = dict[str, pd.DataFrame]
Result = fedstats.LogisticRegressionResults | fedstats.CoxPHResults | fedstats.KaplanMeierResults
Reading = tuple[dict[str, bool], dict[str, float]]  # covered, noise share: by coefficient


@dataclass(frozen=True)
class Setting:
    """A named simulation with known truth, the private fit of one study, and how to read it."""

    name: str
    description: dict
    truth: dict[str, float]
    sites: tuple[str, ...]
    simulate: Callable[[np.random.Generator], Frames]
    fit: Callable[[fedstats.Federation], Result]
    read: Callable[[Result], Reading]


@dataclass(frozen=True)
class StudyFit:
    """What one private fit of one simulated study tells the benchmark."""

    covered: dict[str, bool]
    noise_share: dict[str, float]
    warned: bool
    other_warnings: int
    seconds: float


# ---- simulations


def site_names(n_sites: int) -> tuple[str, ...]:
    return tuple(f"s{k}" for k in range(n_sites))


def simulate_logistic(rng: np.random.Generator, n_sites: int, n_per_site: int) -> Frames:
    """Covariates uniform on their public bounds; the outcome from the true coefficients."""
    slopes = np.array([LOGISTIC_TRUTH["x1"], LOGISTIC_TRUTH["x2"], LOGISTIC_TRUTH["x3"]])
    frames = {}
    for site in site_names(n_sites):
        x = rng.uniform(-LOGISTIC_BOUND, LOGISTIC_BOUND, size=(n_per_site, 3))
        y = rng.binomial(1, expit(LOGISTIC_TRUTH["Intercept"] + x @ slopes))
        frames[site] = pd.DataFrame({"y": y, "x1": x[:, 0], "x2": x[:, 1], "x3": x[:, 2]})
    return frames


def simulate_cox(rng: np.random.Generator, n_sites: int, n_per_site: int) -> Frames:
    """Exponential event times with a site-specific baseline, uniform censoring on (0, 15)."""
    frames = {}
    for s, site in enumerate(site_names(n_sites)):
        x1, x2 = rng.uniform(-1, 1, n_per_site), rng.binomial(1, 0.4, n_per_site)
        rate = 0.1 * (1 + 0.5 * s) * np.exp(COX_TRUTH["x1"] * x1 + COX_TRUTH["x2"] * x2)
        t, c = rng.exponential(1 / rate), rng.uniform(0, 15, n_per_site)
        frames[site] = pd.DataFrame(
            {"time": np.minimum(t, c), "event": (t <= c).astype(int), "x1": x1, "x2": x2}
        )
    return frames


def simulate_km(rng: np.random.Generator, n_sites: int, n_per_site: int) -> Frames:
    """Exponential event times; each patient censored at a random grid point or never, so
    nobody is censored inside a grid interval and the grid estimate is unbiased for S."""
    frames = {}
    for site in site_names(n_sites):
        event = rng.exponential(KM_MEAN_TIME, n_per_site)
        censor = rng.choice(np.r_[KM_GRID, np.inf], n_per_site)
        frames[site] = pd.DataFrame({"t": np.minimum(event, censor), "e": event <= censor})
    return frames


# ---- private fits


def fit_logistic(fed: fedstats.Federation, epsilon: float, secure: bool) -> Result:
    privacy = fedstats.RecordDP(
        epsilon=epsilon, delta=DELTA, rounds=LOGISTIC_ROUNDS, bounds=LOGISTIC_BOUNDS
    )
    return fedstats.LogisticRegression(LOGISTIC_FORMULA).fit(
        fed, privacy=privacy, secure_aggregation=fedstats.SecureAggregation() if secure else None
    )


def fit_cox(fed: fedstats.Federation, epsilon: float) -> Result:
    privacy = fedstats.RecordDP(epsilon=epsilon, delta=DELTA, rounds=COX_ROUNDS, bounds=COX_BOUNDS)
    model = fedstats.CoxPH(COX_FORMULA, strata="site", grid=COX_GRID)
    return model.fit(fed, privacy=privacy)


def fit_km(fed: fedstats.Federation, epsilon: float) -> Result:
    privacy = fedstats.RecordDP(epsilon=epsilon, delta=DELTA)
    return fedstats.KaplanMeier("t", "e", grid=KM_GRID, privacy=privacy).fit(fed)


# ---- what a fit says about the truth (an undefined bound never covers)


def read_coefficients(result: Result, truth: Mapping[str, float]) -> Reading:
    """Whether each Wald 95 % interval holds the true coefficient, and its noise share."""
    ci = result.conf_int(0.05)
    covered = {
        name: bool(ci.loc[name, "lower"] <= value <= ci.loc[name, "upper"])
        for name, value in truth.items()
    }
    return covered, {name: float(result.noise_share[name]) for name in truth}


def read_survival(result: Result) -> Reading:
    """Whether the pooled curve's 95 % interval holds the true S at each checked time, and
    the noise share of ``log(-log S)`` there."""
    lower = result.confidence_interval_["lower"]["all"]
    upper = result.confidence_interval_["upper"]["all"]
    shares = result.noise_share_["all"]
    covered, noise = {}, {}
    for t, (name, value) in zip(KM_TIMES, KM_TRUTH.items(), strict=True):
        covered[name] = bool(lower.loc[t] <= value <= upper.loc[t])
        noise[name] = float(shares.loc[t])
    return covered, noise


# ---- the settings


def logistic_settings() -> list[Setting]:
    out = []
    for epsilon in (0.3, 1.0, 2.0):
        for n_sites, n_per_site in ((4, 250), (10, 1000)):
            for secure in (False, True):
                mode = "secure" if secure else "clear"
                out.append(
                    Setting(
                        name=f"logistic_eps{epsilon:g}_{n_sites}x{n_per_site}_{mode}",
                        description={
                            "model": "LogisticRegression",
                            "epsilon": epsilon,
                            "delta": DELTA,
                            "rounds": LOGISTIC_ROUNDS,
                            "sites": n_sites,
                            "patients_per_site": n_per_site,
                            "secure_aggregation": secure,
                        },
                        truth=dict(LOGISTIC_TRUTH),
                        sites=site_names(n_sites),
                        simulate=partial(simulate_logistic, n_sites=n_sites, n_per_site=n_per_site),
                        fit=partial(fit_logistic, epsilon=epsilon, secure=secure),
                        read=partial(read_coefficients, truth=LOGISTIC_TRUTH),
                    )
                )
    return out


def cox_settings() -> list[Setting]:
    return [
        Setting(
            name=f"cox_eps{epsilon:g}",
            description={
                "model": "CoxPH (piecewise exponential, a baseline per site)",
                "epsilon": epsilon,
                "delta": DELTA,
                "rounds": COX_ROUNDS,
                "sites": 4,
                "patients_per_site": 1000,
                "secure_aggregation": False,
                "grid": [float(g) for g in COX_GRID],
            },
            truth=dict(COX_TRUTH),
            sites=site_names(4),
            simulate=partial(simulate_cox, n_sites=4, n_per_site=1000),
            fit=partial(fit_cox, epsilon=epsilon),
            read=partial(read_coefficients, truth=COX_TRUTH),
        )
        for epsilon in (1.0, 4.0)
    ]


def km_settings() -> list[Setting]:
    return [
        Setting(
            name="km_eps1",
            description={
                "model": "KaplanMeier",
                "epsilon": 1.0,
                "delta": DELTA,
                "sites": 4,
                "patients_per_site": 300,
                "secure_aggregation": False,
                "grid": [float(g) for g in KM_GRID],
            },
            truth=dict(KM_TRUTH),
            sites=site_names(4),
            simulate=partial(simulate_km, n_sites=4, n_per_site=300),
            fit=partial(fit_km, epsilon=1.0),
            read=read_survival,
        )
    ]


def all_settings() -> dict[str, Setting]:
    return {s.name: s for s in (*logistic_settings(), *cox_settings(), *km_settings())}


def chosen_settings(names: str | None) -> list[Setting]:
    settings = all_settings()
    if not names:
        return list(settings.values())
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in settings]
    if unknown:
        raise SystemExit(f"unknown settings {unknown}; choose from {sorted(settings)}")
    return [settings[n] for n in wanted]


# ---- running


def open_ledgers(folder: Path, sites: tuple[str, ...]) -> dict[str, accounting.Ledger]:
    """One ledger per site, reused by every study (``normal`` durability: fast)."""
    books = {}
    for site in sites:
        ledger = accounting.Ledger(folder / f"{site}.ledger", durability="normal")
        ledger.set_budget(
            accounting.Scope(unit="patient", owner=site, study=STUDY),
            epsilon=LEDGER_EPSILON,
            delta=LEDGER_DELTA,
        )
        books[site] = ledger
    return books


def setting_streams(seed: int, name: str) -> tuple[np.random.Generator, int]:
    """The setting's data generator and the base of its noise seeds, from ``seed`` and the
    setting's name only."""
    data, noise = np.random.SeedSequence([seed, zlib.crc32(name.encode())]).spawn(2)
    base = int(np.random.default_rng(noise).integers(0, 2**31))
    return np.random.default_rng(data), base


def fit_one_study(
    setting: Setting, frames: Frames, books: Mapping[str, accounting.Ledger], noise_seed: int
) -> StudyFit:
    """Fit one study privately, counting (not printing) the warnings it raises."""
    fed = fedstats.Federation.in_process(
        frames, ledgers={s: books[s] for s in frames}, noise_seed=noise_seed, study=STUDY
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        result = setting.fit(fed)
        seconds = time.perf_counter() - start
    warned = [issubclass(w.category, fedstats.PrivacyUtilityWarning) for w in caught]
    covered, shares = setting.read(result)
    return StudyFit(covered, shares, any(warned), warned.count(False), seconds)


def nan_mean(values: list[float]) -> float | None:
    finite = [v for v in values if np.isfinite(v)]
    return round(float(np.mean(finite)), 4) if finite else None


def summarise(setting: Setting, fits: list[StudyFit], failed: Counter, seconds: float) -> dict:
    """Coverage per coefficient against the target, warnings, noise shares and times."""
    n = len(fits)
    coverage = {name: float(np.mean([f.covered[name] for f in fits])) for name in setting.truth}
    meets = n > 0 and all(TARGET[0] <= p <= TARGET[1] for p in coverage.values())
    warned = [f.warned for f in fits]
    studies = n + sum(failed.values())
    return {
        **setting.description,
        "studies": studies,
        "failed_fits": dict(failed),
        "truth": setting.truth,
        "coverage": {k: round(p, 4) for k, p in coverage.items()},
        "coverage_mc_se": {
            k: round(float(np.sqrt(p * (1 - p) / n)), 4) for k, p in coverage.items()
        },
        "meets_target": meets,
        "warned_in_every_study": None if meets else bool(warned) and all(warned),
        "warned_share": round(float(np.mean(warned)), 4) if warned else None,
        "mean_noise_share": {
            name: nan_mean([f.noise_share[name] for f in fits]) for name in setting.truth
        },
        "other_warnings": sum(f.other_warnings for f in fits),
        "seconds": round(seconds, 2),
        "per_fit_seconds": round(float(np.mean([f.seconds for f in fits])), 3) if fits else None,
        "per_study_seconds": round(seconds / studies, 3),
    }


def run_setting(setting: Setting, studies: int, seed: int, folder: Path) -> dict:
    """Simulate and privately fit ``studies`` studies of one setting."""
    rng, base = setting_streams(seed, setting.name)
    books = open_ledgers(folder, setting.sites)
    fits: list[StudyFit] = []
    failed: Counter = Counter()
    start = time.perf_counter()
    for i in range(studies):
        frames = setting.simulate(rng)
        try:
            fits.append(fit_one_study(setting, frames, books, base + SEED_SPACING * i))
        except fedstats.FedstatsError as error:
            failed[type(error).__name__] += 1
    seconds = time.perf_counter() - start
    for ledger in books.values():
        ledger.close()
    return summarise(setting, fits, failed, seconds)


def run_named_setting(name: str, studies: int, seed: int, tmp: Path) -> dict:
    """:func:`run_setting` for the setting called ``name``, in its own folder (a worker's task)."""
    folder = tmp / name
    folder.mkdir()
    return run_setting(all_settings()[name], studies, seed, folder)


def run_settings(
    settings: list[Setting], studies: int, seed: int, tmp: Path, jobs: int
) -> dict[str, dict]:
    """Every setting's summary, in the given order. With ``jobs`` > 1 the settings run in
    that many processes, the slowest first (a setting's figures depend only on ``seed`` and
    its name, so they are those of a run one by one)."""
    names = [s.name for s in settings]
    if jobs == 1:
        return {name: run_named_setting(name, studies, seed, tmp) for name in names}
    slowest_first = sorted(names, key=lambda name: -RELATIVE_COST.get(name, 1.0))
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {n: pool.submit(run_named_setting, n, studies, seed, tmp) for n in slowest_first}
        return {name: futures[name].result() for name in names}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=DEFAULT_STUDIES)
    parser.add_argument("--settings", help="comma-separated setting names (default: all)")
    parser.add_argument("--seed", type=int, default=2026)
    parser.add_argument("--jobs", type=int, default=1, help="settings run side by side")
    args = parser.parse_args()
    if args.studies < 1:
        parser.error("--studies must be at least 1")
    if args.jobs < 1:
        parser.error("--jobs must be at least 1")
    settings = chosen_settings(args.settings)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        results = run_settings(settings, args.studies, args.seed, Path(tmp), args.jobs)
    every = len(settings) == len(all_settings())
    out = {
        "benchmark": "dp_coverage",
        "studies": args.studies,
        "seed": args.seed,
        "noise": "seeded: a setting's studies use noise seeds 100 apart from a base drawn "
        "from --seed and the setting's name",
        "interval_method": "sampling plus privacy-noise variance "
        "(Ferrando, Wang & Sheldon, AISTATS 2022)",
        "target_coverage": list(TARGET),
        "blas_threads": os.environ["OPENBLAS_NUM_THREADS"],
        "settings": results,
        "all_meet_target": all(r["meets_target"] for r in results.values()),
        "seconds": round(time.perf_counter() - start, 2),
        "estimated_full_run_minutes": round(
            sum(r["per_study_seconds"] for r in results.values()) * DEFAULT_STUDIES / 60, 1
        ),
        "estimate_basis": f"this run's seconds per study x {DEFAULT_STUDIES} studies, "
        + ("every setting" if every else "the settings run only"),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
