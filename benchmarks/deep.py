"""Cost of record-level DP-SGD: epoch time with and without privacy, side by side.

A 3-layer MLP (30 -> 64 -> 64 -> 1) on 50,000 synthetic rows x 30 features,
batch 256, trained by the site's own local-training code
(``fedstats.deep.local_training.train_locally``): non-private epochs
(shuffled batches of 256) and private epochs (Poisson sampling with
``q = 256 / 50,000``, ``1/q`` steps, per-sample clipping, Gaussian noise)
with each clipping engine — book-keeping ghost norms (the default),
Opacus' ghost clipping, and Opacus' default per-sample-gradient hooks.
Engines are timed in turn within each repeat; the JSON line reports the
median epoch times and the ratios to non-private. Target: default engine
ratio <= 2.0.

    .venv/bin/python benchmarks/deep.py [--epochs 5]
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
import torch  # noqa: E402

from fedstats.deep import build_model  # noqa: E402
from fedstats.deep.dp_sgd import DpSgdPlan  # noqa: E402
from fedstats.deep.local_training import LocalPlan, train_locally  # noqa: E402
from fedstats.deep.losses import BINARY  # noqa: E402
from fedstats.deep.site_data import SiteTensors  # noqa: E402

N, FEATURES, BATCH, HIDDEN = 50_000, 30, 256, [64, 64]
TARGET = 2.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    X = rng.normal(size=(N, FEATURES)).astype(np.float32)
    logits = X[:, :5].sum(1) - X[:, 5:10].sum(1) / 2
    y = (rng.random(N) < 1 / (1 + np.exp(-logits))).astype(np.float32)
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
            }
        )
    )


if __name__ == "__main__":
    sys.exit(main())
