"""A study over TLS with SuperNode authentication, as Flower provides them.

One SuperLink started with a certificate signed by a study CA made here
(:mod:`fedstats.flower.study_pki`) and ``--enable-supernode-auth``; three
sites whose ECDSA P-256 node keys are registered (``flwr supernode
register``) and whose SuperNodes trust the study CA. A logistic fit over it
equals the embedded runtime (``Federation.in_process`` on the same frames) to
1e-10. A SuperNode whose key was never registered is refused by the
SuperLink, and one that does not trust the study CA cannot connect: neither
site receives a single request, and a study expecting them fails in
discovery naming both.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from flower_study import SITES, stopped_after

from fedstats import Federation, datasets
from fedstats.flower.local_study import LocalStudy, write_study
from fedstats.jobs.site_journal import SiteJournal
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits

UNREGISTERED = "unregistered_site"
UNTRUSTING = "untrusting_site"
FITS = """
[[fits]]
kind = "logistic"
name = "event_logistic"
formula = "event ~ age_at_index + ajcc_pathologic_n_n1 + prior_malignancy_yes"
"""


@pytest.fixture(scope="module")
def secure_study(tmp_path_factory: pytest.TempPathFactory):
    frames = {s: f for s, f in datasets.tcga_brca().frames.items() if s in SITES}
    local = LocalStudy(
        tmp_path_factory.mktemp("tls"), tls=True, node_auth=True, verified_paths=True
    )
    with stopped_after(local):
        local.start(frames)
        yield local, frames


def test_logistic_over_tls_and_node_auth_equals_the_embedded_runtime(
    secure_study, tmp_path: Path
) -> None:
    """Flower (TLS, authenticated nodes) vs ``Federation.in_process``: |diff| <= 1e-10."""
    local, frames = secure_study
    assert "https://127.0.0.1" in (local.root / "link" / "superlink.log").read_text()
    out = local.root / "out"
    study = write_study(local.root, SITES, FITS, out=out)
    status = local.run(study, out)
    assert status["status"] == "completed", status
    # The coordinator reached each site through the node its registered key was given.
    assert status["nodes"] == {site: str(local.registered[site]) for site in SITES}

    config = load_study_config(study)
    embedded_config = config.model_copy(
        update={"study": config.study.model_copy(update={"out": tmp_path})}
    )
    reference = run_fits(embedded_config, Federation.in_process(frames))["event_logistic"]
    over_flower = json.loads((out / "results" / "event_logistic.json").read_text())
    assert list(over_flower["params"]) == list(reference["params"])
    for key in ("params", "bse"):
        a = np.array(list(over_flower[key].values()))
        b = np.array(list(reference[key].values()))
        assert np.max(np.abs(a - b)) <= 1e-10, (key, a - b)
    assert abs(over_flower["llf"] - reference["llf"]) <= 1e-10
    assert over_flower["provenance"]["rounds"] == reference["provenance"]["rounds"]


@pytest.fixture(scope="module")
def refused_nodes(secure_study):
    """Two more sites: one whose node key is not registered, one not trusting the study CA."""
    local, frames = secure_study
    local.add_site(UNREGISTERED, frames["region_0"], registered=False)
    local.add_site(UNTRUSTING, frames["region_0"], trusted=False)
    logs = {site: wait_for_exit(local, site) for site in (UNREGISTERED, UNTRUSTING)}
    return local, logs


def wait_for_exit(local: LocalStudy, site: str, timeout: float = 60) -> str:
    """Wait for the site's SuperNode (the first of its processes) to give up; its log."""
    node = local.nodes[site][0]
    deadline = time.monotonic() + timeout
    while node.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"the SuperNode of {site} still runs: {local.logs()}")
        time.sleep(0.1)
    assert node.returncode != 0
    (log,) = (local.root / "nodes").glob(f"{site}-*/supernode.log")
    return log.read_text(errors="replace")


def test_a_node_with_an_unregistered_key_is_refused(refused_nodes) -> None:
    local, logs = refused_nodes
    assert UNREGISTERED not in local.registered
    assert "Failed to activate SuperNode" in logs[UNREGISTERED]
    superlink_log = (local.root / "link" / "superlink.log").read_text()
    assert "No SuperNode found with the given public key" in superlink_log


def test_a_node_without_the_study_ca_cannot_connect(refused_nodes) -> None:
    local, logs = refused_nodes
    assert UNTRUSTING in local.registered  # its key is fine: only the TLS check stops it
    assert "CERTIFICATE_VERIFY_FAILED" in logs[UNTRUSTING]


def test_a_study_expecting_refused_sites_names_them_and_they_never_get_a_request(
    refused_nodes,
) -> None:
    local, _logs = refused_nodes
    out = local.root / "out-refused"
    sites = [*SITES, UNREGISTERED, UNTRUSTING]
    study = write_study(local.root, sites, FITS, out=out, discovery_timeout=10)
    status = local.run(study, out)
    assert status["status"] == "failed"
    assert status["error_type"] == "SitesMissingError"
    assert f"{sorted([UNREGISTERED, UNTRUSTING])}" in status["error"]
    assert not (out / "results" / "event_logistic.json").exists()
    for site in (UNREGISTERED, UNTRUSTING):
        journal = SiteJournal(local.site_configs[site].parent / "work" / "journal.jsonl")
        assert list(journal.records()) == []


def test_study_pki_command_makes_what_flower_needs(tmp_path: Path, capsys) -> None:
    """``python -m fedstats.flower.study_pki``: a CA, a SuperLink certificate chaining to it
    with the given names, an OpenSSH P-256 node key pair; private keys owner-only; no file
    is ever overwritten."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    from fedstats.flower import study_pki

    pki = tmp_path / "pki"
    study_pki.main(["ca", "--out", str(pki), "--study", "trial"])
    study_pki.main(["superlink", "--out", str(pki), "--host", "127.0.0.1", "--host", "link.test"])
    study_pki.main(["node", "--out", str(pki / "site_a"), "--site", "site_a"])
    ca = x509.load_pem_x509_certificate((pki / "study-ca.crt").read_bytes())
    server = x509.load_pem_x509_certificate((pki / "superlink.crt").read_bytes())
    server.verify_directly_issued_by(ca)
    names = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in names.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert names.get_values_for_type(x509.DNSName) == ["link.test"]
    public = serialization.load_ssh_public_key((pki / "site_a" / "node.pub").read_bytes())
    private = serialization.load_ssh_private_key((pki / "site_a" / "node.key").read_bytes(), None)
    assert isinstance(public, ec.EllipticCurvePublicKey) and public.curve.name == "secp256r1"
    assert private.public_key() == public
    for key in ("study-ca.key", "superlink.key", "site_a/node.key"):
        assert (pki / key).stat().st_mode & 0o777 == 0o600, key
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        study_pki.main(["ca", "--out", str(pki), "--study", "again"])
    assert refused.value.code == 2
    assert "study-ca.crt" in capsys.readouterr().err
    assert x509.load_pem_x509_certificate((pki / "study-ca.crt").read_bytes()) == ca
