"""Verified paths: per-round time and bytes with and without them, at 3, 10 and 30 sites.

An exact federated logistic regression (synthetic, fixed seed, ``--n`` patients per site,
``--covariates`` covariates) fitted twice in one run on in-process sites: plain, and with
every site verifying paths (:mod:`fedstats.site.verified_paths`: each request relays the
previous round's signed replies of every site, each site checks every signature and
re-derives the step). Both fits must give the same numbers in the same rounds. Prints one
JSON line.

    .venv/bin/python benchmarks/verified_paths.py [--sites 3 10 30] [--n 2000] [--covariates 8]
        [--repeats 5]

Each figure is the median over ``--repeats`` repetitions, each on data of its own (a round at 3
sites takes milliseconds, so one fit's timing is mostly noise; and a fit repeated on the same data
would find its relayed signatures already checked by the process-wide cache of valid ones).

Target: ``time_ratio`` (verified / plain, per round) <= 1.2 at every size. In process the
sites answer one after another, so each of S sites' checks of S relayed replies add up to
S^2; deployed sites answer at once, so ``concurrent_time_ratio`` also prints the round as
they would take it (the coordinator's time plus the slowest site's, both measured here).
``secure_time_ratio``: the same fit over secure aggregation, whose masked rounds each site
verifies from the relayed signed masked replies and the seeds that unmask them.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import fedstats  # noqa: E402

TARGET = 1.2


def synthetic(sites: int, n: int, covariates: int, seed: int) -> dict[str, pd.DataFrame]:
    """Each site's patients: normal covariates and a logistic outcome."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(0, 0.3, covariates)
    frames = {}
    for s in range(sites):
        X = rng.normal(0, 1, (n, covariates))
        y = rng.random(n) < 1 / (1 + np.exp(-(X @ beta - 0.5)))
        frame = pd.DataFrame(X, columns=[f"x{j + 1}" for j in range(covariates)])
        frame["y"] = y.astype(int)
        frames[f"site{s + 1:02d}"] = frame
    return frames


def timed_fit(frames: dict[str, pd.DataFrame], formula: str, verified: bool) -> dict:
    federation = fedstats.Federation.in_process(frames, verified_paths=verified)
    model = fedstats.LogisticRegression(formula)
    model.agree(federation, "warm-up")  # the design's checks, outside the timed rounds
    started = time.perf_counter()
    result = model.fit(federation)
    seconds = time.perf_counter() - started
    rounds = [r for r in federation.inventory.records() if r.task == "logistic.summaries"]
    sites = len(frames)
    per_request = [rounds[i : i + sites] for i in range(0, len(rounds), sites)]
    serial_sites = sum(r.seconds for r in rounds) / len(per_request)
    slowest_site = sum(max(r.seconds for r in group) for group in per_request) / len(per_request)
    wall = seconds / result.iterations
    return {
        "result": result,
        "seconds_per_round": wall,
        # the same round with every site answering at once, as deployed sites do: the
        # coordinator's own time (the wall time less the sites') plus the slowest site's
        "concurrent_seconds_per_round": wall - serial_sites + slowest_site,
        "slowest_site_seconds": slowest_site,
        "request_bytes_per_site_per_round": max(r.request_bytes for r in rounds),
    }


def secure_seconds_per_round(
    frames: dict[str, pd.DataFrame], formula: str, verified: bool
) -> tuple:
    """Wall seconds per round of the same fit over secure aggregation (four requests a round:
    keys, shares, the masked sums, the unmasking), and its coefficients."""
    federation = fedstats.Federation.in_process(frames, verified_paths=verified)
    model = fedstats.LogisticRegression(formula)
    model.agree(federation, "warm-up")
    started = time.perf_counter()
    result = model.fit(federation, secure_aggregation=fedstats.SecureAggregation())
    return (time.perf_counter() - started) / result.iterations, result


def one_size(sites: int, args: argparse.Namespace, formula: str, repeat: int) -> dict:
    """The three pairs of fits (plain and verified: in process, as deployed sites would answer
    at once, inside secure aggregation) on data of their own (seed ``seed + repeat``): no
    relayed signature was ever checked before, in this process or another."""
    frames = synthetic(sites, args.n, args.covariates, args.seed + repeat)
    plain = timed_fit(frames, formula, verified=False)
    verified = timed_fit(frames, formula, verified=True)
    secure_plain, hidden_plain = secure_seconds_per_round(frames, formula, verified=False)
    secure_verified, hidden = secure_seconds_per_round(frames, formula, verified=True)
    same = bool(
        np.array_equal(plain["result"].params, verified["result"].params)
        and plain["result"].iterations == verified["result"].iterations
        and np.array_equal(hidden_plain.params, hidden.params)
        and hidden_plain.iterations == hidden.iterations
    )
    return {
        "rounds": verified["result"].iterations,
        "plain_seconds_per_round": plain["seconds_per_round"],
        "verified_seconds_per_round": verified["seconds_per_round"],
        "plain_concurrent_seconds_per_round": plain["concurrent_seconds_per_round"],
        "verified_concurrent_seconds_per_round": verified["concurrent_seconds_per_round"],
        "plain_slowest_site_seconds": plain["slowest_site_seconds"],
        "verified_slowest_site_seconds": verified["slowest_site_seconds"],
        "plain_request_bytes": plain["request_bytes_per_site_per_round"],
        "verified_request_bytes": verified["request_bytes_per_site_per_round"],
        "secure_plain_seconds_per_round": secure_plain,
        "secure_verified_seconds_per_round": secure_verified,
        "time_ratio": verified["seconds_per_round"] / plain["seconds_per_round"],
        "concurrent_time_ratio": verified["concurrent_seconds_per_round"]
        / plain["concurrent_seconds_per_round"],
        "secure_time_ratio": secure_verified / secure_plain,
        "same_fit": same,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[3, 10, 30])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--covariates", type=int, default=8)
    parser.add_argument("--seed", type=int, default=20261126)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    formula = "y ~ " + " + ".join(f"x{j + 1}" for j in range(args.covariates))
    sizes = []
    for sites in args.sites:
        runs = [one_size(sites, args, formula, r) for r in range(args.repeats)]
        size: dict = {"sites": sites}
        for key, value in runs[0].items():
            if isinstance(value, bool):
                size[key] = all(run[key] for run in runs)
            elif isinstance(value, float):  # the median over the repeats
                size[key] = round(float(np.median([run[key] for run in runs])), 5)
            else:
                size[key] = value
        sizes.append(size)
    print(
        json.dumps(
            {
                "benchmark": "verified_paths",
                "n_per_site": args.n,
                "covariates": args.covariates,
                "by_sites": sizes,
                "target_time_ratio": TARGET,
                "time_ratio_met": all(s["time_ratio"] <= TARGET for s in sizes),
                "concurrent_time_ratio_met": all(
                    s["concurrent_time_ratio"] <= TARGET for s in sizes
                ),
                "secure_time_ratio_met": all(s["secure_time_ratio"] <= TARGET for s in sizes),
                "same_fits": all(s["same_fit"] for s in sizes),
            }
        )
    )


if __name__ == "__main__":
    main()
