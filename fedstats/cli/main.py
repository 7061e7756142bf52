"""Command-line interface: ``fedstats demo``, ``harmonize``, ``budget show``, ``report``,
``site run`` and ``study run``."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Annotated

import numpy as np
import pandas as pd
import typer

import accounting
import fedstats
from fedstats import datasets
from fedstats.cli.jobs import site_app, study_app
from fedstats.errors import DisclosureError, FedstatsError
from reports import budget_table, data_flows

app = typer.Typer(
    help="fedstats: privacy-accounted biostatistics for multi-site clinical studies.",
    no_args_is_help=True,
    add_completion=False,
)


budget_app = typer.Typer(help="Privacy budgets kept in a ledger.", no_args_is_help=True)
app.add_typer(budget_app, name="budget")
app.add_typer(site_app, name="site")
app.add_typer(study_app, name="study")


@app.callback()
def main() -> None:
    """fedstats command-line interface."""


@budget_app.command("show")
def budget_show(
    ledger: Annotated[Path, typer.Option(help="The ledger file (a site's or the coordinator's).")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON document, for machines.")
    ] = False,
) -> None:
    """Scopes, budgets, epsilon spent (RDP and PLD), remaining and entries in a ledger."""
    if not ledger.is_file():
        typer.secho(f"error: no ledger at {ledger}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2)
    try:
        with accounting.Ledger(ledger) as book:
            table = budget_table(book)
    except accounting.LedgerError as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None
    if as_json:
        typer.echo(json.dumps({"ledger": str(ledger), "scopes": table.to_dict(orient="records")}))
    elif table.empty:
        typer.echo(f"{ledger}: no scopes")
    else:
        typer.echo(table.to_string(index=False, float_format=lambda v: f"{v:.4f}"))


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
    source option.
    """
    from harmonize.errors import HarmonizationError, SpecError
    from harmonize.report import HarmonizationReport
    from harmonize.run import HarmonizationFailed, write_outputs, write_report
    from harmonize.run import harmonize as run_harmonize
    from harmonize.spec import load_spec

    if (fhir is None) == (omop is None):
        _fail(
            "give exactly one source: --fhir PATH (repeatable) or --omop PATH",
            HarmonizeExit.CONFIGURATION,
        )
    try:
        study = load_spec(spec)
    except SpecError as error:
        write_report(
            HarmonizationReport(
                site=site,
                source_kind="fhir" if fhir else "omop",
                sources=[str(p) for p in (fhir or [omop])],
                study="",
                spec_digest="",
                status="failed",
                failure=str(error),
            ),
            out,
        )
        _fail(str(error), HarmonizeExit.CONFIGURATION)
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
        )
    except HarmonizationFailed as failed:
        write_report(failed.report, out)
        _fail(f"harmonisation failed: {failed}", HarmonizeExit.FAILED)
    except HarmonizationError as error:
        _fail(f"harmonisation failed: {error}", HarmonizeExit.FAILED)
    write_outputs(result, out)
    typer.echo(result.report.to_text())
    if result.report.status == "empty cohort":
        _fail(
            f"empty cohort: no patient of site {site!r} meets the study's criteria "
            f"(report in {out / 'report.json'})",
            HarmonizeExit.EMPTY_COHORT,
        )


def _fail(message: str, code: int) -> None:
    typer.secho(f"error: {message.splitlines()[0]}", fg=typer.colors.RED, err=True)
    for line in message.splitlines()[1:]:
        typer.echo(line, err=True)
    raise typer.Exit(code=code)


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
        _fail(str(error), 2)
    typer.echo(f"report written to {path.resolve()}")


@app.command()
def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option(
            help="Folder holding heart_disease/ (default: $FEDSTATS_DATA or shared/data)."
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

    Finally the whole workflow of a private study (``reports.demo``): four
    synthetic hospitals' FHIR and OMOP exports are harmonised, exact,
    record-level and client-level private fits are made, everything is
    recorded in OUT_DIR/study and the compliance report is written as
    OUT_DIR/compliance-report.html and .pdf.
    """
    try:
        everyone = datasets.heart_disease(data_dir)
        model = fedstats.LogisticRegression(datasets.HEART_FORMULA, site_intercepts=site_intercepts)
        data, federation, result = _fit_where_answered(everyone, model)
    except FedstatsError as error:
        typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code=2) from None

    typer.echo(f"Data: {data.source}")
    typer.echo(data.counts().to_string())
    typer.echo(f"(excluded: {data.exclusion_reason})\n")
    typer.echo(result.summary())
    typer.echo("")
    comparison, largest = _compare_with_pooled(data.frames, result, site_intercepts)
    typer.echo("Federated vs pooled statsmodels GLM Binomial (fit to tol=1e-12):")
    typer.echo(comparison.to_string(float_format=lambda v: f"{v:.10f}"))
    typer.echo(
        f"\nLargest |difference|: coefficients {largest['params']:.2e}, "
        f"standard errors {largest['bse']:.2e}, log-likelihood {largest['llf']:.2e}"
    )
    typer.echo("\nWhat left each site (messages and bytes; no row-level data):")
    flows = data_flows(federation.inventory)
    typer.echo(flows[["messages", "refused", "bytes_out", "bytes_in"]].to_string())
    if private:
        _private_demo(everyone.frames, result, site_intercepts)
        _study_demo(out_dir)


def _study_demo(out_dir: Path) -> None:
    """Harmonise, fit, record and report the demonstration study under ``out_dir``."""
    import time

    from reports import ReportError, build_report, format_epsilon, write_html, write_pdf
    from reports.demo import SITES, run_demo_study
    from reports.study import Study

    started = time.perf_counter()
    sources = ", ".join(f"{s.name} ({s.source.upper()})" for s in SITES)
    typer.echo(f"\nA private study from raw extracts: harmonising {sources} ...")
    try:
        study_dir = run_demo_study(out_dir)
        study = Study.load(study_dir)
        report = build_report(study)
        html = write_html(report, out_dir / "compliance-report.html")
        pdf = write_pdf(report, out_dir / "compliance-report.pdf")
    except (FedstatsError, ReportError) as error:
        _fail(str(error), 2)
    typer.echo("Privacy spent per scope (from the ledgers in the study directory):")
    budgets = pd.DataFrame(
        [
            {
                "owner": s.owner,
                "level": s.level,
                "budget epsilon": s.budget_epsilon,
                "epsilon (RDP)": s.epsilon_rdp,
                "epsilon (PLD)": s.epsilon_pld,
                "charges": s.entries,
            }
            for s in report.scopes
        ]
    )
    typer.echo(budgets.to_string(index=False, float_format=format_epsilon))
    typer.echo(f"\nStudy directory: {study_dir.resolve()}")
    typer.echo(f"Compliance report (HTML): {html.resolve()}")
    typer.echo(f"Compliance report (PDF):  {pdf.resolve()}")
    typer.echo(f"(study and report in {time.perf_counter() - started:.0f} s)")


def _fit_where_answered(
    data: datasets.SiteFrames, model: fedstats.LogisticRegression
) -> tuple[datasets.SiteFrames, fedstats.Federation, fedstats.LogisticRegressionResults]:
    """Fit at every hospital that answers; a hospital whose disclosure rules refuse the exact
    fit (Switzerland's cells are too small) is named with its reason and left out."""
    while True:
        federation = fedstats.Federation.in_process(data.frames, study="heart-disease-demo")
        try:
            return data, federation, model.fit(federation)
        except DisclosureError as refusal:
            if refusal.site not in data.frames or len(data.frames) == 1:
                raise
            typer.secho(
                f"{refusal}\nThe exact fit goes on without {refusal.site!r} (it can take part "
                "in private analyses, where noise protects its small cells).\n",
                fg=typer.colors.YELLOW,
            )
            data = data.only([s for s in data.frames if s != refusal.site])


def _private_demo(
    frames: dict[str, pd.DataFrame],
    exact: fedstats.LogisticRegressionResults,
    site_intercepts: bool,
) -> None:
    """The same model under record-level DP, each site charging its own ledger."""
    study = "heart-disease-demo"
    privacy = fedstats.RecordDP(epsilon=1.0, delta=1e-3, bounds=datasets.HEART_BOUNDS)
    with tempfile.TemporaryDirectory() as folder:
        ledgers = {}
        for site in frames:
            ledger = accounting.Ledger(Path(folder) / f"{site}.ledger")
            ledger.set_budget(
                accounting.Scope(unit="patient", owner=site, study=study), epsilon=3.0, delta=1e-3
            )
            ledgers[site] = ledger
        federation = fedstats.Federation.in_process(frames, study=study, ledgers=ledgers)
        model = fedstats.LogisticRegression(
            datasets.HEART_FORMULA, levels=datasets.HEART_LEVELS, site_intercepts=site_intercepts
        )
        try:
            result = model.fit(federation, privacy=privacy)
        except FedstatsError as error:
            typer.secho(f"error: {error}", fg=typer.colors.RED, err=True)
            raise typer.Exit(code=2) from None
        typer.echo(
            "\nUnder record-level differential privacy (each hospital: epsilon 1, delta "
            "1e-3 for this fit, out of a budget of 3):"
        )
        typer.echo(result.summary())
        ratios = pd.DataFrame(
            {
                "exact odds ratio": exact.odds_ratios()["odds_ratio"],
                "private odds ratio": result.odds_ratios()["odds_ratio"],
            }
        )
        typer.echo(ratios.to_string(float_format=lambda v: f"{v:.3f}"))
        typer.echo("\nEach hospital's ledger after the fit:")
        budgets = pd.concat(
            [budget_table(ledger) for ledger in ledgers.values()], ignore_index=True
        )
        typer.echo(
            budgets[
                ["owner", "budget_epsilon", "epsilon_rdp", "epsilon_pld", "remaining", "entries"]
            ].to_string(index=False, float_format=lambda v: f"{v:.4f}")
        )
        for ledger in ledgers.values():
            ledger.close()


def _compare_with_pooled(
    frames: dict[str, pd.DataFrame],
    result: fedstats.LogisticRegressionResults,
    site_intercepts: bool,
) -> tuple[pd.DataFrame, dict[str, float]]:
    import statsmodels.api as sm
    import statsmodels.formula.api as smf

    pooled = pd.concat(frames.values(), ignore_index=True)
    formula = datasets.HEART_FORMULA
    if site_intercepts:
        pooled["site"] = np.repeat(list(frames), [len(f) for f in frames.values()])
        formula = formula.replace("~", "~ 0 + C(site) +")
    model = smf.glm(formula, pooled, family=sm.families.Binomial())
    first = model.fit(tol=1e-12)
    # One more IRLS pass from the estimate, so statsmodels' weights (and bse) are at the MLE.
    reference = model.fit(start_params=first.params, tol=1e-12)
    rename = {n: n.replace("C(site)[", "site[") for n in reference.params.index}
    ref_params = reference.params.rename(rename)[result.params.index]
    ref_bse = reference.bse.rename(rename)[result.params.index]
    table = pd.DataFrame(
        {
            "federated": result.params,
            "pooled": ref_params,
            "|diff|": (result.params - ref_params).abs(),
            "se federated": result.bse,
            "se pooled": ref_bse,
        }
    )
    largest = {
        "params": float(table["|diff|"].max()),
        "bse": float((result.bse - ref_bse).abs().max()),
        "llf": abs(result.llf - reference.llf),
    }
    return table, largest


if __name__ == "__main__":
    app()
