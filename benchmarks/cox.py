"""Federated Cox regression vs lifelines on the pooled data: wall time, accuracy, bytes.

N = 200,000 synthetic patients, 10 covariates, 5 sites (fixed seed);
follow-up times in days, continuous. In one run, each timed on the same
machine:

* stratified by site: ``fedstats.CoxPH(strata="site")`` vs lifelines
  ``CoxPHFitter().fit(strata=["site"])`` on the same data: exact;
* one baseline: ``fedstats.CoxPH(strata=None)`` on a daily grid (times
  coarsened up to whole days; risk-set threshold ``min_count=1``, so that no
  site censors early) vs lifelines without strata, on the continuous times (the
  fit an analyst holding pooled data would run: ``time_ratio``) and on the
  coarsened times (the same model: ``max_abs_diff_params`` is against this
  one; ``max_abs_diff_params_vs_continuous`` is what the daily grid costs).

Both with Efron ties; lifelines with ``fit_options={"precision": 1e-10}``.
Every site runs with its disclosure rules on: ``min_count=1`` gives ``k_cell = 2``,
the least a site may set, so the cell rules and the differencing guard check
every exact release (the guard's near-copy search is part of the timed fit).
Every site verifies the fit's path (the default): each round of the pooled model
relays every site's signed grid sums of the last point, ``sites x K (4 + 2p + p(p + 1))``
numbers on a grid of ``K`` points (``x x'`` as its upper triangle; a trial's base goes by
reference, its total kept by each site, unless the round before relayed it by reference
too), so the sites raise their ``max_array_items`` and ``max_request_bytes`` to carry it
(:class:`fedstats.site.resource_limits.RequestLimits`; the defaults refuse it).
Prints one JSON line.

    .venv/bin/python benchmarks/cox.py [--n 200000] [--sites 5] [--covariates 10]

Targets: ``time_ratio`` (fedstats / lifelines) <= 0.2 for both modes
(``target_met``); for the pooled model, ``time_ratio`` <= 1.0 against lifelines on
the same patients (``meets_target``), and ``time_ratio_vs_lifelines_on_grid_times``
<= 1.0 against lifelines on the same coarsened times
(``meets_target_vs_lifelines_on_grid_times``).
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from lifelines import CoxPHFitter  # noqa: E402

import fedstats  # noqa: E402
from fedstats.site.resource_limits import RequestLimits  # noqa: E402

TARGET = 0.2
POOLED_TARGET = 1.0


def relay_limits(n_sites: int, n_points: int, p: int) -> RequestLimits:
    """Limits that carry any verified pooled-Cox round: two points' signed grid sums of every
    site (:func:`fedstats.cox_math.grid_sums_schema`, with ``d_weighted``), with room to
    spare."""
    per_reply = n_points * (4 + 2 * p + p * (p + 1)) + p + 1
    items = 2 * n_sites * per_reply
    return RequestLimits(
        max_array_items=max(RequestLimits().max_array_items, 2 * items),
        max_request_bytes=max(RequestLimits().max_request_bytes, 16 * items),
    )


def synthetic(n: int, sites: int, p: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    site = rng.integers(0, sites, n)
    X = rng.normal(size=(n, p)) + 0.2 * site[:, None] / sites  # sites differ a little
    beta = np.linspace(-0.5, 0.5, p)
    baseline = 1 / 900 * (1 + 0.3 * site / sites)  # and in baseline hazard
    event_time = rng.exponential(1 / (baseline * np.exp(X @ beta)))
    censor = rng.uniform(30, 3650, n)
    frame = pd.DataFrame(X, columns=[f"x{j}" for j in range(p)])
    frame["days"] = np.minimum(event_time, censor)
    frame["dead"] = (event_time <= censor).astype(int)
    frame["site"] = site
    return frame


def lifelines_fit(table: pd.DataFrame, strata: list[str] | None) -> tuple[CoxPHFitter, float]:
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitter = CoxPHFitter().fit(
            table, "days", "dead", strata=strata, fit_options={"precision": 1e-10}
        )
    return fitter, time.perf_counter() - start


def max_diff(ours: pd.Series, theirs: pd.Series) -> float:
    return float(np.max(np.abs(ours.to_numpy() - theirs[ours.index].to_numpy())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--sites", type=int, default=5)
    parser.add_argument("--covariates", type=int, default=10)
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args()

    frame = synthetic(args.n, args.sites, args.covariates, args.seed)
    columns = [f"x{j}" for j in range(args.covariates)]
    formula = "Surv(days, dead) ~ " + " + ".join(columns)
    frames = {
        f"site{s}": part.drop(columns="site").reset_index(drop=True)
        for s, part in frame.groupby("site")
    }
    open_policy = fedstats.DisclosurePolicy(min_count=1)  # k_cell = 2: the rules stay on
    assert open_policy.k_cell == 2
    grid = np.arange(1.0, np.ceil(frame["days"].max()) + 1)
    result: dict = {"benchmark": "cox", "n": args.n, "sites": args.sites, "p": args.covariates}
    data = frame[[*columns, "days", "dead", "site"]]
    for mode in ("stratified", "pooled"):
        fed = fedstats.Federation.in_process(
            frames,
            disclosure=open_policy,
            limits=relay_limits(args.sites, len(grid), args.covariates),
        )
        model = (
            fedstats.CoxPH(formula, strata="site")
            if mode == "stratified"
            else fedstats.CoxPH(formula, strata=None, grid=grid)
        )
        start = time.perf_counter()
        fit = model.fit(fed)
        ours = time.perf_counter() - start
        strata = ["site"] if mode == "stratified" else None
        table = data if mode == "stratified" else data.drop(columns="site")
        reference, theirs = lifelines_fit(table, strata)
        provenance = fit.provenance
        per_site_round = (provenance.request_bytes + provenance.reply_bytes) / (
            max(provenance.rounds, 1) * args.sites
        )
        entry = {
            "fedstats_seconds": round(ours, 2),
            "lifelines_seconds": round(theirs, 2),
            "time_ratio": round(ours / theirs, 3),
            "rounds": provenance.rounds,
            "bytes_per_site_per_round": int(per_site_round),
            "target_met": ours / theirs <= TARGET,
        }
        exact = reference
        if mode == "pooled":
            coarse = table.assign(days=np.ceil(table["days"]))
            exact, on_grid = lifelines_fit(coarse, None)
            entry["grid_points"] = len(grid)
            entry["lifelines_on_grid_times_seconds"] = round(on_grid, 2)
            entry["time_ratio_vs_lifelines_on_grid_times"] = round(ours / on_grid, 3)
            entry["meets_target"] = ours / theirs <= POOLED_TARGET
            entry["meets_target_vs_lifelines_on_grid_times"] = ours / on_grid <= POOLED_TARGET
            entry["max_abs_diff_params_vs_continuous"] = max_diff(fit.params, reference.params_)
        entry["max_abs_diff_params"] = max_diff(fit.params, exact.params_)
        entry["max_abs_diff_bse"] = max_diff(fit.bse, exact.standard_errors_)
        result[mode] = entry
    print(json.dumps(result))


if __name__ == "__main__":
    main()
