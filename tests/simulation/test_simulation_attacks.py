"""The silo boundary holds against a malicious coordinator on Flower's simulation engine.

A test Flower App (``attack_app/``: its own ServerApp, fedstats' ClientApp) runs the attacks
of ``tests/security`` against three simulated sites that pin the study's roster and verify
paths (``LocalStudy(root, simulation=True)``): a small cell, a differencing pair, formula
injection, crafted points off the verified path, secure-aggregation sessions with invented
sites or keys the roster did not sign, a private release over the budget and oversized
requests. The same attack code (``attack_app/silo_attacks.py``) then runs in process over
``SiteService.answer`` of copies of the same site folders, made before the simulated run; every
probe must end alike (answered, or refused with the same error type, rule, site and task) and
as the security tests say.

The simulated run's ``simulated-sites`` lists the first site three times: its own entry, the
same path again and the path respelled (``sites/../sites/…``). The coordinator's discovery
admits one node for the name and refuses the study; the attacker asks the site regardless,
through each twin node, for the second fit of a differencing pair: every node reaches the one
silo that remembers the first fit, and each site's journal answers every request once.

Two tests without Flower check the ClientApp's side of that: the partitions of one site.toml,
however spelled, get one service; and while another process (a second ClientApp actor of a
run) serves a simulated site, this one refuses to.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.app import Context, RecordDict

import accounting
import fedstats
from fedstats import Federation
from fedstats.errors import ConfigError, FlowerProcessError
from fedstats.flower import processes
from fedstats.flower.local_study import (
    SIMULATION_FEDERATION,
    STUDY_NAME,
    LocalStudy,
    write_simulated_sites,
    write_site,
    write_study,
)
from fedstats.flower_apps import site_app
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_journal import JOURNAL_FILE, SiteJournal
from fedstats.jobs.site_service import SiteService

APP = Path(__file__).parent / "attack_app"
_spec = importlib.util.spec_from_file_location("silo_attacks", APP / "silo_attacks.py")
silo_attacks = importlib.util.module_from_spec(_spec)
sys.modules["silo_attacks"] = silo_attacks
_spec.loader.exec_module(silo_attacks)

SITES = ("north", "central", "south")
TARGET = SITES[0]
UNUSED_FIT = """
[[fits]]
kind = "logistic"
name = "never_made"
formula = "y ~ x"
"""
"""study.toml needs a fit; the attacking ServerApp reads only its sites and policy."""

EXPECTED = {
    ("small_cell", "indicator of one patient"): ("DisclosureError", "cells"),
    ("differencing", "all rows"): None,
    ("differencing", "two patients fewer"): ("DisclosureError", "differencing"),
    ("formula_injection", "open"): ("FormulaRefusedError", None),
    ("formula_injection", "os.system"): ("FormulaRefusedError", None),
    ("formula_injection", "attribute chain"): ("FormulaRefusedError", None),
    ("crafted_point", "no path"): ("DisclosureError", "path"),
    ("crafted_point", "hand-written path"): ("DisclosureError", "path"),
    ("crafted_point", "one site's path"): ("DisclosureError", "path"),
    ("crafted_point", "text path"): ("DisclosureError", "path"),
    ("crafted_point", "honest round 1"): None,
    ("crafted_point", "round 2 off the step"): ("DisclosureError", "path"),
    ("secure_aggregation_roster", "invented sites"): ("DisclosureError", "roster"),
    ("secure_aggregation_roster", "keys signed by the coordinator"): ("DisclosureError", "roster"),
    ("secure_aggregation_roster", "unsigned keys"): ("DisclosureError", "roster"),
    ("over_budget", "within the budget"): None,
    ("over_budget", "over the budget"): ("BudgetExceededError", None),
    ("oversized", "header"): ("ResourceLimitError", "max_header_bytes"),
    ("oversized", "design columns"): ("ResourceLimitError", "max_design_columns"),
}
"""What each probe gets, as the security tests say (``None``: answered, the attack's control)."""
COMPARED = ("attack", "probe", "outcome", "error_type", "rule", "site", "task", "term")


def copy_sites(root: Path, copy: Path, site_configs: dict[str, Path]) -> dict[str, Path]:
    """The site folders and the roster copied under ``copy``, each site.toml naming its copy."""
    for folder in ("sites", "pki"):
        shutil.copytree(root / folder, copy / folder)
    configs = {}
    for site, path in site_configs.items():
        configs[site] = copy / path.relative_to(root)
        text = configs[site].read_text(encoding="utf-8")
        for folder in ("sites", "pki"):
            text = text.replace(f'"{root / folder}/', f'"{copy / folder}/')
        assert str(root / "sites") not in text and str(root / "pki") not in text
        configs[site].write_text(text, encoding="utf-8")
    return configs


def run_log(study: LocalStudy, run_id: int) -> str:
    """What the run printed (``flwr log``: the ServerApp's and the simulation engine's lines)."""
    done = subprocess.run(
        [str(processes.BIN / "flwr"), "log", str(run_id), processes.CONNECTION, "--show"],
        env=processes.flower_env(study.user_home), capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    return (done.stdout + done.stderr)[-6000:]


def wait_for(path: Path, study: LocalStudy, run_id: int, timeout: float) -> dict:
    """The attack record the run writes, once the run has ended (so that stopping the SuperLink
    leaves no simulation behind); a run that ends without it (the simulation engine stopped
    the ServerApp) or outlasts ``timeout`` fails with its log and the SuperLink's."""
    deadline = time.monotonic() + timeout
    finished: float | None = None
    written: float | None = None
    while time.monotonic() < deadline:
        if study.superlink is not None and study.superlink.poll() is not None:
            raise FlowerProcessError(f"the SuperLink exited: {study.logs()}")
        log = (study.root / "link" / "superlink.log").read_text(errors="replace")
        if finished is None and "Finished task" in log:
            finished = time.monotonic()
        if written is None and path.is_file():
            written = time.monotonic()
        if written is not None and (finished is not None or time.monotonic() > written + 60):
            return json.loads(path.read_text())
        if finished is not None and time.monotonic() > finished + 15:
            break
        time.sleep(0.2)
    raise FlowerProcessError(
        f"run {run_id} wrote no attack record: {run_log(study, run_id)}\n{study.logs()}"
    )


@pytest.fixture(scope="module")
def attacked(tmp_path_factory: pytest.TempPathFactory) -> dict:
    frames = silo_attacks.study_frames(SITES)
    root = tmp_path_factory.mktemp("attacks")
    study = LocalStudy(root, simulation=True, verified_paths=True)
    try:
        study.start(frames)
        for site, path in study.site_configs.items():  # the privacy officer sets each budget
            ledger = accounting.Ledger(load_site_config(path).privacy.ledger)
            ledger.set_budget(accounting.Scope("patient", site, STUDY_NAME), silo_attacks.BUDGET,
                              1e-5)  # fmt: skip
            ledger.close()
        copies = copy_sites(root, root / "in-process", study.site_configs)
        target = study.site_configs[TARGET]
        respelled = f"{root}/sites/../sites/{TARGET}/site.toml"
        listing = write_simulated_sites(
            root / "simulated-sites.toml", [*study.site_configs.values(), target]
        )
        text = listing.read_text(encoding="utf-8").replace("]\n", f'    "{respelled}",\n]\n')
        listing.write_text(text, encoding="utf-8")
        out = root / "out"
        # Ray starts its actor only after the ServerApp has begun discovery: on a loaded
        # machine that takes tens of seconds
        study_toml = write_study(root, list(SITES), UNUSED_FIT, out=out, round_timeout=120,
                                 discovery_timeout=300, identify_grace=10)  # fmt: skip
        started = time.perf_counter()
        run_id = processes.submit_run(
            study.user_home,
            study_toml,
            app_dir=APP,
            run_config={"simulated-sites": str(listing), "attacks-out": str(out / "attacks.json")},
            federation={"num-supernodes": len(SITES) + 2, **SIMULATION_FEDERATION},
        )
        simulated = wait_for(out / "attacks.json", study, run_id, timeout=600)
        seconds = time.perf_counter() - started
    finally:
        study.close()
    assert "error" not in simulated, simulated
    services = {site: SiteService(load_site_config(path)) for site, path in copies.items()}
    try:
        fed = Federation({s: v.answer for s, v in services.items()}, study=STUDY_NAME,
                         verify_fingerprints=True)  # fmt: skip
        marker = root / "in-process" / "injected-marker"
        in_process = silo_attacks.run_attacks(fed, silo_attacks.Arena(STUDY_NAME, marker))
    finally:
        for service in services.values():
            service.close()
    print(f"simulated attack run: {seconds:.1f} s")
    return {
        "simulated": simulated,
        "in_process": in_process,
        "seconds": seconds,
        "site_configs": dict(study.site_configs),
        "copies": copies,
        "markers": [out / "injected-marker", marker],
    }


def compared(outcomes: list[dict]) -> list[tuple]:
    return [tuple(o.get(key) for key in COMPARED) for o in outcomes]


def test_every_attack_is_refused_over_the_simulation_engine_as_in_process(attacked) -> None:
    simulated, in_process = attacked["simulated"]["outcomes"], attacked["in_process"]
    assert compared(simulated) == compared(in_process)
    probes = {(o["attack"], o["probe"]) for o in simulated}
    assert probes == set(EXPECTED)
    for outcome in simulated:
        expected = EXPECTED[(outcome["attack"], outcome["probe"])]
        if expected is None:
            assert outcome["outcome"] == "answered", outcome
        else:
            assert outcome["outcome"] == "refused", outcome
            assert (outcome["error_type"], outcome["rule"]) == expected, outcome
            assert outcome["site"] in SITES, outcome
    per_site = [o for o in simulated if o["attack"] in ("formula_injection", "crafted_point",
                                                        "over_budget", "oversized")]  # fmt: skip
    assert {o["site"] for o in per_site} == set(SITES)  # every site was asked and answered
    first_sites = {o["site"] for o in simulated if o["attack"] in ("small_cell", "differencing")
                   and o["outcome"] == "refused"}  # fmt: skip
    assert first_sites == {TARGET}  # the outlier and the missing values are the first site's


def test_injected_code_left_no_trace(attacked) -> None:
    """No site evaluated a term: the file each payload would write exists nowhere, and each
    refusal names the term."""
    for marker in attacked["markers"]:
        assert marker.parent.is_dir() and not marker.exists()
    injected = [o for o in attacked["simulated"]["outcomes"] if o["attack"] == "formula_injection"]
    assert len(injected) == 3 * len(SITES)
    assert all(o["term"] and o["task"] == "prepare" for o in injected)


def test_discovery_admits_one_node_per_site_name(attacked) -> None:
    """Three virtual nodes claim the first site: the coordinator's discovery binds one and
    refuses the others, so an honest study would not run at all."""
    record = attacked["simulated"]
    claimed = record["claimed"]
    assert len(claimed) == len(SITES) + 2
    assert sorted(claimed.values()) == sorted([*SITES, TARGET, TARGET])
    discovery = record["discovery"]
    assert discovery["outcome"] == "refused", discovery
    assert discovery["error_type"] == "SiteIdentityError"
    assert "neither is served" in discovery["error"]
    bound = discovery["claims"]["sites"]
    assert bound[TARGET]["node"] == str(record["primary"][TARGET])
    refused = {r["node"] for r in discovery["claims"]["refused"] if r["site"] == TARGET}
    assert refused and str(record["primary"][TARGET]) not in refused
    assert refused <= {node for node, site in claimed.items() if site == TARGET}


def test_every_node_claiming_a_site_reaches_its_one_silo(attacked) -> None:
    """The second fit of the differencing pair, asked through each twin node (the same path
    listed again, and respelled), is refused as in process: the silo that answered the first
    fit through the site's own node is the one that answers there."""
    record = attacked["simulated"]
    twins = record["twins"]
    claimed = {int(node) for node, site in record["claimed"].items() if site == TARGET}
    assert {t["node"] for t in twins} == claimed - {record["primary"][TARGET]}
    assert len(twins) == 2
    pair = next(o for o in attacked["in_process"] if o["probe"] == "two patients fewer")
    for twin in twins:
        assert compared([twin])[0][2:] == compared([pair])[0][2:], twin
        assert (twin["rule"], twin["site"]) == ("differencing", TARGET)


def journal(config: Path) -> list[dict]:
    return SiteJournal(load_site_config(config).workdir / JOURNAL_FILE).records()


def test_each_request_is_answered_once_in_the_sites_journals(attacked) -> None:
    """Every request the coordinator sent a site, through any node, is received and answered
    once in its journal, the twins' requests among the first site's."""
    requests = attacked["simulated"]["requests"]
    assert requests[TARGET] > requests[SITES[1]]  # the twins' requests reached the first site
    for site, config in attacked["site_configs"].items():
        records = journal(config)
        received = [r["seq"] for r in records if r["event"] == "received"]
        answered = [r["seq"] for r in records if r["event"] == "answered"]
        assert received == answered and len(set(answered)) == len(answered), site
        assert len(answered) == requests[site], site


def test_no_refused_private_request_is_charged(attacked) -> None:
    """Each site's ledger holds the control release alone, charged alike over the simulation
    engine and in process; the journal shows the ledger unchanged across the refused one."""
    for copy in (attacked["site_configs"], attacked["copies"]):
        for site, config in copy.items():
            ledger = accounting.Ledger(load_site_config(config).privacy.ledger)
            try:
                entries = ledger.entries(accounting.Scope("patient", site, STUDY_NAME))
            finally:
                ledger.close()
            assert len(entries) == 1, (site, entries)
            assert 0 < entries[0].epsilon <= silo_attacks.BUDGET
            records = journal(config)
            refused = [r for r in records if r["event"] == "answered"
                       and r["error_type"] == "BudgetExceededError"]  # fmt: skip
            assert len(refused) == 1, site
            before = next(r for r in records if r["event"] == "received"
                          and r["seq"] == refused[0]["seq"])  # fmt: skip
            assert before["ledger_entries"] == refused[0]["ledger_entries"], site


# -------------------------------------------- one silo per simulated site, without Flower


@pytest.fixture
def fresh_site_app(monkeypatch: pytest.MonkeyPatch):
    """The ClientApp's services and locks of this test only, closed and released after it."""
    services: dict = {}
    held: dict = {}
    monkeypatch.setattr(site_app, "_services", services)
    monkeypatch.setattr(site_app, "_simulated", held)
    yield
    for _, service in services.values():
        service.close()
    for lock in held.values():
        lock.release()


def simulated_node(listing: Path, partition: int, node_config: dict | None = None) -> Context:
    return Context(run_id=1, node_id=partition + 1, state=RecordDict(),
                   node_config=node_config or {"partition-id": partition, "num-partitions": 3},
                   run_config={"simulated-sites": str(listing)})  # fmt: skip


def one_simulated_site(root: Path) -> tuple[Path, Path]:
    """A site folder (``north``, no roster) and a listing naming its site.toml three ways: as
    written, respelled through ``..`` and through a symbolic link to its folder."""
    config = write_site(root, TARGET, silo_attacks.study_frames(SITES)[TARGET], "127.0.0.1:9092")
    (root / "linked").symlink_to(config.parent, target_is_directory=True)
    spellings = [config, f"{root}/sites/../sites/{TARGET}/site.toml", root / "linked" / "site.toml"]
    listing = root / "simulated-sites.toml"
    listing.write_text("sites = [" + ", ".join(f'"{s}"' for s in spellings) + "]\n")
    return config, listing


@pytest.mark.usefixtures("fresh_site_app")
def test_three_spellings_of_one_site_toml_reach_one_silo(tmp_path: Path) -> None:
    """The unit form of the twin attack: the partitions of one site.toml, however spelled,
    get one service, so the second fit of a differencing pair through another partition is
    refused (with a service per spelling it was answered)."""
    _, listing = one_simulated_site(tmp_path)
    services = [site_app.service_for(simulated_node(listing, p)) for p in range(3)]
    assert services[1] is services[0] and services[2] is services[0]
    first = Federation({TARGET: services[0].answer}, verify_fingerprints=True)
    answered = silo_attacks.fit("pair", "all rows", fedstats.LogisticRegression("y ~ x"), first)
    assert answered["outcome"] == "answered"
    through_link = Federation({TARGET: services[2].answer}, verify_fingerprints=True)
    refused = silo_attacks.twin_differencing(through_link)
    assert (refused["error_type"], refused["rule"]) == ("DisclosureError", "differencing")


@pytest.mark.usefixtures("fresh_site_app")
def test_a_simulated_site_is_served_by_one_process_only(tmp_path: Path) -> None:
    """While another process holds a simulated site (a second ClientApp actor of a run), this
    one refuses to serve it, naming the site; once that process ends, it serves. A deployed
    node (its own ``site-config``) takes no such lock."""
    config, listing = one_simulated_site(tmp_path)
    lock = load_site_config(config).workdir / site_app.SIMULATED_SITE_LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ConfigError, match=f"site '{TARGET}' is served by another process"):
            site_app.service_for(simulated_node(listing, 0))
        deployed = {"site-config": str(config)}
        assert site_app.service_for(simulated_node(listing, 0, deployed)).config.name == TARGET
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    assert site_app.service_for(simulated_node(listing, 1)).config.name == TARGET


HOLD_LOCK = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()
"""
"""Another process holding a file's lock until its standard input closes."""
