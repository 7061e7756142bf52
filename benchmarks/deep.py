"""Cost of record-level DP-SGD: epoch time with and without privacy, side by side.

A 3-layer MLP (30 -> 64 -> 64 -> 1) on 50,000 synthetic rows x 30 features,
batch 256, trained by the site's own local-training code
(``fedstats.deep.site.local_training.train_locally``): non-private epochs
(shuffled batches of 256) and private epochs (Poisson sampling with
``q = 256 / 50,000``, ``1/q`` steps, per-sample clipping, Gaussian noise)
with each clipping engine — book-keeping ghost norms (the default),
Opacus' ghost clipping, and Opacus' default per-sample-gradient hooks.
Engines are timed in turn within each repeat; the JSON line reports the
median epoch times and the ratios to non-private. Target: default engine
ratio <= 2.0.

Secure aggregation's overhead per federated round, for 5 and 20 sites: the
same MLP trained by ``FederatedTrainer`` (FedAvg, 5 local steps of batch 256
on 20,000 synthetic rows per site, all sites in one process, so the time is
computation and encoding, not network), once with the coordinator summing
the sites' updates in the clear and once by secure aggregation (threshold:
every site); median round time of each, the overhead in seconds and as a
ratio, bytes per site per round, and the largest difference between the two
runs' final weights (fixed-point rounding of the sums only).

    .venv/bin/python benchmarks/deep.py [--epochs 5] [--rounds 4]
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
import torch  # noqa: E402

import fedstats  # noqa: E402
from fedstats.deep import FederatedTrainer, build_model  # noqa: E402
from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan  # noqa: E402
from fedstats.deep.shared.losses import BINARY  # noqa: E402
from fedstats.deep.shared.wire import LocalPlan  # noqa: E402
from fedstats.deep.site.data import SiteTensors  # noqa: E402
from fedstats.deep.site.local_training import train_locally  # noqa: E402

N, FEATURES, BATCH, HIDDEN = 50_000, 30, 256, [64, 64]
TARGET = 2.0
SITE_ROWS, LOCAL_STEPS = 20_000, 5


def synthetic_rows(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    X = rng.normal(size=(n, FEATURES)).astype(np.float32)
    logits = X[:, :5].sum(1) - X[:, 5:10].sum(1) / 2
    return X, (rng.random(n) < 1 / (1 + np.exp(-logits))).astype(np.float32)


def secagg_overhead(sites: int, rounds: int) -> dict:
    """Median round time of FedAvg with plain and with secure aggregation of the updates."""
    rng = np.random.default_rng(sites)
    names = [f"x{j}" for j in range(1, FEATURES + 1)]
    frames = {}
    for i in range(sites):
        X, y = synthetic_rows(SITE_ROWS, rng)
        frames[f"site{i:02d}"] = pd.DataFrame(X, columns=names).assign(y=y.astype(int))
    trainer = FederatedTrainer("mlp", {"hidden": HIDDEN}, formula="y ~ " + " + ".join(names),
                               bounds=dict.fromkeys(names, (-5.0, 5.0)), rounds=rounds,
                               local_steps=LOCAL_STEPS, batch_size=BATCH, seed=0,
                               progress=False)  # fmt: skip
    runs = {}
    for name, secure in (("plain", None), ("secure", fedstats.SecureAggregation())):
        fed = fedstats.Federation.in_process(frames)
        result = trainer.fit(fed, secure_aggregation=secure, evaluation=False)
        inventory = fed.inventory.to_frame()
        training = inventory[(inventory.task == "deep.train") | inventory.task.str.startswith(
            "secagg.")]  # fmt: skip
        per_round = (training.request_bytes + training.reply_bytes).sum() / (sites * rounds)
        runs[name] = (result, float(result.history["seconds"].median()), int(per_round))
    (plain, plain_s, plain_b), (secure, secure_s, secure_b) = runs["plain"], runs["secure"]
    difference = max(
        float(np.max(np.abs(a - b))) for a, b in zip(plain.weights, secure.weights, strict=True)
    )
    return {
        "sites": sites,
        "plain_round_seconds": round(plain_s, 4),
        "secure_round_seconds": round(secure_s, 4),
        "overhead_seconds_per_round": round(secure_s - plain_s, 4),
        "time_ratio": round(secure_s / plain_s, 3),
        "bytes_per_site_per_round_plain": plain_b,
        "bytes_per_site_per_round_secure": secure_b,
        "max_abs_weight_difference": difference,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X, y = synthetic_rows(N, rng)
    data = SiteTensors(X=torch.from_numpy(X), y=torch.from_numpy(y), time=None, event=None)
    q = BATCH / N
    steps = round(1 / q)
    plain = LocalPlan("fedavg", lr=0.05, batch_size=BATCH, local_epochs=1)
    private = LocalPlan("fedavg", lr=0.05, batch_size=BATCH, local_steps=steps)
    engines = {"non_private": None, "bookkeeping": "bookkeeping", "opacus_ghost": "ghost",
               "opacus_default": "hooks"}  # fmt: skip
    models = {name: build_model("mlp", FEATURES, {"hidden": HIDDEN}) for name in engines}
    times: dict[str, list[float]] = {name: [] for name in engines}
    for epoch in range(args.epochs + 1):  # the first epoch warms up and is not counted
        for name, engine in engines.items():
            dp = None if engine is None else DpSgdPlan(q, 1.0, 1.0, steps, engine)
            start = time.perf_counter()
            train_locally(models[name], data, BINARY, private if dp else plain, seed=epoch,
                          private=dp)  # fmt: skip
            if epoch:
                times[name].append(time.perf_counter() - start)
    median = {name: float(np.median(v)) for name, v in times.items()}
    ratio = {
        name: median[name] / median["non_private"] for name in engines if name != "non_private"
    }
    print(
        json.dumps(
            {
                "benchmark": "deep_dp_sgd_epoch_time",
                "rows": N,
                "features": FEATURES,
                "batch": BATCH,
                "model": f"mlp {FEATURES}-{'-'.join(map(str, HIDDEN))}-1",
                "epochs_timed": args.epochs,
                "torch_threads": torch.get_num_threads(),
                "median_epoch_seconds": {k: round(v, 4) for k, v in median.items()},
                "ratio_dp_to_non_private": round(ratio["bookkeeping"], 3),
                "ratio_opacus_ghost": round(ratio["opacus_ghost"], 3),
                "ratio_opacus_default": round(ratio["opacus_default"], 3),
                "target_ratio": TARGET,
                "target_met": ratio["bookkeeping"] <= TARGET,
                "secure_aggregation_per_round": [secagg_overhead(n, args.rounds) for n in (5, 20)],
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
