"""Federated vs pooled logistic regression: wall time, accuracy, rounds and bytes.

N = 1,000,000 patients, 20 covariates, 10 sites (synthetic, fixed seed). In
one run: the federated fit (in-process silos, codec included), statsmodels'
GLM Binomial on the pooled arrays, and the floor — Newton's method in plain
numpy on the pooled arrays (:func:`numpy_newton`: the least any exact fit of
the model takes on this machine) — each timed on the same machine; prints one
JSON line.

    .venv/bin/python benchmarks/logistic.py [--n 1000000] [--sites 10] [--covariates 20]

Targets: ``time_ratio`` (federated / statsmodels) <= 0.15 (``meets_target``) and
``rounds`` <= statsmodels' IRLS iterations + 1. ``numpy_floor_ratio`` is the
floor's time over statsmodels' (the least ``time_ratio`` could be), and
``time_over_floor`` the federated fit's over the floor's.
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
from scipy.special import expit  # noqa: E402

import fedstats  # noqa: E402
from fedstats import datasets  # noqa: E402
from fedstats.contract.newton import DECREMENT_TOL, decrement_converged  # noqa: E402

TARGET = 0.15


def numpy_newton(X: np.ndarray, y: np.ndarray, maxiter: int = 50) -> tuple[np.ndarray, int]:
    """Newton's method for logistic regression in plain numpy on the pooled arrays, stopped
    by the rule the federated fit uses (:func:`fedstats.contract.newton.decrement_converged`):
    ``eta = X beta``, ``mu = expit(eta)``, score ``X'(y - mu)``, information
    ``X' diag(mu (1 - mu)) X``, one solve per step. Returns the estimate and its rounds."""
    beta = np.zeros(X.shape[1])
    previous = np.inf
    rounds = 0
    for rounds in range(1, maxiter + 1):  # noqa: B007 - the rounds taken are returned
        mu = expit(X @ beta)
        gradient = X.T @ (y - mu)
        hessian = X.T @ (X * (mu * (1.0 - mu))[:, None])
        step = np.linalg.solve(hessian, gradient)
        beta = beta + step
        decrement = float(gradient @ step)
        if decrement_converged(decrement, previous, DECREMENT_TOL):
            break
        previous = decrement
    return beta, rounds


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

    start = time.perf_counter()
    floor_params, floor_rounds = numpy_newton(pooled_X, pooled_y)
    floor_seconds = time.perf_counter() - start

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
                "numpy_floor_seconds": round(floor_seconds, 3),
                "time_ratio": round(federated_seconds / statsmodels_seconds, 4),
                "numpy_floor_ratio": round(floor_seconds / statsmodels_seconds, 4),
                "time_over_floor": round(federated_seconds / floor_seconds, 3),
                "max_abs_diff_params": float(
                    np.max(np.abs(result.params.to_numpy() - reference.params))
                ),
                "max_abs_diff_bse": float(np.max(np.abs(result.bse.to_numpy() - reference.bse))),
                "max_abs_diff_params_floor": float(np.max(np.abs(floor_params - reference.params))),
                "rounds": newton_rounds,
                "numpy_floor_rounds": floor_rounds,
                "statsmodels_iterations": int(reference.fit_history["iteration"]),
                "bytes_per_site_per_round": bytes_per_site_round,
                "reply_bytes_per_site_per_round": max(r.reply_bytes for r in per_round),
                "total_messages": result.provenance.messages,
                "target_time_ratio": TARGET,
                "meets_target": federated_seconds / statsmodels_seconds <= TARGET,
                "rounds_met": newton_rounds <= int(reference.fit_history["iteration"]) + 1,
            }
        )
    )


if __name__ == "__main__":
    main()
