"""Studies of 10, 30 and 100 sites on Flower's simulation engine: exactness, time and bytes.

For each number of sites, one study runs on Flower's simulation engine
(``LocalStudy(root, simulation=True)``: a SuperLink with ``--simulation``,
whose ``flwr-simulation`` runs the fedstats ClientApp of every site on a
virtual SuperNode, a Ray actor; the same ServerApp, ClientApp, site code,
codec and boundary rules as a deployment; the sites pin the study's roster and
answer exact iterative fits only on verified paths, as ``fedstats site run``
requires). Its fits: exact logistic
regression and a Cox model stratified by site, each with plain replies and
with secure aggregation. In the same run the pooled fits are made on the
concatenated rows (statsmodels' GLM Binomial, lifelines' ``CoxPHFitter``
with ``strata=["site"]``) and each study fit is compared with them
(``max_abs_diff_params`` and ``..._bse``; target 1e-8).

A *round* of an iterative fit is one Newton step: one request to every site
(plain), or the four requests of a secure-aggregation session (advertise,
share, the masked task, unmask). Read from the study's message inventory:
``round_seconds`` (the fit's wall time over its Newton steps, divided by
their number) and ``bytes_per_site_per_round`` (every request and reply of
those steps, divided by steps and sites). Target: at 100 sites, secure
aggregation (SecAgg+, the default construction) takes at most 3 x plain's bytes per site
per round. On verified paths a plain round relays the previous round's signed replies of
every site, so it too grows with the number of sites; ``overhead_bytes_per_site_per_round``
is what secure aggregation adds.
Prints one JSON line.

    .venv/bin/python benchmarks/flower_simulation.py [--sites 10 30 100] [--per-site 200]
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
import warnings  # noqa: E402
from collections import defaultdict  # noqa: E402
from datetime import datetime  # noqa: E402

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import statsmodels.api as sm  # noqa: E402
from lifelines import CoxPHFitter  # noqa: E402

from fedstats.flower.local_study import LocalStudy, write_study  # noqa: E402

EXACT_TARGET = 1e-8
BYTES_TARGET = 3.0
SETUP_TASKS = {"harmonize.fingerprint", "describe", "prepare"}
FIT_NAMES = ("logistic_plain", "logistic_secure", "cox_plain", "cox_secure")


def fits(terms: str, secure: str) -> str:
    """The study's ``[[fits]]``: each model plain and with secure aggregation."""
    outcome = {"logistic": "y", "cox": "Surv(time, event)"}
    tables = []
    for name in FIT_NAMES:
        kind, mode = name.split("_")
        table = (
            f'[[fits]]\nkind = "{kind}"\nname = "{name}"\nformula = "{outcome[kind]} ~ {terms}"\n'
        )
        if mode == "secure":
            table += f"secure_aggregation = {{ {secure} }}\n"
        tables.append(table)
    return "\n".join(tables)


def covariates(p: int) -> list[str]:
    return [f"x{j + 1}" for j in range(p)]


def synthetic_sites(n_sites: int, per_site: int, p: int, seed: int) -> dict[str, pd.DataFrame]:
    """Sites with covariates shifted per site, a logistic outcome and a censored survival time."""
    rng = np.random.default_rng(seed)
    beta = rng.normal(0, 0.6 / np.sqrt(p), p)
    frames = {}
    for s in range(n_sites):
        X = rng.normal(rng.normal(0, 0.4, p), 1.0, size=(per_site, p))
        eta = X @ beta
        y = (rng.random(per_site) < 1 / (1 + np.exp(-(eta - 0.3)))).astype(np.int64)
        event_time = rng.exponential(1 / (0.1 * np.exp(eta)))
        censor_time = rng.exponential(12.0, per_site)
        frame = pd.DataFrame(X, columns=covariates(p))
        frame["y"] = y
        frame["time"] = np.round(np.minimum(event_time, censor_time), 6) + 0.001
        frame["event"] = (event_time <= censor_time).astype(np.int64)
        frames[f"site{s + 1:03d}"] = frame
    return frames


def pooled_fits(
    frames: dict[str, pd.DataFrame], columns: list[str]
) -> dict[str, tuple[pd.Series, pd.Series]]:
    """(params, bse) of the pooled logistic and site-stratified Cox fits."""
    pooled = pd.concat([f.assign(site=name) for name, f in frames.items()], ignore_index=True)
    X = sm.add_constant(pooled[columns])
    logistic = sm.GLM(pooled["y"], X, family=sm.families.Binomial()).fit(tol=1e-13)
    params = logistic.params.rename({"const": "Intercept"})
    bse = logistic.bse.rename({"const": "Intercept"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cox = CoxPHFitter().fit(
            pooled[[*columns, "time", "event", "site"]],
            "time",
            "event",
            strata=["site"],
            fit_options={"precision": 1e-12},
        )
    return {"logistic": (params, bse), "cox": (cox.params_, cox.standard_errors_)}


def rounds_of(rows: list[dict], analysis: str, n_sites: int) -> dict:
    """Time and bytes per Newton step of one analysis, from the message inventory."""
    mine = [r for r in rows if r["analysis"] == analysis and r["task"] not in SETUP_TASKS]
    by_task: dict[str, int] = defaultdict(int)
    for row in mine:
        by_task[row["task"]] += 1
    steps = max(by_task.values()) // n_sites  # the masked task or the plain one, once per step
    start = min(datetime.fromisoformat(r["sent_at"]).timestamp() for r in mine)
    end = max(datetime.fromisoformat(r["sent_at"]).timestamp() + r["seconds"] for r in mine)
    total = sum(r["request_bytes"] + r["reply_bytes"] for r in mine)
    tasks = sorted(by_task)
    return {
        "tasks": tasks,
        "rounds": steps,
        "round_seconds": round((end - start) / steps, 4),
        "bytes_per_site_per_round": round(total / (steps * n_sites)),
        "messages_per_site_per_round": round(len(mine) / (steps * n_sites), 2),
    }


def max_diff(ours: dict[str, float], theirs: pd.Series) -> float:
    return float(max(abs(ours[name] - theirs[name]) for name in theirs.index))


def one_study(
    n_sites: int, per_site: int, p: int, seed: int, secure: str, verified_paths: bool
) -> dict:
    frames = synthetic_sites(n_sites, per_site, p, seed)
    pooled = pooled_fits(frames, covariates(p))
    study_fits = fits(" + ".join(covariates(p)), secure)
    with tempfile.TemporaryDirectory(prefix=f"fedstats-simulation-{n_sites}-") as folder:
        root = Path(folder)
        study = LocalStudy(root, simulation=True, verified_paths=verified_paths)
        try:
            started = time.perf_counter()
            study.start(frames)
            out = root / "out"
            config = write_study(root, list(frames), study_fits, out=out, round_timeout=300)
            status = study.run(config, out, timeout=3600)
            wall = time.perf_counter() - started
        finally:
            study.close()
        if status["status"] != "completed":
            raise SystemExit(f"the study of {n_sites} sites failed: {status}")
        rows = [json.loads(line) for line in (out / f"inventory-{status['run_id']}.jsonl").open()]
        results = {
            name: json.loads((out / "results" / f"{name}.json").read_text()) for name in FIT_NAMES
        }
    entry: dict = {
        "patients": n_sites * per_site,
        "secure_aggregation": secure or "defaults",
        "study_seconds_in_serverapp": round(status["seconds"], 1),
        "wall_seconds_with_startup": round(wall, 1),
    }
    worst = 0.0
    for name, record in results.items():
        kind = name.split("_")[0]
        params, bse = pooled[kind]
        fitted = {
            "max_abs_diff_params": max_diff(record["params"], params),
            "max_abs_diff_bse": max_diff(record["bse"], bse),
            **rounds_of(rows, record["provenance"]["analysis"], n_sites),
        }
        worst = max(worst, fitted["max_abs_diff_params"], fitted["max_abs_diff_bse"])
        entry[name] = fitted
    entry["max_abs_diff_vs_pooled"] = worst
    entry["exact_within_target"] = worst <= EXACT_TARGET
    for kind in ("logistic", "cox"):
        plain = entry[f"{kind}_plain"]["bytes_per_site_per_round"]
        secure_bytes = entry[f"{kind}_secure"]["bytes_per_site_per_round"]
        entry[f"{kind}_secure_bytes_vs_plain"] = round(secure_bytes / plain, 2)
        entry[f"{kind}_secure_overhead_bytes_per_site_per_round"] = secure_bytes - plain
        entry[f"{kind}_secure_time_vs_plain"] = round(
            entry[f"{kind}_secure"]["round_seconds"] / entry[f"{kind}_plain"]["round_seconds"], 2
        )
    return entry


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, nargs="+", default=[10, 30, 100])
    parser.add_argument("--per-site", type=int, default=200)
    parser.add_argument("--covariates", type=int, default=20)
    parser.add_argument("--seed", type=int, default=20261127)
    parser.add_argument(
        "--secure",
        default="",
        help='options of the secure fits\' secure_aggregation table, e.g. construction = "secagg"',
    )
    parser.add_argument(
        "--no-verified-paths",
        action="store_true",
        help="sites that do not verify paths (default: they do, as fedstats site run requires)",
    )
    args = parser.parse_args()
    result: dict = {
        "benchmark": "flower_simulation",
        "engine": "flower simulation (ray)",
        "covariates": args.covariates,
        "per_site": args.per_site,
        "verified_paths": not args.no_verified_paths,
    }
    for n_sites in args.sites:
        result[f"sites_{n_sites}"] = one_study(
            n_sites,
            args.per_site,
            args.covariates,
            args.seed,
            args.secure,
            not args.no_verified_paths,
        )
    largest = result[f"sites_{max(args.sites)}"]
    ratio = largest["logistic_secure_bytes_vs_plain"]
    result["largest_secure_bytes_vs_plain"] = ratio
    result["bytes_target"] = BYTES_TARGET
    result["bytes_meets_target"] = ratio <= BYTES_TARGET
    result["exact_target"] = EXACT_TARGET
    result["exact_meets_target"] = all(
        result[f"sites_{n}"]["exact_within_target"] for n in args.sites
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
