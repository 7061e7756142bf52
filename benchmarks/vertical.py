"""Vertical against horizontal exact logistic regression: time and bytes per round.

Synthetic patients (fixed seed), ``--n`` of them with ``--covariates`` covariates. In one
run: the vertical fit (the outcome at a registry, the covariates at one hospital, each
site's rows shuffled on its own and linked by pair ids; in-process silos, codec included)
and the horizontal exact fit of the same rows split over two sites. Reports, for each, the
Newton rounds and the mean time and bytes (requests and replies) per round, and for the
vertical fit the one-time Paillier step (the registry's fresh key and ``Enc(y)``, the
hospital's masked sums, one decryption, the unmasking): its time and bytes. Also the
largest gap between the two fits' coefficients. Prints one JSON line.

    .venv/bin/python benchmarks/vertical.py [--n 5000] [--covariates 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.special import expit  # noqa: E402

import fedstats  # noqa: E402
from fedstats.site.linked_rows import LinkedRows  # noqa: E402

ONE_TIME = ("vertical.encrypt_outcome", "vertical.masked_products", "vertical.decrypt",
            "vertical.unmask")  # fmt: skip


def synthetic(n: int, p: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, p))
    beta = rng.normal(scale=0.3, size=p)
    frame = pd.DataFrame(X, columns=[f"x{j + 1}" for j in range(p)])
    frame["y"] = (rng.random(n) < expit(-0.5 + X @ beta)).astype(int)
    return frame


def vertical_federation(frame: pd.DataFrame, seed: int = 1) -> fedstats.Federation:
    """The registry holds ``y``, the hospital the covariates, each under its own shuffled
    labels; both accept the linkage ``L`` (pair id -> each site's patient)."""
    rng = np.random.default_rng(seed)
    n = len(frame)
    pair_ids = np.sort(rng.choice(10 * n, size=n, replace=False))
    registry_labels = np.array([f"R{i}" for i in rng.permutation(n)])
    hospital_labels = np.array([f"H{i}" for i in rng.permutation(n)])
    registry = frame[["y"]].set_axis(registry_labels).sample(frac=1, random_state=seed)
    hospital = frame.drop(columns="y").set_axis(hospital_labels).sample(frac=1, random_state=seed)
    fed = fedstats.Federation.in_process({"registry": registry, "hospital": hospital})
    fed.silos["registry"].accept_linkage(LinkedRows("L", pair_ids, registry_labels))
    fed.silos["hospital"].accept_linkage(LinkedRows("L", pair_ids, hospital_labels))
    return fed


def per_round(records, rounds_task: str) -> dict:
    rounds = [r for r in records if r.task == rounds_task]
    count = len({r.seq for r in rounds}) / max(1, len({r.site for r in rounds}))
    return {
        "rounds": int(count),
        "seconds_per_round": sum(r.seconds for r in rounds) / max(count, 1),
        "bytes_per_round": sum(r.request_bytes + r.reply_bytes for r in rounds) / max(count, 1),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=5_000)
    parser.add_argument("--covariates", type=int, default=20)
    args = parser.parse_args(argv)
    frame = synthetic(args.n, args.covariates)
    formula = "y ~ " + " + ".join(c for c in frame.columns if c != "y")

    vertical = vertical_federation(frame)
    start = time.perf_counter()
    fit_v = fedstats.VerticalLogisticRegression(
        formula, outcome_site="registry", covariate_sites=["hospital"], linkage_id="L"
    ).fit(vertical)
    vertical_seconds = time.perf_counter() - start
    records_v = vertical.inventory.records()
    one_time = [r for r in records_v if r.task in ONE_TIME]

    half = len(frame) // 2
    horizontal = fedstats.Federation.in_process({"a": frame.iloc[:half], "b": frame.iloc[half:]})
    start = time.perf_counter()
    fit_h = fedstats.LogisticRegression(formula).fit(horizontal)
    horizontal_seconds = time.perf_counter() - start

    result = {
        "benchmark": "vertical",
        "n": args.n,
        "covariates": args.covariates,
        "vertical": {
            "seconds": vertical_seconds,
            **per_round(records_v, "vertical.summaries"),
            "paillier_seconds": sum(r.seconds for r in one_time),
            "paillier_bytes": sum(r.request_bytes + r.reply_bytes for r in one_time),
            "paillier_bytes_by_task": {
                t: sum(r.request_bytes + r.reply_bytes for r in one_time if r.task == t)
                for t in ONE_TIME
            },
        },
        "horizontal": {
            "seconds": horizontal_seconds,
            "sites": 2,
            **per_round(horizontal.inventory.records(), "logistic.summaries"),
        },
        "max_params_gap": float(np.abs(fit_v.params.to_numpy() - fit_h.params.to_numpy()).max()),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
