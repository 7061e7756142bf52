"""Record-level DP Cox regression on TCGA-BRCA: held-out C-index beside the exact federated fit.

TCGA-BRCA across six regions with FLamby's train/test split (Fed-TCGA-BRCA;
du Terrail et al., NeurIPS 2022 Datasets and Benchmarks). In one run:

* the exact federated Cox fit stratified by region (``fedstats.CoxPH``,
  Efron ties) on the training patients of the regions that answer (a region
  whose design columns single out one or two patients refuses exact fits);
* the record-level DP fit (:mod:`fedstats.models.cox_private`: piecewise
  exponential baseline on a yearly grid up to 10 years, per-patient
  clipping, noisy Newton) at epsilon 1 and 4 per region (delta 1e-5), one
  baseline across regions and a baseline per region, on every region's
  training patients, ``--repeats`` times with fresh noise each;
* for each fit, Harrell's C on all held-out patients pooled (FLamby's
  metric, computed here from the benchmark's own copy of the data:
  ``lifelines.utils.concordance_index``), the share of repeats that warned
  (``PrivacyUtilityWarning``) and the mean noise share of the coefficients.

FLamby reports test C-indices of 0.676 (pooled training) and 0.815 (FedAdam)
for a linear Cox network on all 39 features. Prints one JSON line.

    .venv/bin/python benchmarks/dp_cox.py [--repeats 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import warnings  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from lifelines.utils import concordance_index  # noqa: E402

import accounting  # noqa: E402
import fedstats  # noqa: E402
from fedstats import datasets  # noqa: E402

COVARIATES = [
    "age_at_index",
    *[f"ajcc_pathologic_stage_stage_{s}" for s in ("ia", "iia", "iib", "iiia", "iiic")],
    "ajcc_pathologic_t_t1c",
    "ajcc_pathologic_t_t2",
    "ajcc_pathologic_t_t3",
    "ajcc_pathologic_n_n1",
    "ajcc_pathologic_n_n2",
]
FORMULA = "Surv(years, event) ~ " + " + ".join(COVARIATES)
BOUNDS = {"age_at_index": (18.0, 90.0), **{c: (0.0, 1.0) for c in COVARIATES[1:]}}
"""Public ranges: adult ages; 0/1 indicators."""
GRID = np.arange(1.0, 10.01, 1.0)
EPSILONS = (1.0, 4.0)


def split(part: str) -> dict[str, pd.DataFrame]:
    """FLamby's train or test patients of each region, with follow-up in years."""
    frames = {}
    for site, frame in datasets.tcga_brca().frames.items():
        rows = frame[frame["split"] == part].drop(columns="split").reset_index(drop=True)
        frames[site] = rows.assign(years=rows["time"] / 365.25)
    return frames


def held_out_c_index(params: pd.Series, test: dict[str, pd.DataFrame]) -> float:
    """Harrell's C of ``x' beta`` over all held-out patients pooled (higher risk, shorter
    survival: the score is negated for lifelines)."""
    pooled = pd.concat(test.values(), ignore_index=True)
    risk = pooled[list(params.index)].to_numpy() @ params.to_numpy()
    return float(concordance_index(pooled["years"], -risk, pooled["event"]))


def exact_fit(train: dict[str, pd.DataFrame]) -> tuple[fedstats.CoxPHResults, list[str]]:
    """The exact stratified fit on the regions that answer; the regions that refused."""
    frames, refused = dict(train), []
    while True:
        try:
            fit = fedstats.CoxPH(FORMULA, strata="site").fit(fedstats.Federation.in_process(frames))
            return fit, refused
        except fedstats.DisclosureError as refusal:
            refused.append(refusal.site)
            frames.pop(refusal.site)


def private_fits(
    train: dict[str, pd.DataFrame],
    test: dict[str, pd.DataFrame],
    epsilon: float,
    strata: str | None,
    repeats: int,
    folder: Path,
) -> dict:
    """``repeats`` private fits with fresh OS noise: C-index, warnings, noise share, time."""
    c_indices, warned, shares, seconds = [], 0, [], []
    for repeat in range(repeats):
        books = {}
        for site in train:
            ledger = accounting.Ledger(folder / f"{epsilon}-{strata}-{repeat}-{site}.ledger")
            ledger.set_budget(
                accounting.Scope(unit="patient", owner=site, study="study"), epsilon, 1e-5
            )
            books[site] = ledger
        fed = fedstats.Federation.in_process(train, ledgers=books)
        privacy = fedstats.RecordDP(epsilon=epsilon, delta=1e-5, rounds=6, bounds=BOUNDS)
        started = time.perf_counter()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", fedstats.PrivacyUtilityWarning)
            fit = fedstats.CoxPH(FORMULA, strata=strata, grid=GRID).fit(fed, privacy=privacy)
        seconds.append(time.perf_counter() - started)
        c_indices.append(held_out_c_index(fit.params, test))
        warned += fit.noise_dominated
        shares.append(float(fit.noise_share.mean()))
    return {
        "epsilon": epsilon,
        "baseline": "shared" if strata is None else "per region",
        "c_index_mean": round(float(np.mean(c_indices)), 4),
        "c_index_sd": round(float(np.std(c_indices, ddof=1)), 4) if repeats > 1 else None,
        "warned_share": warned / repeats,
        "mean_noise_share": round(float(np.mean(shares)), 3),
        "seconds_per_fit": round(float(np.mean(seconds)), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    options = parser.parse_args()
    train, test = split("train"), split("test")
    exact, refused = exact_fit(train)
    result = {
        "benchmark": "dp_cox_tcga_brca",
        "regions": len(train),
        "train_patients": sum(len(f) for f in train.values()),
        "test_patients": sum(len(f) for f in test.values()),
        "exact": {
            "c_index": round(held_out_c_index(exact.params, test), 4),
            "regions_refusing_exact_fit": refused,
        },
        "private": [],
        "repeats": options.repeats,
        "noise": "OS entropy",
        "flamby_reference_c_index": {"pooled_training": 0.676, "fedadam": 0.815},
    }
    with tempfile.TemporaryDirectory() as folder:
        for epsilon in EPSILONS:
            for strata in (None, "site"):
                result["private"].append(
                    private_fits(train, test, epsilon, strata, options.repeats, Path(folder))
                )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
