"""Secure aggregation's cost per round against a plain round: a model update, and an exact fit.

Part 1 (``by_sites``), for 5 and 20 sites: each site replies one update vector of
``--length`` float entries (default 52,000, the parameter count of a 3-layer MLP on 30
features with hidden sizes 256 and 128: 30*256+256 + 256*128+128 + 128+1 = 41,345, rounded
up). One round is timed as the plain request with the coordinator's sum, and as a whole
secure-aggregation session (keys, sealed shares, masked replies, consistency check,
unmasking); and with one site lost at the masked round (threshold n - 1), for which the
coordinator rebuilds that site's masking key and removes its pairwise masks from its
neighbours' replies.

Part 2 (``exact_fit``), for 10, 30 and 100 sites (``--fit-sites``) and both constructions
(SecAgg+, Bell et al. 2020, and the complete graph of Bonawitz et al. 2017): a real exact
``LogisticRegression`` with 20 covariates (``--covariates``; each round's reply is the
21 x 21 information matrix, the score, the log-likelihood and the counts) fitted in the
clear and over secure aggregation, every site verifying every round's path. Bytes per site
per round: everything a site is sent and sends in one round (the plain round: the task's
request and reply; the secure round: the whole session, all five requests and replies),
from the federation's message inventory, averaged over the fit's rounds. Time per round:
the fit's wall time over its rounds. The plain round itself grows with the sites: on a
verified path each round relays the previous round's signed replies; the overhead (secure
minus plain) is what secure aggregation adds. Target: at 100 sites, SecAgg+ sends and
receives at most 3 times the plain round's bytes per site (``meets_target``).

All sites run in this process, so the time is computation and encoding, not network.
Prints one JSON line.

    .venv/bin/python benchmarks/secagg.py [--length 52000] [--repeats 5]
        [--fit-sites 10,30,100] [--covariates 20] [--rows 200]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import fedstats  # noqa: E402
from fedstats import datasets  # noqa: E402
from fedstats.contract import codec  # noqa: E402
from fedstats.schema import Array  # noqa: E402
from fedstats.site.registry import REGISTRY  # noqa: E402
from fedstats.site.task import Task, TaskRegistry, TaskReply  # noqa: E402

UPDATE = "benchmark.update"


def registry(length: int) -> TaskRegistry:
    tasks = TaskRegistry(list(REGISTRY))

    def update(ctx, args):
        rng = np.random.default_rng(abs(hash(ctx.name)) % 2**32)
        return TaskReply({"update": rng.normal(0, 0.01, length)}, contributors=len(ctx.frame))

    tasks.add(Task(UPDATE, update, lambda args: {"update": Array((length,))}, "a model update"))
    return tasks


class LostAtMaskedRound:
    """A transport whose site goes away instead of sending its masked reply."""

    def __init__(self, handle) -> None:
        self.handle = handle

    def __call__(self, request: bytes) -> bytes:
        if codec.decode(request)["task"] == UPDATE:
            raise ConnectionError("site went away")
        return self.handle(request)


def one_size(sites: int, length: int, repeats: int) -> dict:
    frames = {f"site{i}": pd.DataFrame({"x": np.zeros(50)}) for i in range(sites)}
    tasks = registry(length)
    fed = fedstats.Federation.in_process(frames, registry=tasks)
    plain_times, secure_times, dropout_times = [], [], []
    for _ in range(repeats):
        start = time.perf_counter()
        replies = fed.request(UPDATE, {}, analysis="plain")
        plain = sum(r["update"] for r in replies.values())
        plain_times.append(time.perf_counter() - start)

        start = time.perf_counter()
        summed = fedstats.secure_sum(
            fed, UPDATE, {}, analysis="secure", options=fedstats.SecureAggregation()
        )
        secure_times.append(time.perf_counter() - start)
        error = float(np.max(np.abs(summed.total["update"] - plain)))

        transports = {s: silo.handle for s, silo in fed.silos.items()}
        transports["site0"] = LostAtMaskedRound(transports["site0"])
        lossy = fedstats.Federation(transports, registry=tasks)
        start = time.perf_counter()
        partial = fedstats.secure_sum(
            lossy,
            UPDATE,
            {},
            analysis="dropout",
            options=fedstats.SecureAggregation(threshold=sites - 1),
        )
        dropout_times.append(time.perf_counter() - start)
        expected = plain - replies["site0"]["update"]
        dropout_error = float(np.max(np.abs(partial.total["update"] - expected)))
    inventory = fed.inventory.to_frame()
    per_site_plain = inventory.query("analysis == 'plain'")
    per_site_secure = inventory.query("analysis == 'secure'")
    bytes_plain = (per_site_plain.request_bytes + per_site_plain.reply_bytes).sum() / (
        sites * repeats
    )
    bytes_secure = (per_site_secure.request_bytes + per_site_secure.reply_bytes).sum() / (
        sites * repeats
    )
    return {
        "sites": sites,
        "plain_seconds": round(statistics.median(plain_times), 4),
        "secure_seconds": round(statistics.median(secure_times), 4),
        "secure_with_one_dropout_seconds": round(statistics.median(dropout_times), 4),
        "time_ratio": round(statistics.median(secure_times) / statistics.median(plain_times), 2),
        "bytes_per_site_plain": int(bytes_plain),
        "bytes_per_site_secure": int(bytes_secure),
        "bytes_ratio": round(bytes_secure / bytes_plain, 3),
        "max_abs_error_vs_plain_sum": error,
        "max_abs_error_with_dropout": dropout_error,
    }


ROUND_TASKS = {"secagg.advertise", "secagg.share", "secagg.confirm", "secagg.unmask"}
TARGET_RATIO = 3.0


def fitted_round(frames: dict, covariates: list[str], secure) -> dict:
    """One exact fit (in the clear, or over ``secure``): its rounds, wall time per round and
    bytes per site per round, from the message inventory."""
    fed = fedstats.Federation.in_process(frames, study="benchmark")
    model = fedstats.LogisticRegression.from_columns("y", covariates)
    start = time.perf_counter()
    result = model.fit(fed, secure_aggregation=secure)
    seconds = time.perf_counter() - start
    records = fed.inventory.to_frame(result.provenance.analysis)
    rounds_rows = records[records.task.isin({"logistic.summaries"} | ROUND_TASKS)]
    rounds = int((records.task == "logistic.summaries").sum()) // len(frames)
    per_site = (rounds_rows.request_bytes + rounds_rows.reply_bytes).sum() / len(frames)
    return {
        "rounds": rounds,
        "seconds_per_round": round(seconds / rounds, 4),
        "bytes_per_site_per_round": int(per_site / rounds),
        "params": result.params.to_numpy(),
    }


def exact_fit(sites: int, covariates: int, rows: int) -> dict:
    frames = datasets.synthetic_logistic(
        n_sites=sites, n_per_site=rows, n_covariates=covariates, seed=20261122,
        categorical=False,
    )  # fmt: skip
    names = [f"x{j + 1}" for j in range(covariates)]
    plain = fitted_round(frames, names, None)
    out = {
        "sites": sites,
        "rounds": plain["rounds"],
        "plain_bytes_per_site_per_round": plain["bytes_per_site_per_round"],
        "plain_seconds_per_round": plain["seconds_per_round"],
    }
    for construction in ("secagg+", "secagg"):
        options = fedstats.SecureAggregation(construction=construction)
        shape = options.neighbourhood_for(sites)
        secure = fitted_round(frames, names, options)
        key = construction.replace("+", "_plus")
        out[key] = {
            "neighbours": shape.degree,
            "share_threshold": shape.share_threshold,
            "complete_graph": shape.complete,
            "rounds": secure["rounds"],
            "bytes_per_site_per_round": secure["bytes_per_site_per_round"],
            "bytes_ratio": round(
                secure["bytes_per_site_per_round"] / plain["bytes_per_site_per_round"], 3
            ),
            "overhead_bytes_per_site_per_round": secure["bytes_per_site_per_round"]
            - plain["bytes_per_site_per_round"],
            "seconds_per_round": secure["seconds_per_round"],
            "time_ratio": round(secure["seconds_per_round"] / plain["seconds_per_round"], 2),
            "max_abs_coef_difference": float(np.max(np.abs(secure["params"] - plain["params"]))),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=52_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fit-sites", default="10,30,100")
    parser.add_argument("--covariates", type=int, default=20)
    parser.add_argument("--rows", type=int, default=200)
    args = parser.parse_args()
    fits = [exact_fit(int(n), args.covariates, args.rows) for n in args.fit_sites.split(",") if n]
    largest = max(fits, key=lambda f: f["sites"])
    out = {
        "benchmark": "secagg",
        "length": args.length,
        "by_sites": [one_size(n, args.length, args.repeats) for n in (5, 20)],
        "exact_fit": {
            "covariates": args.covariates,
            "rows_per_site": args.rows,
            "by_sites": fits,
            "target": f"SecAgg+ bytes per site per round <= {TARGET_RATIO:g} x plain at "
            f"{largest['sites']} sites",
            "meets_target": largest["secagg_plus"]["bytes_ratio"] <= TARGET_RATIO,
        },
    }
    print(json.dumps(out))


if __name__ == "__main__":
    sys.exit(main())
