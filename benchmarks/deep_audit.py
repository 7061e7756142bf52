"""One-run canary audit of federated DP-SGD against its accounted epsilon, with its control.

In one run, prints one JSON line: for a synthetic two-site study (200 rows
per site, 32 standard-normal covariates with public bounds +/-4, a weak
logistic outcome) and an MLP (one hidden layer of 128, FedAvg, 2 rounds of
100 local steps, lr 2, batch 48), the one-run audit (Steinke, Nasr &
Jagielski, NeurIPS 2023; :mod:`fedstats.deep.canary_audit`) with 500
input-space canaries, each put into site ``a`` with probability 1/2 (OS
entropy), guess counts 20/50/100/200, 95 % confidence:

* the DP-SGD runs at epsilon 1, delta 1e-5 (``--repeats`` runs, fresh
  canaries and coin flips each): their lower bounds beside the site's
  accounted epsilon; target: no bound above the accounted epsilon;
* the non-private control with the first run's canaries and coin flips: its
  lower bound (the audit's power); target: at least 0.5;
* wall-clock seconds per run.

    .venv/bin/python benchmarks/deep_audit.py [--repeats 5]
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

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import accounting  # noqa: E402
import fedstats  # noqa: E402
from fedstats.deep import FederatedTrainer  # noqa: E402
from fedstats.deep.canary_audit import audit_training, draw_canaries  # noqa: E402
from fedstats.models.audit import draw_inclusion  # noqa: E402

COVARIATES = [f"x{j}" for j in range(1, 33)]
BOUNDS = {c: (-4.0, 4.0) for c in COVARIATES}
CANARIES = 500
GRID = [20, 50, 100, 200]
EPSILON, DELTA = 1.0, 1e-5


def site_frame(n: int, rng: np.random.Generator) -> pd.DataFrame:
    x = rng.normal(size=(n, len(COVARIATES)))
    frame = pd.DataFrame(x, columns=COVARIATES)
    frame["y"] = (rng.random(n) < 1 / (1 + np.exp(-0.2 * (x[:, 0] - x[:, 1])))).astype(int)
    return frame


def site_ledgers(sites) -> dict[str, accounting.Ledger]:
    folder = Path(tempfile.mkdtemp())
    books = {}
    for site in sites:
        books[site] = accounting.Ledger(folder / f"{site}.db")
        books[site].set_budget(accounting.Scope(unit="patient", owner=site, study="audit"),
                               epsilon=EPSILON, delta=DELTA)  # fmt: skip
    return books


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rng = np.random.default_rng()
    frames = {"a": site_frame(200, rng), "b": site_frame(200, rng)}
    trainer = FederatedTrainer("mlp", {"hidden": [128]}, formula="y ~ " + " + ".join(COVARIATES),
                               bounds=BOUNDS, rounds=2, local_steps=100, lr=2.0, batch_size=48,
                               progress=False)  # fmt: skip
    private, seconds, first = [], [], None
    for _ in range(args.repeats):
        canaries = draw_canaries(CANARIES, frames["a"], bounds=BOUNDS, outcome="y")
        included = draw_inclusion(CANARIES)
        if first is None:
            first = (canaries, included)
        tick = time.perf_counter()
        run = audit_training(trainer, frames, canaries, site="a",
                             privacy=fedstats.RecordDP(epsilon=EPSILON, delta=DELTA),
                             guess_grid=GRID, included=included, ledgers=site_ledgers(frames),
                             study="audit")  # fmt: skip
        seconds.append(time.perf_counter() - tick)
        private.append(run)
    canaries, included = first
    tick = time.perf_counter()
    control = audit_training(trainer, frames, canaries, site="a", privacy=None, delta=DELTA,
                             guess_grid=GRID, included=included)  # fmt: skip
    control_seconds = time.perf_counter() - tick
    print(
        json.dumps(
            {
                "benchmark": "deep_audit",
                "canaries": CANARIES,
                "guess_grid": GRID,
                "confidence": 0.95,
                "target_epsilon": EPSILON,
                "delta": DELTA,
                "private_epsilon_lower": [round(r.epsilon_lower, 4) for r in private],
                "accounted_epsilon": [round(r.accounted_epsilon, 6) for r in private],
                "private_inserted": [r.inserted for r in private],
                "private_within_accounted": all(
                    r.epsilon_lower <= r.accounted_epsilon for r in private
                ),
                "control_epsilon_lower": round(control.epsilon_lower, 4),
                "control_guesses": control.result.guesses,
                "control_correct": control.result.correct,
                "control_detects": control.epsilon_lower >= 0.5,
                "seconds_private_mean": round(float(np.mean(seconds)), 2),
                "seconds_control": round(control_seconds, 2),
            }
        )
    )


if __name__ == "__main__":
    main()
