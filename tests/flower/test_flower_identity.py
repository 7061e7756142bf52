"""Site identity over real Flower processes: a registered node claiming another site's name.

The attack (issue 27, item 3): over TLS with SuperNode authentication, a
registered node of another party whose site.toml says ``region_1`` was served
as ``region_1`` and the study's coefficients were the fit on its rows. Here
the study's enrolment list (signed by the study CA) binds each name to its
node key. Two extra nodes run beside the three sites, both registered with
the SuperLink and both saying ``region_1``:

- ``region_3``: an enrolled party of the study, with its own key, whose
  site.toml claims ``region_1`` and does not check the enrolment (a
  malicious node): the coordinator refuses it, naming both fingerprints;
- ``forger``: a registered key that is not enrolled, with the study's files
  (site.toml ``region_1`` and the enrolment list): it refuses to serve at all.

The study completes with the real sites, and its logistic fit equals the
in-process fit on the real sites' frames (and differs from the fit on the
impostor's rows, so the check would notice the attack).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives import serialization
from flower_study import SITES, stopped_after

from fedstats import Federation, datasets
from fedstats.flower.enrolment import fingerprint
from fedstats.flower.local_study import LocalStudy, write_study
from fedstats.jobs.site_journal import SiteJournal
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits

IMPOSTOR = "region_3"
FORGER = "forger"
FITS = """
[[fits]]
kind = "logistic"
name = "event_logistic"
formula = "event ~ age_at_index + ajcc_pathologic_n_n1"
"""


@pytest.fixture(scope="module")
def impostor_study(tmp_path_factory: pytest.TempPathFactory):
    frames = datasets.tcga_brca().frames
    real = {s: frames[s] for s in SITES}
    root = tmp_path_factory.mktemp("identity")
    # the real sites verify paths; the impostor and the forger are on no roster
    local = LocalStudy(root, tls=True, node_auth=True, enrol=True, verified_paths=True)
    with stopped_after(local):
        local.start(real, parties=[IMPOSTOR])
        local.add_site(IMPOSTOR, frames[IMPOSTOR], claims="region_1", checks_enrolment=False)
        local.add_site(FORGER, frames[IMPOSTOR], claims="region_1")
        local.wait_online([*SITES, IMPOSTOR, FORGER])
        out = root / "out"
        study = write_study(root, SITES, FITS, out=out, identity=local.identity, identify_grace=60)
        status = local.run(study, out, timeout=300)
    config = load_study_config(study)
    return local, status, out, config, frames


def _fit(config, frames: dict, out: Path) -> dict:
    embedded = config.model_copy(update={"study": config.study.model_copy(update={"out": out})})
    return run_fits(embedded, Federation.in_process(frames))["event_logistic"]


def _key_fingerprint(local: LocalStudy, name: str) -> str:
    key = serialization.load_ssh_public_key(local.node_keys[name].public_key.read_bytes())
    return fingerprint(key)


def test_the_impostor_is_refused_and_region_1_is_its_enrolled_node(impostor_study) -> None:
    local, status, _out, _config, _frames = impostor_study
    assert status["status"] == "completed", status
    assert status["nodes"] == {site: str(local.registered[site]) for site in SITES}
    identity = status["site_identity"]
    assert identity["enrolment"] == str(local.enrolment)
    assert {site: row["fingerprint"] for site, row in identity["sites"].items()} == {
        site: _key_fingerprint(local, site) for site in SITES
    }
    refused = {r["node"]: r for r in identity["refused"]}
    impostor = refused[str(local.registered[IMPOSTOR])]
    assert impostor["site"] == "region_1"
    assert impostor["fingerprint"] == _key_fingerprint(local, IMPOSTOR)
    assert impostor["enrolled_fingerprint"] == _key_fingerprint(local, "region_1")
    assert "enrolled for site 'region_3'" in impostor["reason"]


def test_the_forged_node_refuses_to_serve_and_neither_answers_a_request(impostor_study):
    local, status, _out, _config, _frames = impostor_study
    assert str(local.registered[FORGER]) not in status["nodes"].values()
    for name in (IMPOSTOR, FORGER):
        journal = SiteJournal(local.site_configs[name].parent / "work" / "journal.jsonl")
        assert list(journal.records()) == [], name
    worker_logs = "".join(
        log.read_text(errors="replace")
        for log in (local.root / "nodes").glob(f"{FORGER}-*/site-worker.log")
    )
    assert "EnrolmentError" in worker_logs and "is not the key" in worker_logs


def test_the_fit_is_the_fit_on_the_real_sites(impostor_study, tmp_path: Path) -> None:
    _local, status, out, config, frames = impostor_study
    assert status["status"] == "completed", status
    over_flower = json.loads((out / "results" / "event_logistic.json").read_text())
    reference = _fit(config, {s: frames[s] for s in SITES}, tmp_path / "real")
    forged = _fit(
        config,
        {
            "region_0": frames["region_0"],
            "region_1": frames[IMPOSTOR],
            "region_2": frames["region_2"],
        },
        tmp_path / "forged",
    )
    a = np.array(list(over_flower["params"].values()))
    assert np.max(np.abs(a - np.array(list(reference["params"].values())))) <= 1e-10
    assert np.max(np.abs(a - np.array(list(forged["params"].values())))) > 1e-3


def test_the_compliance_report_lists_each_sites_key_fingerprint(impostor_study) -> None:
    """The study record keeps what the ServerApp admitted; the report shows it."""
    from fedstats.jobs.study_record import record_and_report
    from fedstats.jobs.study_run import load_results
    from reports import build_report
    from reports.study import Study
    from studyfiles.inventory import MessageInventory

    local, status, out, config, _frames = impostor_study
    inventory = MessageInventory.load(out / f"inventory-{status['run_id']}.jsonl")
    study_toml = local.root / f"study-{out.name}.toml"
    recorded = record_and_report(config, study_toml, status, load_results(config), inventory)
    identities = build_report(Study.load(recorded.study_dir)).site_identities
    assert identities is not None and identities.enrolment == str(local.enrolment)
    assert {(s.site, s.fingerprint, s.enrolled) for s in identities.sites} == {
        (site, _key_fingerprint(local, site), True) for site in SITES
    }
    assert [(r.site, r.fingerprint) for r in identities.refused] == [
        ("region_1", _key_fingerprint(local, IMPOSTOR))
    ]
    html = recorded.html.read_text()
    for name in [*SITES, IMPOSTOR]:
        assert _key_fingerprint(local, name) in html, name
