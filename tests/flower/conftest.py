"""One study over Flower shared by the equality tests: every model kind in one run.

A SuperLink and three SuperNodes (separate processes on loopback) make the
fits of one study.toml — logistic regression, site-stratified Cox,
Kaplan–Meier by nodal status and a seeded FedAvg MLP — and every process is
stopped before the tests compare. Every site pins the study's roster of node
keys and answers exact iterative fits only on verified paths. The same study on
``Federation.in_process`` with the same frames is the reference.
"""

from __future__ import annotations

import json
import time

import pytest
from flower_study import FITS, SITES, stopped_after

from fedstats import Federation, datasets
from fedstats.flower.local_study import LocalStudy, write_study
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits


@pytest.fixture(scope="session")
def tcga_over_flower(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The study's results over Flower and in process, its status, inventory and sites."""
    frames = {s: f for s, f in datasets.tcga_brca().frames.items() if s in SITES}
    root = tmp_path_factory.mktemp("flower")
    local = LocalStudy(root, verified_paths=True)
    with stopped_after(local):
        local.start(frames)
        out = root / "out"
        study = write_study(root, SITES, FITS, out=out)
        started = time.perf_counter()
        status = local.run(study, out)
        seconds = time.perf_counter() - started
    assert status["status"] == "completed", status
    config = load_study_config(study)
    embedded_config = config.model_copy(
        update={"study": config.study.model_copy(update={"out": root / "embedded"})}
    )
    inventory_file = out / f"inventory-{status['run_id']}.jsonl"
    return {
        "status": status,
        "seconds": seconds,
        "out": out,
        "inventory": [json.loads(line) for line in inventory_file.read_text().splitlines()],
        "site_configs": dict(local.site_configs),
        "over_flower": {
            fit.name: json.loads((out / "results" / f"{fit.name}.json").read_text())
            for fit in config.fits
        },
        "embedded": run_fits(embedded_config, Federation.in_process(frames)),
    }
