"""A study of twelve sites on Flower's simulation engine (the README's block) equals the pooled
fits and the study run in process; each virtual SuperNode serves the site its partition names,
and only that one.

The study (``LocalStudy(root, simulation=True)``) runs the same ServerApp,
ClientApp, site code, codec and boundary rules as a deployment: every site
pins the study's roster of node keys and answers exact iterative fits only
on verified paths. Its fits — logistic regression and a site-stratified Cox
model, each plain and with secure aggregation — are compared with
statsmodels and lifelines on the pooled rows (≤ 1e-8) and with the same
study run over ``Federation.in_process`` (≤ 1e-10).
"""

from __future__ import annotations

import json
import re
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from flwr.app import Context, RecordDict
from lifelines import CoxPHFitter

from fedstats import Federation
from fedstats.errors import ConfigError
from fedstats.flower.local_study import write_simulated_sites
from fedstats.flower_apps.site_app import site_config_path
from fedstats.jobs.site_journal import JOURNAL_FILE
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits

N_SITES = 12
COVARIATES = ["x1", "x2", "x3"]
FITS = """
[[fits]]
kind = "logistic"
name = "logistic_plain"
formula = "y ~ x1 + x2 + x3"

[[fits]]
kind = "logistic"
name = "logistic_secure"
formula = "y ~ x1 + x2 + x3"
secure_aggregation = { threshold = 9 }

[[fits]]
kind = "cox"
name = "cox_plain"
formula = "Surv(time, event) ~ x1 + x2 + x3"

[[fits]]
kind = "cox"
name = "cox_secure"
formula = "Surv(time, event) ~ x1 + x2 + x3"
secure_aggregation = {}
"""


def sites(n_sites: int = N_SITES, per_site: int = 80, seed: int = 7) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    frames = {}
    for s in range(n_sites):
        X = rng.normal(rng.normal(0, 0.4, 3), 1.0, size=(per_site, 3))
        eta = X @ np.array([0.6, -0.4, 0.3])
        event_time = rng.exponential(1 / (0.1 * np.exp(eta)))
        censor_time = rng.exponential(12.0, per_site)
        frame = pd.DataFrame(X, columns=COVARIATES)
        frame["y"] = (rng.random(per_site) < 1 / (1 + np.exp(-eta))).astype(np.int64)
        frame["time"] = np.round(np.minimum(event_time, censor_time), 4) + 0.001
        frame["event"] = (event_time <= censor_time).astype(np.int64)
        frames[f"site{s + 1:02d}"] = frame
    return frames


README = Path(__file__).resolve().parents[2] / "README.md"
README_SECTION = "### Many sites on one machine: Flower's simulation engine"


def readme_block() -> str:
    """The README's Python block of the simulation-engine section, as printed."""
    section = README.read_text(encoding="utf-8").split(README_SECTION, 1)[1]
    return re.search(r"```python\n(.*?)```", section, flags=re.DOTALL).group(1)


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The README's block, run on the twelve sites with this file's fits."""
    frames = sites()
    root = tmp_path_factory.mktemp("simulation")
    namespace = {"root": root, "frames": frames, "FITS": FITS}
    exec(compile(readme_block(), "README.md:simulation engine", "exec"), namespace)
    status, study, config_path = namespace["status"], namespace["study"], namespace["config"]
    assert status["status"] == "completed", status
    assert study.simulation and study.verified_paths
    out = root / "out"
    config = load_study_config(config_path)
    embedded = config.model_copy(
        update={"study": config.study.model_copy(update={"out": root / "embedded"})}
    )
    inventory = out / f"inventory-{status['run_id']}.jsonl"
    return {
        "frames": frames,
        "status": status,
        "site_configs": dict(study.site_configs),  # type: ignore[attr-defined]
        "inventory": [json.loads(line) for line in inventory.read_text().splitlines()],
        "results": {
            fit.name: json.loads((out / "results" / f"{fit.name}.json").read_text())
            for fit in config.fits
        },
        "embedded": run_fits(embedded, Federation.in_process(frames)),
    }


def pooled_reference(frames: dict[str, pd.DataFrame]) -> dict[str, tuple[pd.Series, pd.Series]]:
    pooled = pd.concat([f.assign(site=name) for name, f in frames.items()], ignore_index=True)
    logistic = sm.GLM(
        pooled["y"], sm.add_constant(pooled[COVARIATES]), family=sm.families.Binomial()
    ).fit(tol=1e-13)
    rename = {"const": "Intercept"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cox = CoxPHFitter().fit(
            pooled[[*COVARIATES, "time", "event", "site"]],
            "time",
            "event",
            strata=["site"],
            fit_options={"precision": 1e-12},
        )
    return {
        "logistic": (logistic.params.rename(rename), logistic.bse.rename(rename)),
        "cox": (cox.params_, cox.standard_errors_),
    }


def test_every_fit_equals_the_pooled_fit_and_the_study_in_process(simulated) -> None:
    reference = pooled_reference(simulated["frames"])
    for name, record in simulated["results"].items():
        params, bse = reference[name.split("_")[0]]
        for key, expected in (("params", params), ("bse", bse)):
            got = pd.Series(record[key])[expected.index]
            assert np.max(np.abs(got - expected)) <= 1e-8, (name, key, got - expected)
        embedded = simulated["embedded"][name]
        for key in ("params", "bse"):
            got, same = pd.Series(record[key]), pd.Series(embedded[key])[list(record[key])]
            assert np.max(np.abs(got - same)) <= 1e-10, (name, key, got - same)


def test_each_site_answered_on_verified_paths_and_journaled_every_request(simulated) -> None:
    rows = simulated["inventory"]
    assert {row["site"] for row in rows} == set(simulated["frames"])
    assert {row["status"] for row in rows} == {"ok"}
    rounds = [r for r in rows if r["task"] in {"logistic.summaries", "cox.summaries"}]
    assert rounds and {r["path"] for r in rounds} == {"verified"}
    secure = {r["analysis"] for r in rows if r["task"] == "secagg.unmask"}
    assert len(secure) == 2  # both secure fits ran their sessions
    for site, config in simulated["site_configs"].items():
        journal = config.parent / "work" / JOURNAL_FILE
        answered = [
            line for line in journal.read_text().splitlines() if '"event": "answered"' in line
        ]
        assert len(answered) == sum(row["site"] == site for row in rows), site


def context(node_config: dict, run_config: dict) -> Context:
    return Context(
        run_id=1, node_id=2, node_config=node_config, state=RecordDict(), run_config=run_config
    )


def test_a_deployed_node_serves_its_own_site_config_whatever_the_run_config_names(
    tmp_path: Path,
) -> None:
    """A coordinator's run config cannot point a SuperNode at another site.toml: a node with
    ``site-config`` never reads ``simulated-sites``; a node with neither refuses."""
    listing = write_simulated_sites(tmp_path / "sites.toml", [tmp_path / "other" / "site.toml"])
    own = tmp_path / "own" / "site.toml"
    crafted = {"simulated-sites": str(listing)}
    node = {"site-config": str(own), "partition-id": 0}
    assert site_config_path(context(node, crafted)) == own
    with pytest.raises(ConfigError, match="site-config"):
        site_config_path(context({}, crafted))
    simulated_node = {"partition-id": 0, "num-partitions": 1}
    assert site_config_path(context(simulated_node, crafted)) == (tmp_path / "other" / "site.toml")
    with pytest.raises(ConfigError, match="partition 3"):
        site_config_path(context({"partition-id": 3}, crafted))
