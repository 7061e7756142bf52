"""Fits over Flower (a SuperLink, three SuperNodes: separate processes) equal the embedded runtime.

Each site's SuperNode reads its own site.toml (frame, ledger, policy); the
coordinator's ServerApp makes the fits of study.toml through the codec's
bytes carried in Flower messages. The same fits on ``Federation.in_process``
with the same frames are the reference: coefficients, standard errors and
log-likelihoods agree to 1e-10.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from fedstats import Federation, datasets
from fedstats.flower.local_study import LocalStudy, write_study
from fedstats.site_journal import SiteJournal, reconcile
from fedstats.study_config import load_study_config
from fedstats.study_fits import run_fits

SITES = ["region_0", "region_1", "region_2"]
COVARIATES = "age_at_index + ajcc_pathologic_n_n0_i + prior_malignancy_yes"
FITS = f"""
[[fits]]
kind = "logistic"
name = "event_logistic"
formula = "event ~ {COVARIATES}"

[[fits]]
kind = "cox"
name = "survival_cox"
formula = "Surv(time, event) ~ {COVARIATES}"
strata = "site"
"""


@pytest.fixture(scope="module")
def flower_study(tmp_path_factory: pytest.TempPathFactory):
    frames = {s: f for s, f in datasets.tcga_brca().frames.items() if s in SITES}
    root = tmp_path_factory.mktemp("flower")
    bench = LocalStudy(root)
    try:
        bench.start(frames)
        out = root / "out"
        study = write_study(root, SITES, FITS, out=out)
        started = time.perf_counter()
        status = bench.run(study, out)
        seconds = time.perf_counter() - started
        yield {
            "bench": bench,
            "frames": frames,
            "status": status,
            "study": study,
            "out": out,
            "seconds": seconds,
        }
    finally:
        bench.close()
        for process in bench.all_processes() + bench.stopped:
            assert process.poll() is not None, f"process {process.args} still runs"


def test_flower_fits_equal_the_embedded_runtime(flower_study, tmp_path: Path) -> None:
    """Logistic regression and site-stratified Cox: Flower vs in-process, |diff| <= 1e-10."""
    status = flower_study["status"]
    assert status["status"] == "completed", status
    config = load_study_config(flower_study["study"])
    embedded_config = config.model_copy(
        update={"study": config.study.model_copy(update={"out": tmp_path})}
    )
    embedded = run_fits(embedded_config, Federation.in_process(flower_study["frames"]))
    for name in ("event_logistic", "survival_cox"):
        over_flower = json.loads((flower_study["out"] / "results" / f"{name}.json").read_text())
        reference = embedded[name]
        assert list(over_flower["params"]) == list(reference["params"])
        for key in ("params", "bse"):
            a = np.array(list(over_flower[key].values()))
            b = np.array(list(reference[key].values()))
            assert np.max(np.abs(a - b)) <= 1e-10, (name, key, a - b)
        assert abs(over_flower["llf"] - reference["llf"]) <= 1e-10
        assert over_flower["provenance"]["rounds"] == reference["provenance"]["rounds"]


def test_every_message_went_through_flower_and_every_site_journaled_it(flower_study) -> None:
    """The inventory counts the fingerprint check and every fit's messages; each site's
    journal records as many answered requests as the coordinator sent it, and reconciles."""
    status = flower_study["status"]
    inventory = [
        json.loads(line)
        for line in (flower_study["out"] / f"inventory-{status['run_id']}.jsonl")
        .read_text()
        .splitlines()
    ]
    assert len(inventory) == status["messages"]
    assert inventory[0]["task"] == "harmonize.fingerprint"
    assert all(row["status"] == "ok" for row in inventory)
    bench = flower_study["bench"]
    for site in SITES:
        journal = SiteJournal(bench.site_configs[site].parent / "work" / "journal.jsonl")
        sent = [row for row in inventory if row["site"] == site]
        answered = [r for r in journal.records() if r["event"] == "answered"]
        assert len(answered) == len(sent)
        assert [r["task"] for r in answered] == [row["task"] for row in sent]
        assert reconcile(journal, None).ok
