"""Command-line interface: ``fedstats demo``, ``harmonize``, ``synthetic-export``,
``budget show``/``set``, ``report``, ``site run``, ``study run`` and ``link check``/``run``.

Help texts are plain text (no reStructuredText markup): they are what a user
reads in a terminal. Progress and events go to stderr through ``logging``
(:mod:`fedstats.cli.logs`); results go to stdout.
"""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

import typer

from fedstats.cli.budget import budget_app
from fedstats.cli.jobs import site_app, study_app
from fedstats.cli.link import link_app
from fedstats.cli.logs import configure, fail

app = typer.Typer(
    help="fedstats: privacy-accounted biostatistics for multi-site clinical studies.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


app.add_typer(budget_app, name="budget")
app.add_typer(site_app, name="site")
app.add_typer(study_app, name="study")
app.add_typer(link_app, name="link")


def _print_version(requested: bool) -> None:
    """``--version``: the installed distribution's version (``importlib.metadata``)."""
    if not requested:
        return
    from importlib.metadata import PackageNotFoundError, version

    try:
        typer.echo(f"fedstats {version('fedstats')}")
    except PackageNotFoundError:
        import fedstats

        typer.echo(f"fedstats {fedstats.__version__} (source tree, not installed)")
    raise typer.Exit()


@app.callback()
def main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the installed version and exit.",
        ),
    ] = False,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress lines; warnings and errors only.")
    ] = False,
    json_log: Annotated[
        bool,
        typer.Option(
            "--json-log",
            help="Progress, warnings and errors on stderr as one JSON object per line "
            "(time, level, event, message, fields), for cron and systemd.",
        ),
    ] = False,
) -> None:
    """fedstats command-line interface."""
    configure(quiet=quiet, json_log=json_log)


class HarmonizeExit:
    """Exit codes of ``fedstats harmonize`` (for cron, systemd and Airflow)."""

    OK = 0
    CONFIGURATION = 2
    FAILED = 3
    EMPTY_COHORT = 4


@app.command()
def harmonize(
    spec: Annotated[Path, typer.Option(help="The study specification (TOML).")],
    site: Annotated[str, typer.Option(help="This site's name in the study.")],
    out: Annotated[Path, typer.Option(help="Output folder for frame, report and quarantine.")],
    fhir: Annotated[
        list[Path] | None, typer.Option(help="FHIR R4 Bundles (.json) or NDJSON files/folders.")
    ] = None,
    omop: Annotated[
        Path | None, typer.Option(help="OMOP CDM folder (CSV or Parquet) or DuckDB file.")
    ] = None,
    max_rejected_share: Annotated[
        float, typer.Option(help="Stop when a file has a larger share of rejected records.")
    ] = 0.10,
    latest_date: Annotated[
        datetime | None,
        typer.Option(
            formats=["%Y-%m-%d"],
            help="Reject records dated after this (default: "
            "today); date-shifted sources such as MIMIC-IV need a later date.",
        ),
    ] = None,
    memory_limit: Annotated[
        str, typer.Option(help="Memory the record store (DuckDB) may use, e.g. 1GB or 4GB.")
    ] = "1GB",
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Processes validating large FHIR NDJSON files (default: the machine's cores, "
            "at most 4).",
        ),
    ] = None,
) -> None:
    """Harmonise this site's FHIR or OMOP data into the study's analysis frame.

    Writes frame.parquet, report.json, report.txt and quarantine.csv to OUT.
    Exit codes: 0 success; 2 configuration error; 3 harmonisation failure;
    4 empty cohort. report.json is written in every case but a missing
    source option; a failed run writes its report and quarantine.csv.
    """
    from fedstats.cli.progress import harmonization_progress
    from harmonize.errors import HarmonizationError, HarmonizationFailed, SpecError
    from harmonize.report import HarmonizationReport
    from harmonize.run import harmonize as run_harmonize
    from harmonize.run import write_failed_outputs, write_outputs, write_report
    from harmonize.spec import load_spec

    if (fhir is None) == (omop is None):
        fail(
            "give exactly one source: --fhir PATH (repeatable) or --omop PATH",
            HarmonizeExit.CONFIGURATION,
        )
    if out.exists() and not out.is_dir():
        fail(
            f"--out {out} is a file, not a folder: name a folder (it is created if missing) "
            "for the frame, report and quarantine",
            HarmonizeExit.CONFIGURATION,
        )
    sources = list(fhir or [omop])
    missing = [str(p) for p in sources if not p.exists()]
    problem = (
        f"no such file or folder: {', '.join(missing)}; check --fhir / --omop" if missing else ""
    )
    study = None
    if not problem:
        try:
            study = load_spec(spec)
        except SpecError as error:
            problem = str(error)
    if study is None:
        write_report(
            HarmonizationReport(
                site=site,
                source_kind="fhir" if fhir else "omop",
                sources=[str(p) for p in sources],
                study="",
                spec_digest="",
                status="failed",
                failure=problem,
            ),
            out,
        )
        fail(problem, HarmonizeExit.CONFIGURATION)
    try:
        result = run_harmonize(
            study,
            site=site,
            fhir=fhir,
            omop=omop,
            max_rejected_share=max_rejected_share,
            latest_date=latest_date.date() if latest_date else None,
            memory_limit=memory_limit,
            workers=workers,
            progress=harmonization_progress(site),
        )
    except HarmonizationFailed as failed:
        write_failed_outputs(failed, out)
        fail(f"harmonisation failed: {failed}", HarmonizeExit.FAILED)
    except HarmonizationError as error:
        fail(f"harmonisation failed: {error}", HarmonizeExit.FAILED)
    write_outputs(result, out)
    typer.echo(result.report.to_text())
    if result.report.status == "empty cohort":
        fail(
            f"empty cohort: no patient of site {site!r} meets the study's criteria "
            f"(report in {out / 'report.json'})",
            HarmonizeExit.EMPTY_COHORT,
        )


SYNTHETIC_MARK = "SYNTHETIC-EXPORT.txt"
"""The note ``fedstats synthetic-export`` leaves in its folder: the files are synthetic, and
the folder may be written again (any other folder that holds files is refused)."""


def synthetic_seed(site: str) -> int:
    """The generator seed of a site's synthetic export: the first 8 bytes of SHA-256(site name).

    Every site of a trial study gets other patients, and a rerun writes the same files.
    """
    import hashlib

    return int.from_bytes(hashlib.sha256(site.encode("utf-8")).digest()[:8], "big")


@app.command("synthetic-export")
def synthetic_export(
    site: Annotated[str, typer.Option(help="The site's name (seeds its patients).")],
    fhir: Annotated[
        Path | None, typer.Option(help="Write FHIR R4 Bulk Data NDJSON into this new folder.")
    ] = None,
    omop: Annotated[
        Path | None, typer.Option(help="Write OMOP CDM 5.4 CSV tables into this new folder.")
    ] = None,
    patients: Annotated[
        int, typer.Option(min=50, max=100_000, help="Number of synthetic patients.")
    ] = 1000,
    seed: Annotated[
        int | None,
        typer.Option(min=0, help="Generator seed (default: from the site's name)."),
    ] = None,
) -> None:
    """Write a synthetic EHR export (no real patient) to try the study's tools on.

    The patients (harmonize.synthetic_ehr) have visits, systolic blood
    pressure and BMI measurements, diabetes and hypertension diagnoses,
    statin prescriptions and deaths, coded as the demonstration study
    (fedstats/examples/demo/study.toml) expects. A real site points
    fedstats harmonize at its own export instead. The folder gets a note
    saying its files are synthetic; a folder written so before is written
    again. Exit code 2 when the folder holds other files (nothing is
    overwritten) or the options are wrong.
    """
    from harmonize.synthetic_ehr import synthetic_ehr, write_fhir_ndjson, write_omop_csv

    if (fhir is None) == (omop is None):
        fail("give exactly one folder: --fhir DIR or --omop DIR", 2)
    folder = fhir if fhir is not None else omop
    earlier = folder.is_dir() and (folder / SYNTHETIC_MARK).is_file()
    if folder.exists() and not earlier and (not folder.is_dir() or any(folder.iterdir())):
        fail(
            f"{folder} already exists and holds files that fedstats synthetic-export did not "
            "write: name a new folder (nothing was written, nothing is overwritten)",
            2,
        )
    if earlier:
        for old in folder.iterdir():
            if old.is_file():
                old.unlink()
    ehr = synthetic_ehr(patients, seed=synthetic_seed(site) if seed is None else seed)
    written = write_fhir_ndjson(ehr, folder) if fhir is not None else write_omop_csv(ehr, folder)
    kind = "FHIR R4 NDJSON" if fhir is not None else "OMOP CDM 5.4 CSV"
    (folder / SYNTHETIC_MARK).write_text(
        f"Synthetic patients (no real person) of site {site!r}, written by fedstats "
        f"synthetic-export: {patients} patients, {kind}, seed "
        f"{synthetic_seed(site) if seed is None else seed}.\n",
        encoding="utf-8",
    )
    typer.echo(f"{patients} synthetic patients of site {site!r} written to {written} ({kind})")


@app.command()
def report(
    study: Annotated[
        Path, typer.Option(help="The study directory (written by reports.StudyRecorder).")
    ],
    out: Annotated[Path, typer.Option(help="The report to write: FILE.html or FILE.pdf.")],
) -> None:
    """Write the privacy compliance report of a recorded study as HTML or PDF.

    Every figure comes from the study directory's recorded files (ledgers,
    message inventory, harmonisation reports, fit records, configuration).
    Exit code 2 for a missing or invalid study directory or output name.
    """
    from reports import ReportError, write_report

    try:
        path = write_report(study, out)
    except ReportError as error:
        fail(str(error), 2)
    typer.echo(f"report written to {path.resolve()}")


@app.command()
def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder holding heart_disease/ (default: $FEDSTATS_DATA/heart_disease if present, "
            "else the copy shipped with the package)."
        ),
    ] = None,
    site_intercepts: Annotated[
        bool, typer.Option(help="One intercept per hospital (fixed site effects).")
    ] = False,
    private: Annotated[
        bool,
        typer.Option(
            help="Also fit under record-level DP (epsilon 1, delta 1e-3) and run the private "
            "study with its compliance report."
        ),
    ] = True,
    out_dir: Annotated[
        Path, typer.Option(help="Where the study and its compliance report are written.")
    ] = Path("demo-output"),
) -> None:
    """Federated logistic regression on the UCI heart-disease data of four hospitals.

    Each hospital's rows stay behind its own silo; the coordinator fits from
    summed gradients and Hessians. The result is printed next to statsmodels'
    GLM on the pooled rows, with the largest difference. Then the same model
    under record-level differential privacy: each hospital charges its own
    ledger (kept in a temporary folder) before it releases noisy aggregates.

    Finally the whole workflow of a private study (fedstats.jobs.demo): four
    synthetic hospitals' FHIR and OMOP exports are harmonised, exact,
    record-level and client-level private fits are made, everything is
    recorded in OUT_DIR/study and the compliance report is written as
    OUT_DIR/compliance-report.html and .pdf.
    """
    from fedstats.errors import DemoFailed
    from fedstats.jobs.demo import run_heart_demo

    try:
        run_heart_demo(data_dir, site_intercepts=site_intercepts, private=private, out_dir=out_dir)
    except DemoFailed as failure:
        fail(str(failure), failure.code)


if __name__ == "__main__":
    app()
