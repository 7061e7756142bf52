"""Federated vs pooled logistic regression: wall time, accuracy, rounds and bytes.

N = 1,000,000 patients, 20 covariates, 10 sites (synthetic, fixed seed). In
one run: the federated fit (in-process silos, codec included) and
statsmodels' GLM Binomial on the pooled arrays, each timed on the same
machine; prints one JSON line.

    .venv/bin/python benchmarks/logistic.py [--n 1000000] [--sites 10] [--covariates 20]

Targets: ``time_ratio`` (federated / statsmodels) <= 0.35 and ``rounds`` <=
statsmodels' IRLS iterations + 1.
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
import statsmodels.api as sm  # noqa: E402

import fedstats  # noqa: E402
from fedstats import datasets  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--sites", type=int, default=10)
    parser.add_argument("--covariates", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261122)
    args = parser.parse_args()

    frames = datasets.synthetic_logistic(
        n_sites=args.sites,
        n_per_site=args.n // args.sites,
        n_covariates=args.covariates,
        seed=args.seed,
        categorical=False,
    )
    covariates = [f"x{j + 1}" for j in range(args.covariates)]
    federation = fedstats.Federation.in_process(frames, study="benchmark")
    model = fedstats.LogisticRegression.from_columns("y", covariates)

    start = time.perf_counter()
    result = model.fit(federation)
    federated_seconds = time.perf_counter() - start

    pooled_X = sm.add_constant(np.vstack([f[covariates].to_numpy() for f in frames.values()]))
    pooled_y = np.concatenate([f["y"].to_numpy() for f in frames.values()])
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = sm.GLM(pooled_y, pooled_X, family=sm.families.Binomial()).fit()
    statsmodels_seconds = time.perf_counter() - start

    newton_rounds = result.provenance.rounds
    per_round = [
        r
        for r in federation.inventory.records(result.provenance.analysis)
        if r.task == "logistic.summaries"
    ]
    bytes_per_site_round = max(r.request_bytes + r.reply_bytes for r in per_round)
    print(
        json.dumps(
            {
                "benchmark": "logistic",
                "n": args.n,
                "sites": args.sites,
                "covariates": args.covariates,
                "federated_seconds": round(federated_seconds, 3),
                "statsmodels_seconds": round(statsmodels_seconds, 3),
                "time_ratio": round(federated_seconds / statsmodels_seconds, 4),
                "max_abs_diff_params": float(
                    np.max(np.abs(result.params.to_numpy() - reference.params))
                ),
                "max_abs_diff_bse": float(np.max(np.abs(result.bse.to_numpy() - reference.bse))),
                "rounds": newton_rounds,
                "statsmodels_iterations": int(reference.fit_history["iteration"]),
                "bytes_per_site_per_round": bytes_per_site_round,
                "reply_bytes_per_site_per_round": max(r.reply_bytes for r in per_round),
                "total_messages": result.provenance.messages,
                "target_time_ratio": 0.35,
                "time_ratio_met": federated_seconds / statsmodels_seconds <= 0.35,
                "rounds_met": newton_rounds <= int(reference.fit_history["iteration"]) + 1,
            }
        )
    )


if __name__ == "__main__":
    main()
