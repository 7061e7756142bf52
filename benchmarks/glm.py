"""Federated vs pooled Poisson regression with person-time: wall time, accuracy, rounds and bytes.

N = 1,000,000 patients, 20 covariates, 10 sites (synthetic, fixed seed):
``y ~ Poisson(t exp(x' beta))`` with follow-up ``t`` as the exposure. In one
run: the federated fit (``fedstats.GLM(family="poisson",
exposure=...)``, in-process silos, codec included) and statsmodels' GLM
Poisson with the same exposure on the pooled arrays, each timed on the same
machine; prints one JSON line.

    .venv/bin/python benchmarks/glm.py [--n 1000000] [--sites 10] [--covariates 20]

Targets: ``time_ratio`` (federated / statsmodels) <= 0.35; coefficients and
standard errors within 1e-8 of statsmodels'.
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
import statsmodels.api as sm  # noqa: E402

import fedstats  # noqa: E402


def synthetic_rates(n: int, sites: int, covariates: int, seed: int) -> dict[str, pd.DataFrame]:
    """Each site's patients: covariates ``x1..xp`` (site-shifted normals), follow-up
    ``years`` in (0.1, 10) and a Poisson count of events over it."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(0, 0.15, covariates)
    frames = {}
    for s in range(sites):
        m = n // sites
        X = rng.normal(rng.normal(0, 0.3, covariates), 1.0, size=(m, covariates))
        years = rng.uniform(0.1, 10.0, m)
        counts = rng.poisson(years * np.exp(-2.5 + X @ beta))
        frame = pd.DataFrame(X, columns=[f"x{j + 1}" for j in range(covariates)])
        frame["years"] = years
        frame["events"] = counts
        frames[f"site{s + 1:02d}"] = frame
    return frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--covariates", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261125)
    args = parser.parse_args()

    frames = synthetic_rates(args.n, args.sites, args.covariates, args.seed)
    covariates = [f"x{j + 1}" for j in range(args.covariates)]
    federation = fedstats.Federation.in_process(frames, study="benchmark")
    model = fedstats.GLM("events ~ " + " + ".join(covariates), family="poisson", exposure="years")

    start = time.perf_counter()
    result = model.fit(federation)
    federated_seconds = time.perf_counter() - start

    pooled_X = sm.add_constant(np.vstack([f[covariates].to_numpy() for f in frames.values()]))
    pooled_y = np.concatenate([f["events"].to_numpy() for f in frames.values()])
    pooled_t = np.concatenate([f["years"].to_numpy() for f in frames.values()])
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = sm.GLM(
            pooled_y, pooled_X, family=sm.families.Poisson(), exposure=pooled_t
        ).fit()
    statsmodels_seconds = time.perf_counter() - start

    names = ["Intercept", *covariates]
    per_round = [
        r
        for r in federation.inventory.records(result.provenance.analysis)
        if r.task == "glm.summaries"
    ]
    ratio = federated_seconds / statsmodels_seconds
    print(
        json.dumps(
            {
                "benchmark": "glm",
                "family": "poisson",
                "n": args.n,
                "sites": args.sites,
                "covariates": args.covariates,
                "federated_seconds": round(federated_seconds, 3),
                "statsmodels_seconds": round(statsmodels_seconds, 3),
                "time_ratio": round(ratio, 4),
                "max_abs_diff_params": float(
                    np.max(np.abs(result.params[names].to_numpy() - reference.params))
                ),
                "max_abs_diff_bse": float(
                    np.max(np.abs(result.bse[names].to_numpy() - reference.bse))
                ),
                "converged": result.converged,
                "rounds": result.provenance.rounds,
                "statsmodels_iterations": int(reference.fit_history["iteration"]),
                "bytes_per_site_per_round": max(r.request_bytes + r.reply_bytes for r in per_round),
                "total_messages": result.provenance.messages,
                "target_time_ratio": 0.35,
                "time_ratio_met": ratio <= 0.35,
            }
        )
    )


if __name__ == "__main__":
    main()
