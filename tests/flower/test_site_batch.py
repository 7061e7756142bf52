"""``fedstats site run``: every exit code, the idempotent rerun and crash recovery.

Most tests serve in process: the job's serving step is given a function that
plays the coordinator by sending real codec requests to the site's own
:class:`~fedstats.jobs.site_service.SiteService` (silo, ledger, journal), so the
journal lines, ledger charges and refusals the run record is derived from are
the real ones. One test runs the whole job over Flower (a SuperLink, the
site's SuperNode and site worker, a coordinator run: separate processes).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from datetime import date
from pathlib import Path
from typing import Any

import dp_accounting
import pandas as pd
import pytest
import tomli_w
import typer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import accounting
import fedstats
from fedstats import datasets
from fedstats.cli.jobs import site_app
from fedstats.errors import ConfigError, FedstatsError
from fedstats.flower import processes
from fedstats.flower.local_study import write_study
from fedstats.flower.study_pki import make_study_ca
from fedstats.jobs.job_lock import JobLock
from fedstats.jobs.site_batch import SiteExit, run_site_job
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_journal import SiteJournal
from fedstats.jobs.site_service import SiteService
from fedstats.jobs.site_serving import ServeResult
from fedstats.jobs.study_run import wait_for_status
from studyfiles.durable import file_sha256

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "fedstats" / "examples" / "demo" / "study.toml"
BULK = datasets.default_data_dir() / "fhir" / "synthea_bulk_10_patients"
COVARIATES = "age_at_index + ajcc_pathologic_n_n1 + prior_malignancy_yes"
FORMULA = f"event ~ {COVARIATES}"
LATEST = date(2030, 1, 1)


def site_toml(folder: Path, data: dict[str, Any], **coordinator: Any) -> Path:
    """A site.toml in ``folder`` with the given [data] and an insecure [coordinator]."""
    config = {
        "site": {"name": "region_0", "workdir": str(folder / "work")},
        "data": data,
        "privacy": {"ledger": str(folder / "site.ledger")},
        "disclosure": {"min_count": 10, "verified_paths": False},  # no roster: says so
        "coordinator": {"superlink": "127.0.0.1:1", "insecure": True, **coordinator},
    }
    path = folder / "site.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path


def tcga_site(folder: Path, rows: int | None = None, **coordinator: Any) -> Path:
    frame = datasets.tcga_brca().frames["region_0"]
    frame = frame if rows is None else frame.head(rows)
    folder.mkdir(parents=True, exist_ok=True)
    frame.to_parquet(folder / "frame.parquet")
    return site_toml(folder, {"frame": str(folder / "frame.parquet")}, **coordinator)


def coordinator_in_process(ask=None):
    """A serving step that plays the coordinator in process: ``ask(federation)``, if given."""

    def serve(config, path, journal: SiteJournal) -> ServeResult:
        if ask is None:
            return ServeResult("no request", 0.0, [])
        service = SiteService(config)
        try:
            federation = fedstats.Federation({config.name: service.answer}, study="study")
            with contextlib.suppress(FedstatsError):  # the coordinator sees a typed refusal
                ask(federation)
        finally:
            service.close()
        return ServeResult("idle", 0.0, [])

    return serve


def logistic(federation) -> None:
    fedstats.LogisticRegression(FORMULA).fit(federation)


# -------------------------------------------------------------------- configuration
def test_broken_site_toml_is_a_configuration_error_naming_the_field(tmp_path: Path) -> None:
    path = tcga_site(tmp_path)
    path.write_text(path.read_text().replace("min_count = 10", 'min_count = "ten"'))
    app = typer.Typer()
    app.add_typer(site_app, name="site")
    result = CliRunner().invoke(app, ["site", "run", "--config", str(path)])
    assert result.exit_code == SiteExit.CONFIGURATION == 2
    assert "disclosure.min_count" in result.output
    assert isinstance(result.exception, SystemExit)  # typer's exit, not a traceback
    assert not (tmp_path / "work" / "runs").exists()


def test_missing_file_and_missing_coordinator_are_configuration_errors(tmp_path: Path) -> None:
    run = run_site_job(tmp_path / "absent.toml")
    assert run.exit_code == SiteExit.CONFIGURATION and "not found" in run.reason
    path = tcga_site(tmp_path)
    text = path.read_text()
    path.write_text(text[: text.index("[coordinator]")])
    run = run_site_job(path)
    assert run.exit_code == SiteExit.CONFIGURATION and "'coordinator'" in run.reason


FIELDS = [
    ("site", "name"),
    ("site", "workdir"),
    ("data", "frame"),
    ("data", "identifiers"),
    ("data", "max_rejected_share"),
    ("data", "latest_date"),
    ("privacy", "ledger"),
    ("disclosure", "min_count"),
    ("disclosure", "require_privacy"),
    ("coordinator", "superlink"),
    ("coordinator", "insecure"),
    ("coordinator", "node_port"),
    ("coordinator", "connect_timeout"),
    ("coordinator", "serve_timeout"),
    ("coordinator", "idle_timeout"),
    ("coordinator", "surprise"),
    ("unknown_section", "x"),
]
TOML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats()
    | st.text(max_size=30)
    | st.dates(),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(field=st.sampled_from(FIELDS), value=TOML_VALUES)
@example(field=("site", "workdir"), value="\x00")  # a NUL in a path: no file system takes it
def test_arbitrary_values_in_site_toml_give_a_configuration_error_naming_the_field(
    tmp_path: Path, field: tuple[str, str], value: Any
) -> None:
    """Any TOML value in any field: a run never raises; an invalid file exits 2 naming the field."""
    folder = tmp_path / "fuzz"
    if not (folder / "frame.parquet").exists():
        tcga_site(folder, rows=20)
    config = _base(folder)
    section, key = field
    if value is None:
        config.get(section, {}).pop(key, None)
    else:
        config.setdefault(section, {})[key] = value
    path = folder / "site.toml"
    try:
        path.write_text(tomli_w.dumps(config), encoding="utf-8")
    except (TypeError, ValueError):
        return  # not representable in TOML (e.g. a NaN key); nothing to test
    try:
        load_site_config(path)
        valid = True
    except ConfigError:
        valid = False
    run = run_site_job(path, serve=coordinator_in_process())
    assert run.exit_code in set(SiteExit)
    if not valid:
        assert run.exit_code == SiteExit.CONFIGURATION
        named = f"{section}.{key}" if section in config and value is not None else section
        assert named in run.reason or f"'{section}'" in run.reason, (field, value, run.reason)


def _base(folder: Path) -> dict[str, Any]:
    return {
        "site": {"name": "region_0", "workdir": str(folder / "work")},
        "data": {"frame": str(folder / "frame.parquet")},
        "privacy": {"ledger": str(folder / "site.ledger")},
        "disclosure": {"min_count": 10, "verified_paths": False},  # no roster: says so
        "coordinator": {"superlink": "127.0.0.1:1", "insecure": True},
    }


# -------------------------------------------------------------------- harmonisation
def test_too_many_rejected_records_is_a_harmonisation_failure_naming_file_and_line(
    tmp_path: Path,
) -> None:
    """Real Synthea bulk export plus one file of broken records: rejections above the share."""
    broken = tmp_path / "extra" / "Condition.900.ndjson"
    broken.parent.mkdir()
    broken.write_text('{"resourceType": "Condition", "id": "x"}\n{not json\n', encoding="utf-8")
    path = site_toml(
        tmp_path,
        {"fhir": [str(BULK), str(broken)], "spec": str(SPEC), "latest_date": LATEST},
    )
    run = run_site_job(path, serve=coordinator_in_process())
    assert run.exit_code == SiteExit.HARMONISATION == 3
    assert "Condition.900.ndjson" in run.reason and "line" in run.reason
    assert not (tmp_path / "work" / "current" / "frame.parquet").exists()
    assert json.loads(run.record_path.read_text())["exit_code"] == 3


def test_sources_harmonised_once_then_reused_and_a_damaged_frame_is_never_used(
    tmp_path: Path,
) -> None:
    path = site_toml(tmp_path, {"fhir": [str(BULK)], "spec": str(SPEC), "latest_date": LATEST})
    first = run_site_job(path, serve=coordinator_in_process())
    assert first.exit_code == SiteExit.OK, first.reason
    assert first.record["frame"]["origin"] == "harmonised"
    frame_file = tmp_path / "work" / "current" / "frame.parquet"
    sha = first.record["frame"]["sha256"]

    again = run_site_job(path, serve=coordinator_in_process())
    assert again.exit_code == SiteExit.OK
    assert (
        again.reason == f"nothing new: frame reused (sha256 {sha}), no request from the coordinator"
    )
    assert again.record["nothing_new"] is True and again.record["requests"] == 0
    assert again.record_path != first.record_path and again.record_path.is_file()

    # A crash mid-write: a half frame under the frame's name, and a temporary file beside it.
    data = frame_file.read_bytes()
    frame_file.write_bytes(data[: len(data) // 2])
    (frame_file.parent / ".frame.parquet.999.tmp").write_bytes(data[:10])
    third = run_site_job(path, serve=coordinator_in_process())
    assert third.record["frame"]["origin"] == "harmonised"
    assert third.record["frame"]["sha256"] == sha  # the same sources give the same frame
    assert (
        pd.read_parquet(frame_file).shape[0] == first.record["frame"]["harmonisation"]["patients"]
    )
    assert not list(frame_file.parent.glob(".frame.parquet.*.tmp"))


# -------------------------------------------------------------------- budget
def test_a_request_refused_for_budget_exits_budget_exhausted(tmp_path: Path, monkeypatch) -> None:
    """A coordinator that skips its budget planning (it is not trusted): the site refuses."""
    monkeypatch.setattr(
        "fedstats.models.logistic_private.preview_site_budgets", lambda *a, **k: None
    )
    path = tcga_site(tmp_path)
    with accounting.Ledger(tmp_path / "site.ledger") as ledger:
        ledger.set_budget(
            accounting.Scope("patient", "region_0", "study"), epsilon=0.05, delta=1e-6
        )
    bounds = {
        "age_at_index": (20.0, 90.0),
        "ajcc_pathologic_n_n1": (0.0, 1.0),
        "prior_malignancy_yes": (0.0, 1.0),
    }

    def private(federation) -> None:
        privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-6, rounds=3, bounds=bounds)
        fedstats.LogisticRegression(FORMULA).fit(federation, privacy=privacy)

    run = run_site_job(path, serve=coordinator_in_process(private))
    assert run.exit_code == SiteExit.BUDGET_EXHAUSTED == 4, run.reason
    refused = run.record["refused"]
    assert refused and refused[0]["error_type"] == "BudgetExceededError"
    assert "budget" in run.reason
    assert run.record["charged"]["ledger_entries_added"] == 0  # nothing released, nothing charged


def test_a_spent_budget_stops_the_run_before_serving(tmp_path: Path) -> None:
    path = tcga_site(tmp_path)
    scope = accounting.Scope("patient", "region_0", "study")
    with accounting.Ledger(tmp_path / "site.ledger") as ledger:
        ledger.set_budget(scope, epsilon=10.0, delta=1e-6)
        ledger.charge(scope, dp_accounting.GaussianDpEvent(2.0), note="an earlier study's release")
        ledger.set_budget(scope, epsilon=ledger.spent(scope).epsilon, delta=1e-6)
    asked = []
    run = run_site_job(path, serve=coordinator_in_process(asked.append))
    assert run.exit_code == SiteExit.BUDGET_EXHAUSTED
    assert "spent" in run.reason and "nothing was served" in run.reason
    assert asked == []


# -------------------------------------------------------------------- disclosure
def test_an_aggregate_over_too_few_patients_exits_refused_by_disclosure(tmp_path: Path) -> None:
    path = tcga_site(tmp_path, rows=8)  # min_count 10
    run = run_site_job(path, serve=coordinator_in_process(logistic))
    assert run.exit_code == SiteExit.DISCLOSURE_REFUSED == 6, run.reason
    assert run.record["refused"][0]["error_type"] == "DisclosureError"
    assert "region_0" in run.reason


def protocol_site(tmp_path: Path, formula: str, sha256: str | None = None) -> Path:
    """The TCGA site with an approved protocol for ``formula`` (and its pinned digest)."""
    path = tcga_site(tmp_path)
    protocol = tmp_path / "protocol.toml"
    protocol.write_text(
        "[protocol]\ntitle = 'TCGA-BRCA mortality'\n\n[[protocol.analysis]]\n"
        f"name = 'mortality'\nmodel = 'logistic'\nformula = '{formula}'\n",
        encoding="utf-8",
    )
    config = tomllib.loads(path.read_text())
    config["disclosure"]["protocol"] = str(protocol)
    if sha256 is not None:
        config["disclosure"]["protocol_sha256"] = sha256
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path


def test_site_run_enforces_the_approved_protocol_and_records_its_hash(tmp_path: Path) -> None:
    inside = run_site_job(
        protocol_site(tmp_path / "a", FORMULA), serve=coordinator_in_process(logistic)
    )
    assert inside.exit_code == SiteExit.OK, inside.reason
    digest = inside.record["protocol"]["sha256"]
    assert digest == file_sha256(tmp_path / "a" / "protocol.toml")
    outside = run_site_job(
        protocol_site(tmp_path / "b", "event ~ age_at_index"),
        serve=coordinator_in_process(logistic),
    )
    assert outside.exit_code == SiteExit.DISCLOSURE_REFUSED == 6, outside.reason
    refusal = outside.record["refused"][0]
    assert refusal["error_type"] == "ProtocolError" and refusal["reason"] == "protocol"
    assert "reason protocol" in outside.reason
    edited = run_site_job(
        protocol_site(tmp_path / "c", FORMULA, sha256="0" * 64),
        serve=coordinator_in_process(logistic),
    )
    assert edited.exit_code == SiteExit.CONFIGURATION == 2
    assert "changed after approval" in edited.reason


def test_site_protocol_prints_the_digest_to_approve(tmp_path: Path) -> None:
    path = protocol_site(tmp_path, FORMULA).parent / "protocol.toml"
    app = typer.Typer()
    app.add_typer(site_app, name="site")
    result = CliRunner().invoke(app, ["site", "protocol", str(path)])
    assert result.exit_code == 0, result.output
    assert f'protocol_sha256 = "{file_sha256(path)}"' in result.output
    assert "mortality (logistic)" in result.output
    path.write_text("[protocol]\n", encoding="utf-8")
    broken = CliRunner().invoke(app, ["site", "protocol", str(path)])
    assert broken.exit_code == 2 and "title" in broken.output


# -------------------------------------------------------------------- coordinator
def test_a_closed_superlink_port_is_coordinator_unreachable(tmp_path: Path) -> None:
    port = processes.free_port()
    path = tcga_site(tmp_path, superlink=f"127.0.0.1:{port}", connect_timeout=0.3)
    started = time.monotonic()
    run = run_site_job(path)  # the real Flower serving step
    assert run.exit_code == SiteExit.COORDINATOR_UNREACHABLE == 5
    assert f"127.0.0.1:{port}" in run.reason
    assert time.monotonic() - started < 20
    assert not (tmp_path / "work" / "flower" / "supernode.log").exists()  # nothing started


def test_a_supernode_that_ends_by_itself_exits_flower_failed(tmp_path: Path) -> None:
    """The SuperLink's port accepts connections but speaks no TLS: the site's SuperNode (TLS,
    the study CA) fails its handshake and ends; the job names it and stops the worker too."""
    listener = socket.create_server(("127.0.0.1", 0))
    accepting = threading.Thread(target=_accept_and_close, args=(listener,), daemon=True)
    accepting.start()
    try:
        ca = make_study_ca(tmp_path / "pki", "study")
        path = tcga_site(
            tmp_path / "site",
            superlink=f"127.0.0.1:{listener.getsockname()[1]}",
            insecure=False,
            root_certificates=str(ca.certificate),
            node_port=processes.free_port(),
            serve_timeout=60.0,
        )
        run = run_site_job(path)  # the real Flower serving step
    finally:
        listener.close()
    assert run.exit_code == SiteExit.SERVE_FAILED == 8, run.reason
    assert "the SuperNode ended by itself" in run.reason and "region_0" in run.reason
    assert run.record["exit_code"] == 8 and run.record["served"]["count"] == 0
    assert run.record["serving"]["ended"] == "failed"
    assert len(run.record["serving"]["processes"]) == 2  # the SuperNode and the site worker
    for pid in run.record["serving"]["processes"]:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def _accept_and_close(listener: socket.socket) -> None:
    while True:
        try:
            connection, _ = listener.accept()
        except OSError:
            return
        connection.close()


# -------------------------------------------------------------------- lock and crashes
def test_a_held_lock_exits_already_running_and_a_stale_one_is_taken_over(tmp_path: Path) -> None:
    path = tcga_site(tmp_path)
    with JobLock(tmp_path / "work" / "site-run.lock"):
        run = run_site_job(path, serve=coordinator_in_process())
    assert run.exit_code == SiteExit.ALREADY_RUNNING == 7
    assert str(os.getpid()) in run.reason
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    (tmp_path / "work" / "site-run.lock").write_text(dead.stdout)
    journal = SiteJournal(tmp_path / "work" / "journal.jsonl")
    journal.append(
        {"event": "received", "seq": 1, "task": "logistic.gradient", "ledger_entries": 0}
    )
    run = run_site_job(path, serve=coordinator_in_process())
    assert run.exit_code == SiteExit.OK, run.reason
    assert run.record["lock"]["took_over_from_pid"] == int(dead.stdout)
    assert run.record["rolled_forward"] == 1
    assert journal.pending() == []


def test_the_cli_says_what_it_did_and_writes_the_record(tmp_path: Path, monkeypatch) -> None:
    path = tcga_site(tmp_path, rows=8)
    monkeypatch.setattr(
        "fedstats.jobs.site_batch.run_site_job",
        lambda config: run_site_job(config, serve=coordinator_in_process(logistic)),
    )
    app = typer.Typer()
    app.add_typer(site_app, name="site")
    result = CliRunner().invoke(app, ["site", "run", "--config", str(path)])
    assert result.exit_code == 6
    assert "disclosure" in result.output and "run record" in result.output


# -------------------------------------------------------------------- over Flower
def test_a_whole_run_over_flower_then_a_rerun_with_nothing_new(tmp_path: Path) -> None:
    """SuperLink, the site's SuperNode and worker, and a coordinator run: separate processes.

    The first run serves the coordinator's run and stops once the coordinator stopped asking;
    the rerun finds nothing new and says so (through the command line).
    """
    port = processes.free_port()
    link = processes.start_superlink(tmp_path / "link", port)
    pool = ThreadPoolExecutor(1)
    try:
        processes.wait_for_port(port, 60, link)
        path = tcga_site(
            tmp_path / "site",
            superlink=f"127.0.0.1:{port}",
            node_port=processes.free_port(),
            idle_timeout=15.0,  # well above any gap between two requests of one run
            serve_timeout=150.0,
        )
        job = pool.submit(run_site_job, path)
        out = tmp_path / "out"
        study = write_study(
            tmp_path,
            ["region_0"],
            f'[[fits]]\nkind = "logistic"\nname = "fit"\nformula = "{FORMULA}"\n',
            out=out,
        )
        processes.write_connection(tmp_path / "user", f"127.0.0.1:{port}")
        run_id = processes.submit_run(tmp_path / "user", study)
        status = wait_for_status(out, run_id, 150)
        assert status["status"] == "completed", status
        first = job.result(timeout=60)
        assert first.exit_code == SiteExit.OK, first.reason
        record = json.loads(first.record_path.read_text())
        journal = SiteJournal(tmp_path / "site" / "work" / "journal.jsonl")
        answered = [r for r in journal.records() if r["event"] == "answered"]
        assert record["served"]["count"] == len(answered) == status["messages"]
        assert record["served"]["tasks"]["harmonize.fingerprint"]["count"] == 1
        assert record["serving"]["ended"] == "idle" and record["exit_code"] == 0
        assert record["frame"]["origin"] == "configured"
        assert first.reason.startswith("configured frame used as is") and "served" in first.reason
        for pid in record["serving"]["processes"]:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)

        # The rerun: same frame, no coordinator run. Only its serving window is shortened, so
        # that the test does not wait 150 s for a request that will not come.
        path.write_text(path.read_text().replace("serve_timeout = 150.0", "serve_timeout = 5.0"))
        app = typer.Typer()
        app.add_typer(site_app, name="site")
        result = CliRunner().invoke(app, ["site", "run", "--config", str(path)])
        assert result.exit_code == 0, result.output
        assert result.output.startswith("nothing new: configured frame used as is (sha256 ")
        assert "no request from the coordinator" in result.output
        again = json.loads(
            sorted((tmp_path / "site" / "work" / "runs").glob("*.json"))[-1].read_text()
        )
        assert again["nothing_new"] is True and again["served"]["count"] == 0
        assert again["serving"]["ended"] == "no request"
        assert len(journal.records()) == 2 * len(answered)  # nothing was journaled by the rerun
        for pid in again["serving"]["processes"]:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        processes.stop([link])
    assert link.poll() is not None
