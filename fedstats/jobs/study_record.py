"""The study directory and compliance report of a study run over Flower (command-line layer).

This module sits with the command line (it imports :mod:`reports`, which
the ``fedstats`` package itself never does); ``fedstats study run`` passes
:func:`record_and_report` to :func:`fedstats.jobs.study_run.run_study_job`.

After the coordinator's ServerApp finished, its ``out`` folder holds one
result per fit (``results/<fit>.json``), the run's message inventory
(``inventory-<run id>.jsonl``) and ``status.json``. :func:`record_study`
writes from them a study directory (:mod:`reports.layout`) at ``out/study``
and :func:`write_compliance_report` the report beside it.

Privacy ledgers: each site's ledger stays at the site — it is the site's own
record, enforced by the site, and the coordinator never receives it. The
study directory therefore holds no site ledger, and the report says so: the
privacy facts it shows for each fit are those the sites released in their
replies (each result's privacy account), and ``configuration.json`` states
where each site's ledger is kept. A site shows its own ledger to a regulator
with ``fedstats budget show --ledger`` and its journal reconciliation.

``spec.toml`` in this study directory is a copy of the coordinator's
``study.toml`` (the study's definition as the coordinator ran it); the
sites' harmonisation specification is identified by the specification digest
in the site fingerprints, which the ServerApp compared before any fit.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pandas as pd

from fedstats.errors import RunFailed
from fedstats.jobs.study_config import StudyConfig
from fedstats.jobs.study_run import Recorded
from studyfiles.durable import file_sha256
from studyfiles.errors import StudyFileError
from studyfiles.inventory import MessageInventory

STUDY_DIR = "study"
REPORT_NAME = "compliance-report"
LEDGERS_STATEMENT = (
    "Site ledgers stay at the sites and are not copied here: the privacy facts shown for each "
    "fit are those the sites released in their replies. Each site shows its own ledger with "
    "'fedstats budget show --ledger' and its run records (workdir/runs)."
)
DISCLOSURE_STATEMENT = {
    "set by": "each site, in its own site configuration (the smallest count it releases "
    "and whether it answers only private requests)",
    "seen by the coordinator": "only refusals, listed below from the message inventory",
}


def record_study(
    config: StudyConfig,
    study_toml: Path,
    status: dict[str, Any],
    results: dict[str, dict[str, Any]],
    inventory: MessageInventory,
) -> Path:
    """Write ``out/study`` from the run's results and inventory; returns the directory."""
    from reports.recorder import StudyRecorder

    directory = Path(config.study.out) / STUDY_DIR
    if directory.exists():
        shutil.rmtree(directory)
    recorder = StudyRecorder(directory, study=config.study.name)
    recorder.record_spec(study_toml)
    tables = [f for f in config.fits if {"grid", "survival"} <= results[f.name].keys()]
    models = [f for f in config.fits if {"params", "provenance"} <= results[f.name].keys()]
    networks = [f for f in config.fits if {"weights", "provenance"} <= results[f.name].keys()]
    others = [f.name for f in config.fits if f not in tables + models + networks]
    recorder.record_configuration(
        {
            "study": config.study.name,
            "study_toml": str(study_toml),
            "study_toml_sha256": file_sha256(study_toml),
            "sites": list(config.study.sites),
            "fits": [fit.model_dump(mode="json") for fit in config.fits],
            "links": [entry.model_dump(mode="json") for entry in config.links],
            "fits_not_in_report": others,
            "policy": config.policy.model_dump(mode="json"),
            "runtime": "Flower (flwr) SuperLink and one SuperNode per site; the same task "
            "messages and codec as the embedded runtime",
            "run_id": status.get("run_id"),
            "nodes": status.get("nodes", {}),
            "fingerprints_checked_before_fits": True,
            "site_protocols": status.get("site_protocols", {}),
            "site_paths": status.get("site_paths", []),
            "site_identity": site_identity(status),
            "ledgers": LEDGERS_STATEMENT,
            "disclosure": DISCLOSURE_STATEMENT,
            "noise_seed": None,
        }
    )
    run = f"over Flower (run {status.get('run_id')})"
    for fit in tables:
        record = results[fit.name]
        recorder.record_curves(
            fit.name,
            _result_fields(record),
            description=f"Kaplan-Meier curves {fit.name!r} {run}",
            analyses=record.get("analyses") or (),
        )
    for fit in models:
        record = results[fit.name]
        recorder.record_fit(
            fit.name,
            _result_fields(record),
            description=f"{fit.kind} {getattr(fit, 'formula', '')} {run}",
            analyses=record.get("analyses") or (),
        )
    for fit in networks:
        record = results[fit.name]
        recorder.record_release(
            fit.name,
            network_table(record),
            kind="trained network",
            description=f"{record.get('model')} network ({record.get('algorithm')}) "
            f"{getattr(fit, 'formula', '')} {run}; its evaluation on the sites' rows",
            analyses=record.get("analyses") or [record["provenance"]["analysis"]],
            sites=record["provenance"].get("sites") or [],
            private=record.get("privacy") is not None,
            privacy=record.get("privacy"),
            notes=record.get("notes") or (),
        )
    recorder.record_inventory(inventory)
    _copy_linkages(config, directory)
    return recorder.finish()


def _copy_linkages(config: StudyConfig, directory: Path) -> None:
    """The study's linkage records (``out/linkages/<id>.json``, checked when written) into the
    study directory, where the compliance report reads them."""
    from fedstats.jobs.study_links import linkage_path

    for entry in config.links:
        source = linkage_path(Path(config.study.out), entry.id)
        if source.is_file():
            target = directory / "linkages" / source.name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target)


def _result_fields(record: dict[str, Any]) -> dict[str, Any]:
    """A result as its fit record holds it: without the study's own fields."""
    return {k: v for k, v in record.items() if k not in ("kind", "analyses")}


def network_table(record: dict[str, Any]) -> pd.DataFrame:
    """What a trained network's record released, as one table: its evaluation per site and
    pooled when it was evaluated, otherwise its last round's history (the weights are in the
    result file, not in the report)."""
    evaluation = record.get("evaluation")
    if evaluation and evaluation.get("table"):
        table = pd.DataFrame.from_dict(evaluation["table"], orient="index")
        table.index.name = "sites"
        return table
    history = record.get("history") or []
    return pd.DataFrame(history[-1:]).rename_axis("round")


def site_identity(status: dict[str, Any]) -> dict[str, Any]:
    """Each site's node and key fingerprint as the ServerApp admitted them, and refused claims.

    From ``status.json``'s ``site_identity`` (``SiteClaims.record``, fedstats.flower.site_claims):
    ``enrolment`` (the list the sites' names were checked against, or ``None``), ``sites``
    (site -> node, fingerprint, enrolled) and ``refused`` (claims of a name by a node whose key
    is not enrolled for it). ``recorded`` is false for a run that wrote none.
    """
    identity = status.get("site_identity")
    if not isinstance(identity, dict):
        return {"recorded": False, "enrolment": None, "sites": {}, "refused": []}
    return {
        "recorded": True,
        "enrolment": identity.get("enrolment"),
        "sites": dict(identity.get("sites") or {}),
        "refused": list(identity.get("refused") or []),
    }


def record_and_report(
    config: StudyConfig,
    study_toml: Path,
    status: dict[str, Any],
    results: dict[str, dict[str, Any]],
    inventory: MessageInventory,
) -> Recorded:
    """:func:`record_study`, then :func:`write_compliance_report`.

    Raises :class:`~fedstats.jobs.study_run.RunFailed` if either fails.
    """
    from reports import ReportError

    try:
        study_dir = record_study(config, study_toml, status, results, inventory)
        html, pdf, note = write_compliance_report(study_dir, Path(config.study.out))
    except (ReportError, StudyFileError) as error:
        raise RunFailed(f"the study directory or report could not be written: {error}") from None
    return Recorded(study_dir, html, pdf, note)


def write_compliance_report(study_dir: Path, out: Path) -> tuple[Path, Path | None, str]:
    """HTML report (always) and PDF (when WeasyPrint works): (html, pdf or None, note)."""
    from reports import build_report, write_html, write_pdf
    from reports.study import Study

    report = build_report(Study.load(study_dir))
    html = write_html(report, out / f"{REPORT_NAME}.html")
    try:
        pdf = write_pdf(report, out / f"{REPORT_NAME}.pdf")
    except Exception as error:  # noqa: BLE001 - WeasyPrint needs system libraries; HTML suffices
        return html, None, f"PDF not written ({type(error).__name__}: {error})"
    return html, pdf, ""
