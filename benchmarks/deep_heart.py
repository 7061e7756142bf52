"""Federated networks on the heart-disease hospitals, beside FLamby and the exact fit.

FLamby's Fed-Heart-Disease split and preprocessing (per site 66/34
train/test, ``train_test_split(random_state=43)``, stratified where the site
has two patients of each outcome). Training and scoring on a test split are
exact releases, so the sites' small-cell rules apply (``k_cell = 2``, the least
a site may set). FLamby's split of the reference model
``fedstats.datasets.HEART_FORMULA`` leaves cells of one patient, so the design
recodes two covariates globally: chest pain as non-anginal, asymptomatic or
angina (typical and atypical together, the reference) and the resting ECG as
normal or abnormal (``fedstats.datasets.HEART_EXACT_FORMULA``). With it
Cleveland and Hungary answer every exact request; VA's training split holds
two women, one with disease (a cell of one: refused, rule ``cross-cells``), and
Switzerland's training split is all one outcome (refused: a one-class
aggregate discloses every patient's outcome). Every method trains at Cleveland
and Hungary and is scored on their test splits. Mean per-site test accuracy
(FLamby's summary) over ``--repeats`` seeds of an MLP (one hidden layer of 16)
trained by FedAvg, FedProx, SCAFFOLD and FedAvg with a FedAdam server, and by
DP-SGD FedAvg at epsilon 1, delta 1e-3 per site; beside the exact federated
logistic regression on the same training rows (the reference) and FLamby's
published figures over its four test splits, for orientation (pooled 0.735,
FedAvg 0.685, FedAdam 0.726, DP-SGD at epsilon 1: 0.702). One JSON line.

    .venv/bin/python benchmarks/deep_heart.py [--repeats 5]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402

import accounting  # noqa: E402
import fedstats  # noqa: E402
from fedstats import datasets  # noqa: E402
from fedstats.contract.design import feature_scaling  # noqa: E402
from fedstats.deep import FederatedTrainer  # noqa: E402
from fedstats.models.agree import agree_design  # noqa: E402

# Chest pain as non-anginal, asymptomatic or angina (the reference); ECG normal or abnormal.
FORMULA = datasets.HEART_EXACT_FORMULA.replace("C(cp)", "I(cp == 3) + I(cp == 4)")
BOUNDS = {**datasets.HEART_BOUNDS, "I(cp == 3)": (0, 1), "I(cp == 4)": (0, 1),
          "I(restecg > 0)": (0, 1)}  # fmt: skip
SITES = ("cleveland", "hungary")
# k_cell = 2 (min_count = 1): Hungary's test split holds a cell of two patients (fasting
# blood sugar crossed with disease), which the default 3 would refuse.
POLICY = fedstats.DisclosurePolicy(max_parameter_ratio=0.5, min_count=1)
HYPER = {"hidden": [16]}
SETTINGS = {
    "fedavg": {"algorithm": "fedavg"},
    "fedprox": {"algorithm": "fedprox", "mu": 0.1},
    "scaffold": {"algorithm": "scaffold"},
    "fedadam": {"algorithm": "fedavg", "server_optimizer": "adam", "server_lr": 0.05},
}


def trainer(seed: int, **options) -> FederatedTrainer:
    settings = dict(formula=FORMULA, bounds=BOUNDS, rounds=20, local_steps=10, lr=0.05,
                    batch_size=16, seed=seed, progress=False)  # fmt: skip
    settings.update(options)
    return FederatedTrainer("mlp", HYPER, **settings)


def logistic_accuracy(train: dict, test: dict) -> float:
    """Mean per-site test accuracy of the exact federated logistic regression (threshold 1/2)."""
    train_fed = fedstats.Federation.in_process(train, disclosure=POLICY)
    fit = fedstats.LogisticRegression(FORMULA).fit(train_fed)
    network = FederatedTrainer("linear", {}, formula=FORMULA, bounds=BOUNDS, local_steps=1,
                               progress=False)  # fmt: skip
    agreement = agree_design(train_fed, FORMULA, analysis="design")
    scaling = feature_scaling(agreement.layout, agreement.spec.columns, BOUNDS, train_fed.sites)
    evaluation = network.evaluate(
        fedstats.Federation.in_process(test, disclosure=POLICY),
        linear_weights(fit, network),
        spec_wire=agreement.spec.to_wire(),
        scaling=scaling,
    )
    return evaluation.mean_site_accuracy


def linear_weights(fit, network: FederatedTrainer) -> list[np.ndarray]:
    """The logistic coefficients as the ``linear`` network's weights on [-1, 1]-scaled inputs."""
    params = fit.params
    names = [c for c in params.index if c != "Intercept"]
    low_high = {c: BOUNDS.get(c) for c in names}
    weight, bias = [], float(params["Intercept"])
    for name in names:
        bounds = low_high[name]
        centre, half = ((bounds[0] + bounds[1]) / 2, (bounds[1] - bounds[0]) / 2) if bounds else (
            0.0, 1.0)  # fmt: skip
        weight.append(params[name] * half)
        bias += params[name] * centre
    return [np.array([weight], dtype=np.float32), np.array([bias], dtype=np.float32)]


def refusal(frame) -> str:
    """Why a site's training split cannot take part: the error its exact fit raises."""
    try:
        fedstats.LogisticRegression(FORMULA).fit(
            fedstats.Federation.in_process({"site": frame}, disclosure=POLICY)
        )
    except fedstats.DisclosureError as error:
        return f"DisclosureError, rule {error.rule}"
    except fedstats.NoEventsError:
        return "NoEventsError: the training split has one outcome"
    raise AssertionError("a site outside SITES answered the exact fit")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    train, test = datasets.heart_disease_split()
    refusals = {site: refusal(train[site]) for site in train if site not in SITES}
    trainable = {site: train[site] for site in SITES}
    test = {site: test[site] for site in SITES}
    test_fed = fedstats.Federation.in_process(test, disclosure=POLICY)
    scores: dict[str, list[float]] = {name: [] for name in [*SETTINGS, "dp_fedavg"]}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.repeats):
            for name, options in SETTINGS.items():
                fed = fedstats.Federation.in_process(trainable, disclosure=POLICY)
                result = trainer(seed, **options).fit(fed, evaluation=test_fed)
                scores[name].append(result.evaluation.mean_site_accuracy)
            books = {}
            for site in trainable:
                books[site] = accounting.Ledger(Path(tmp) / f"{site}-{seed}.db")
                books[site].set_budget(
                    accounting.Scope(unit="patient", owner=site, study="heart"),
                    epsilon=1.0,
                    delta=1e-3,
                )
            fed = fedstats.Federation.in_process(trainable, disclosure=POLICY, study="heart",
                                                 ledgers=books)  # fmt: skip
            private = trainer(seed, rounds=10, lr=0.1).fit(
                fed, privacy=fedstats.RecordDP(epsilon=1.0, delta=1e-3), evaluation=test_fed
            )
            scores["dp_fedavg"].append(private.evaluation.mean_site_accuracy)
    print(
        json.dumps(
            {
                "benchmark": "deep_heart",
                "repeats": args.repeats,
                "model": f"mlp {HYPER}",
                "mean_site_accuracy": {k: round(float(np.mean(v)), 4) for k, v in scores.items()},
                "min_over_repeats": {k: round(float(np.min(v)), 4) for k, v in scores.items()},
                "exact_logistic_regression": round(logistic_accuracy(trainable, test), 4),
                "dp_epsilon": 1.0,
                "dp_delta": 1e-3,
                "dp_noise_multiplier": round(private.dp_schedule.noise_multiplier, 4),
                "dp_sample_rate": round(private.dp_schedule.sample_rate, 4),
                "flamby": {"pooled": 0.735, "fedavg": 0.685, "fedprox": 0.685,
                           "scaffold": 0.684, "fedadam": 0.726, "dp_sgd_epsilon_1": 0.702},
                "training_sites": sorted(trainable),
                "evaluated_sites": sorted(test),
                "refused_exact_fit": refusals,
            }
        )
    )  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
