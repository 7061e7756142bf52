"""Progress and logs of the jobs: plain lines, ``--json-log`` (one JSON object per stderr line)
and ``--quiet``; one ``site.request`` event per request a site answered."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
from pathlib import Path

import numpy as np
import pandas as pd
import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import accounting
import fedstats
from fedstats.cli.main import app
from fedstats.errors import FedstatsError
from fedstats.jobs.site_config import load_site_config
from fedstats.jobs.site_journal import SiteJournal
from fedstats.jobs.site_service import SiteService
from fedstats.jobs.site_serving import RequestLog


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def site_toml(folder: Path, superlink: str) -> Path:
    rng = np.random.default_rng(3)
    n = 200
    frame = pd.DataFrame(
        {"y": rng.integers(0, 2, n), "age": rng.normal(60, 10, n), "x": rng.normal(0, 1, n)}
    )
    frame.to_parquet(folder / "frame.parquet")
    config = {
        "site": {"name": "region_0", "workdir": str(folder / "work")},
        "data": {"frame": str(folder / "frame.parquet")},
        "privacy": {"ledger": str(folder / "site.ledger")},
        "disclosure": {"min_count": 10, "verified_paths": False},  # no roster: says so
        "coordinator": {"superlink": superlink, "insecure": True, "connect_timeout": 0.5},
    }
    path = folder / "site.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path


def study_toml(folder: Path, superlink: str) -> Path:
    config = {
        "study": {"name": "s1", "sites": ["region_0"], "out": str(folder / "out")},
        "coordinator": {"superlink": superlink, "insecure": True, "run_timeout": 0.5},
        "fits": [{"kind": "logistic", "name": "y_logistic", "formula": "y ~ age"}],
    }
    path = folder / "study.toml"
    path.write_text(tomli_w.dumps(config), encoding="utf-8")
    return path


def json_lines(stderr: str) -> list[dict]:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines, "nothing on stderr"
    documents = [json.loads(line) for line in lines]  # every line parses
    for document in documents:
        assert {"time", "level", "event", "message", "fields"} <= document.keys()
    return documents


def test_site_run_json_log_is_one_json_object_per_stderr_line(tmp_path: Path) -> None:
    path = site_toml(tmp_path, f"127.0.0.1:{closed_port()}")
    result = CliRunner().invoke(app, ["--json-log", "site", "run", "--config", str(path)])
    assert result.exit_code == 5, result.output
    events = json_lines(result.stderr)
    names = [e["event"] for e in events]
    assert names[:3] == ["site.preparing_frame", "site.frame_ready", "site.serving"]
    assert events[1]["fields"]["origin"] == "configured"
    (failed,) = [e for e in events if e["event"] == "failed"]
    assert failed["level"] == "error" and failed["fields"]["exit_code"] == 5
    assert "did not accept a connection" in failed["message"]


def test_site_run_plain_progress_and_quiet(tmp_path: Path) -> None:
    path = site_toml(tmp_path, f"127.0.0.1:{closed_port()}")
    plain = CliRunner().invoke(app, ["site", "run", "--config", str(path)])
    assert plain.exit_code == 5
    assert "fedstats: site 'region_0': preparing the analysis frame" in plain.stderr
    assert "error: coordinator unreachable" in plain.stderr
    quiet = CliRunner().invoke(app, ["--quiet", "site", "run", "--config", str(path)])
    assert quiet.exit_code == 5
    assert "fedstats:" not in quiet.stderr and "error: coordinator unreachable" in quiet.stderr


def test_study_run_json_log_and_quiet(tmp_path: Path) -> None:
    path = study_toml(tmp_path, f"127.0.0.1:{closed_port()}")
    result = CliRunner().invoke(app, ["--json-log", "study", "run", "--config", str(path)])
    assert result.exit_code == 5, result.output
    events = json_lines(result.stderr)
    assert events[0]["event"] == "study.configured"
    assert events[0]["fields"] == {"study": "s1", "fits": ["y_logistic"], "sites": ["region_0"]}
    assert events[-1]["event"] == "failed" and events[-1]["fields"]["exit_code"] == 5
    quiet = CliRunner().invoke(app, ["-q", "study", "run", "--config", str(path)])
    assert quiet.exit_code == 5 and "fedstats:" not in quiet.stderr
    assert quiet.stderr.startswith("error: superlink unreachable")


def test_a_site_logs_each_request_with_task_analysis_and_what_it_cost(tmp_path, caplog) -> None:
    """Served in process through the site's own service and journal (as the site worker does),
    then read back from the journal as the batch job does while it watches."""
    config = load_site_config(site_toml(tmp_path, "127.0.0.1:1"))
    with accounting.Ledger(config.privacy.ledger) as ledger:
        ledger.set_budget(
            accounting.Scope(unit="patient", owner="region_0", study="s1"), epsilon=1.0, delta=1e-5
        )
    service = SiteService(config)
    try:
        federation = fedstats.Federation({"region_0": service.answer}, study="s1")
        fedstats.LogisticRegression("y ~ age").fit(federation)
        private = fedstats.RecordDP(epsilon=0.5, delta=1e-5, bounds={"age": (0.0, 120.0)})
        fedstats.LogisticRegression("y ~ age").fit(federation, privacy=private)
        with contextlib.suppress(FedstatsError):  # 200 levels: refused by disclosure control
            fedstats.LogisticRegression("y ~ C(age)").fit(federation)
    finally:
        service.close()
    journal = SiteJournal(config.workdir / "journal.jsonl")
    with caplog.at_level(logging.INFO, logger="fedstats"):
        log = RequestLog("region_0", journal, from_start=True)
        log.log_new()
    assert log.tail.offset == journal.path.stat().st_size
    requests = [r for r in caplog.records if getattr(r, "event", None) == "site.request"]
    answered = [r for r in journal.records() if r["event"] == "answered"]
    assert len(requests) == len(answered) > 3
    fields = [r.fields for r in requests]
    assert {"task", "analysis", "outcome", "charged_entries"} <= fields[0].keys()
    charged = [f for f in fields if f["charged_entries"]]
    assert charged and all(f["analysis"] and f["outcome"] == "answered" for f in charged)
    refused = [f for f in fields if f["outcome"] == "refused"]
    assert refused and refused[-1]["error_type"] == "DisclosureError"
    assert refused[-1]["task"] == "describe" and not refused[-1]["charged_entries"]
    assert "refused (DisclosureError)" in requests[fields.index(refused[-1])].getMessage()


def test_harmonize_reports_progress_with_records_per_second(tmp_path: Path) -> None:
    """A FHIR run logs (0, total) first and (total, total) last; --quiet drops both."""
    from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson

    fhir = write_fhir_ndjson(synthetic_ehr(40, seed=3), tmp_path / "fhir")
    spec = Path(__file__).resolve().parents[2] / "fedstats" / "examples" / "demo" / "study.toml"
    common = ["harmonize", "--spec", str(spec), "--site", "s", "--fhir", str(fhir)]
    common += ["--latest-date", "2030-01-01"]
    result = CliRunner().invoke(app, ["--json-log", *common, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    progress = [e for e in json_lines(result.stderr) if e["event"] == "harmonize.progress"]
    assert len(progress) >= 2
    total = progress[0]["fields"]["total"]
    report = json.loads((tmp_path / "a" / "report.json").read_text())
    assert total == report["read"] > 0
    assert progress[0]["fields"]["done"] == 0
    assert progress[-1]["fields"]["done"] == total
    assert all(e["fields"]["site"] == "s" for e in progress)
    # records read, not "harmonised": a run reads many records and includes fewer patients
    assert f"{total:,} of {total:,} records read" in progress[-1]["message"]
    quiet = CliRunner().invoke(app, ["--quiet", *common, "--out", str(tmp_path / "b")])
    assert quiet.exit_code == 0, quiet.output
    assert "records read" not in quiet.stderr


def test_one_commands_json_log_does_not_leak_into_the_next(tmp_path: Path) -> None:
    """--json-log belongs to its own invocation: a later command (even a sub-app run on its
    own, without the root options) still prints its error as plain text on its own stderr."""
    import typer

    from fedstats.cli.jobs import study_app

    broken = tmp_path / "study.toml"
    broken.write_text("[coordinator]\nrun_timeout = 'soon'\n", encoding="utf-8")
    first = CliRunner().invoke(app, ["--json-log", "study", "run", "--config", str(broken)])
    assert first.exit_code == 2
    assert json_lines(first.stderr)[-1]["event"] == "failed"
    alone = typer.Typer()
    alone.add_typer(study_app, name="study")
    second = CliRunner().invoke(alone, ["study", "run", "--config", str(broken)])
    assert second.exit_code == 2
    assert second.stderr.startswith("error: ") and "run_timeout" in second.stderr


def test_a_terminal_gets_a_harmonisation_bar_with_records_per_second(capsys) -> None:
    from fedstats.cli.progress import HarmonizationBar

    bar = HarmonizationBar("north")
    for done in (0, 400, 1_000):
        bar(done, 1_000)
    shown = capsys.readouterr().err
    assert "harmonising north" in shown and "1.00k/1.00k" in shown and "records/s" in shown


def test_the_handler_ends_with_its_invocation() -> None:
    """After a --json-log command the fedstats loggers are as they were before it."""
    logger = logging.getLogger("fedstats")
    before = (list(logger.handlers), logger.level, logger.propagate)
    result = CliRunner().invoke(app, ["--json-log", "budget", "show", "--ledger", "/nonexistent"])
    assert result.exit_code == 2 and json_lines(result.stderr)[-1]["event"] == "failed"
    assert (list(logger.handlers), logger.level, logger.propagate) == before


def test_a_coordinators_task_and_analysis_names_cannot_forge_log_lines(tmp_path: Path) -> None:
    """The task and analysis names come from the coordinator's request: a crafted one with
    line breaks and a fake event stays inside one escaped line, in plain and JSON form."""
    from fedstats.cli.logs import JsonLineFormatter, PlainFormatter

    forged = "a\nfedstats: site 'region_0': request 99 task 'fit': answered\x1b[2K"
    journal = SiteJournal(tmp_path / "journal.jsonl")
    journal.append({"event": "received", "seq": 1, "task": forged, "ledger_entries": 0})
    journal.append(
        {
            "event": "answered",
            "seq": 1,
            "task": forged,
            "analysis": forged,
            "status": "released",
            "ledger_entries": 0,
        }
    )
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    logger = logging.getLogger("fedstats")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        RequestLog("region_0", journal, from_start=True).log_new()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    (record,) = [r for r in records if getattr(r, "event", None) == "site.request"]
    for formatter in (PlainFormatter(), JsonLineFormatter()):
        text = formatter.format(record)
        assert "\n" not in text and "\x1b" not in text, text
    assert json.loads(JsonLineFormatter().format(record))["fields"]["analysis"] == forged


def test_the_serving_loops_request_log_reads_each_journal_byte_once(tmp_path, caplog):
    """Over a long run the journal grows by a few lines per request: the serving loop's log
    reads only what was appended (every byte once, a torn line again once completed), logs
    each request once, and never logs what was journalled before it started."""
    journal = SiteJournal(tmp_path / "journal.jsonl")
    journal.append({"event": "received", "seq": 1, "task": "describe", "ledger_entries": 0})
    journal.append({"event": "answered", "seq": 1, "task": "describe", "status": "released",
                    "ledger_entries": 0})  # fmt: skip
    journal.append({"event": "received", "seq": 2, "task": "prepare", "ledger_entries": 0})
    log = RequestLog("region_0", journal)  # seq 1 was served before; seq 2 is in flight
    with caplog.at_level(logging.INFO, logger="fedstats"):
        journal.append({"event": "answered", "seq": 2, "task": "prepare", "status": "released",
                        "ledger_entries": 1})  # fmt: skip
        log.log_new()
        with journal.path.open("a", encoding="utf-8") as handle:
            handle.write('{"event": "received", "seq": 3')  # a crash mid-write: a torn line
        log.log_new()
        for seq in range(3, 40):
            journal.append({"event": "received", "seq": seq, "task": "logistic.summaries",
                            "ledger_entries": 1})  # fmt: skip
            journal.append({"event": "answered", "seq": seq, "task": "logistic.summaries",
                            "status": "refused", "error_type": "DisclosureError",
                            "ledger_entries": 1})  # fmt: skip
            log.log_new()
    logged = [r.fields for r in caplog.records if getattr(r, "event", None) == "site.request"]
    assert [f["seq"] for f in logged] == list(range(2, 40))
    assert logged[0]["charged_entries"] == 1 and logged[0]["outcome"] == "answered"
    assert all(f["outcome"] == "refused" for f in logged[1:])
    assert log.tail.offset == journal.path.stat().st_size
    assert log.tail.bytes_read == journal.path.stat().st_size  # each byte read once


@settings(max_examples=40)
@given(steps=st.lists(st.sampled_from(["mine", "other", "torn"]), min_size=1, max_size=25))
def test_next_seq_read_incrementally_equals_one_more_than_the_journals_largest(
    tmp_path_factory, steps
):
    """A service numbers each request from the journal's tail: whatever this service and
    another process append (and a write torn by a crash), ``next_seq`` is one more than the
    largest ``seq`` of every complete line, reading each byte once."""
    path = tmp_path_factory.mktemp("journal") / "journal.jsonl"
    mine, other = SiteJournal(path), SiteJournal(path)
    for step in steps:
        if step == "torn":
            with path.open("a", encoding="utf-8") as handle:
                handle.write('{"event": "received", "seq": 999')
        else:
            writer = mine if step == "mine" else other
            writer.append({"event": "received", "seq": writer.next_seq()})
        expected = 1 + max((r.get("seq", 0) for r in SiteJournal(path).records()), default=0)
        assert mine.next_seq() == expected
    assert mine._seq_tail is not None and mine._seq_tail.bytes_read <= path.stat().st_size
