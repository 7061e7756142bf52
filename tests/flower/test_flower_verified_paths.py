"""Verified paths over Flower: every site re-derives each point, and the fits are unchanged.

One SuperLink and three SuperNodes (separate processes); each site pins the study's roster
of node keys and sets ``[disclosure] verified_paths = true``. The coordinator relays each
round's signed replies through Flower; logistic regression, a Poisson rate model and the
site-stratified Cox model equal the same fits in process to 1e-10, in the same rounds, and
every exact round the inventory records was answered on a verified path.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flower_study import SITES, TERMS, stopped_after

from fedstats import Federation, datasets
from fedstats.flower.local_study import LocalStudy, write_study
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits

FITS = f"""
[[fits]]
kind = "logistic"
name = "event_logistic"
formula = "event ~ {TERMS}"

[[fits]]
kind = "glm"
name = "death_rate"
formula = "event ~ {TERMS}"
family = "poisson"
exposure = "time"

[[fits]]
kind = "cox"
name = "survival_cox"
formula = "Surv(time, event) ~ {TERMS}"
strata = "site"
"""
PATH_TASKS = {"logistic.summaries", "glm.summaries", "cox.summaries"}


@pytest.fixture(scope="module")
def verified(tmp_path_factory: pytest.TempPathFactory) -> dict:
    frames = {s: f for s, f in datasets.tcga_brca().frames.items() if s in SITES}
    root = tmp_path_factory.mktemp("verified")
    local = LocalStudy(root, verified_paths=True)
    with stopped_after(local):
        local.start(frames)
        out = root / "out"
        study = write_study(root, SITES, FITS, out=out)
        status = local.run(study, out)
    config = load_study_config(study)
    embedded = config.model_copy(
        update={"study": config.study.model_copy(update={"out": root / "embedded"})}
    )
    inventory = [
        json.loads(line)
        for line in (out / f"inventory-{status['run_id']}.jsonl").read_text().splitlines()
    ]
    return {
        "status": status,
        "inventory": inventory,
        "over_flower": {
            fit.name: json.loads((out / "results" / f"{fit.name}.json").read_text())
            for fit in config.fits
        },
        "embedded": run_fits(embedded, Federation.in_process(frames)),
    }


def test_every_exact_round_was_answered_on_a_verified_path(verified) -> None:
    assert verified["status"]["status"] == "completed", verified["status"]
    assert verified["status"]["site_paths"] == sorted(SITES)
    rounds = [row for row in verified["inventory"] if row["task"] in PATH_TASKS]
    assert rounds and {row["site"] for row in rounds} == set(SITES)
    assert all(row["status"] == "ok" and row["path"] == "verified" for row in rounds)


def test_fits_on_verified_paths_equal_the_embedded_runtime(verified) -> None:
    for name in ("event_logistic", "death_rate", "survival_cox"):
        over_flower, reference = verified["over_flower"][name], verified["embedded"][name]
        for key in ("params", "bse"):
            a = np.array(list(over_flower[key].values()))
            b = np.array(list(reference[key].values()))
            assert np.max(np.abs(a - b)) <= 1e-10, (name, key, a - b)
        assert over_flower["provenance"]["rounds"] == reference["provenance"]["rounds"]
