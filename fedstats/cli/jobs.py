"""Command-line jobs of a multi-machine study: ``fedstats site run`` and ``fedstats study run``.

``site_app`` and ``study_app`` are added to the ``fedstats`` command as
``site`` and ``study``. Each command prints one line saying what it did (or
why not) and exits with the code its module documents
(:mod:`fedstats.jobs.site_batch`, :mod:`fedstats.jobs.study_run`), for cron, systemd
timers and Airflow. ``python -m fedstats.cli.jobs site run --config ...``
runs the same commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedstats.cli.logs import configure, fail
from fedstats.jobs.exit_codes import SITE_EXIT_HELP, STUDY_EXIT_HELP, SiteExit, StudyExit

site_app = typer.Typer(help="A site's scheduled batch job.", no_args_is_help=True)
study_app = typer.Typer(help="The coordinator's study run.", no_args_is_help=True)


@site_app.callback()
def site() -> None:
    """A site's scheduled batch job: fedstats site run --config site.toml."""


@study_app.callback()
def study() -> None:
    """The coordinator's study run: fedstats study run --config study.toml."""


@site_app.command(
    "run",
    help=f"""Harmonise this site's sources if they changed and serve the
study's requests for one run, then stop.

Reads only SITE.TOML. Harmonises the FHIR or OMOP sources when they, the
specification or the options changed since the last run (else reuses the
last frame), serves the coordinator's requests through the site's SuperNode
until the coordinator stops asking or serve_timeout passes, stops every
process it started and writes a run record to WORKDIR/runs/<UTC time>.json.
A lock in WORKDIR keeps two runs from overlapping.

{SITE_EXIT_HELP}""",
)
def site_run(
    config: Annotated[Path, typer.Option(help="The site's configuration (site.toml).")],
) -> None:
    from fedstats.jobs.site_batch import run_site_job

    run = run_site_job(config)
    where = f" (run record: {run.record_path})" if run.record_path else ""
    if run.exit_code == SiteExit.OK:
        typer.echo(f"{run.reason}{where}")
        return
    fail(f"{run.exit_code.name.lower().replace('_', ' ')}: {run.reason}{where}", run.exit_code)


@site_app.command(
    "protocol",
    help="""Check a protocol file and print what it approves and its SHA-256.

A privacy officer approves the printed text: put the SHA-256 in site.toml as
[disclosure] protocol_sha256 beside protocol = "FILE", and the site refuses
the file once it changes. Exit code 2 when the file is not a valid protocol.""",
)
def site_protocol(
    path: Annotated[Path, typer.Argument(help="The protocol file (TOML).")],
) -> None:
    from fedstats.errors import StudyConfigurationError
    from fedstats.site.protocol import load_protocol

    try:
        protocol = load_protocol(path, named_by="the path given to fedstats site protocol")
    except StudyConfigurationError as error:
        fail(str(error), SiteExit.CONFIGURATION)
    typer.echo(f"protocol: {protocol.title}")
    if protocol.approved_by or protocol.approved_on:
        typer.echo(f"approved by: {protocol.approved_by or '-'} on {protocol.approved_on or '-'}")
    exploration = "answered and charged" if protocol.dp_exploration else "refused"
    typer.echo(f"private requests outside these analyses: {exploration}")
    for analysis in protocol.analyses:
        terms = " + ".join(sorted(analysis.terms)) if analysis.terms else ""
        what = f"{analysis.outcome} ~ {terms}" if terms else analysis.outcome
        extras = [
            f"strata {sorted(analysis.strata)}" if analysis.strata else "",
            f"groups {sorted(analysis.groups)}" if analysis.groups else "",
            f"time grid of {len(analysis.time_grid)} points" if analysis.time_grid else "",
            f"at most {analysis.max_rounds} exact rounds" if analysis.max_rounds else "",
            "private only" if analysis.privacy == "dp" else "exact or private",
        ]
        typer.echo(
            f"- {analysis.name} ({analysis.model}): {what}; " + "; ".join(e for e in extras if e)
        )
    typer.echo(f'protocol_sha256 = "{protocol.digest}"')


@site_app.command(
    "verify",
    help="""Re-derive every exact answer this site gave on a verified path,
from its own records.

Reads only SITE.TOML: replays, in order and offline, each request the site
answered on a verified path (kept under WORKDIR/paths beside the journal):
the request must be the one the journal recorded, its path must verify again
with the pinned roster (every relayed signature, every point re-derived),
and the reply must carry the site's own signature. Prints each fit's path
(task, rounds, the last answered point's SHA-256). Exit code 0 when
everything verifies, 6 when anything does not (each problem printed), 2 for
a configuration error.""",
)
def site_verify(
    config: Annotated[Path, typer.Option(help="The site's configuration (site.toml).")],
) -> None:
    from fedstats.errors import FedstatsError
    from fedstats.jobs.path_audit import audit_site
    from fedstats.jobs.site_config import load_site_config

    try:
        audit = audit_site(load_site_config(config))
    except FedstatsError as error:
        fail(str(error), SiteExit.CONFIGURATION)
    for fit in audit.fits:
        typer.echo(
            f"- {fit.task} (request {fit.request[:12]}, sites {', '.join(fit.sites)}): "
            f"{fit.answers} answers in {fit.rounds} rounds, last point sha256 {fit.last_point}"
        )
    for problem in audit.problems:
        typer.echo(f"problem: {problem}", err=True)
    summary = (
        f"site {audit.site}: {audit.answers} answers on {len(audit.fits)} verified paths and "
        f"{audit.evaluations} evaluations re-derived"
    )
    if not audit.ok:
        fail(f"{summary}; {len(audit.problems)} did not verify", SiteExit.DISCLOSURE_REFUSED)
    typer.echo(f"{summary}; every one verifies")


@study_app.command(
    "run",
    help=f"""Run the study over Flower and write its study directory and
compliance report.

Submits the study's ServerApp to the SuperLink named in STUDY.TOML
[coordinator], waits for its status (run_timeout), checks that every site's
fingerprint was compared before any fit, then writes OUT/study (configuration
with its hash, inventory, fit records, versions) and
OUT/compliance-report.html (and .pdf when WeasyPrint works).

{STUDY_EXIT_HELP}""",
)
def study_run(
    config: Annotated[Path, typer.Option(help="The coordinator's study configuration.")],
) -> None:
    from fedstats.jobs.study_record import record_and_report
    from fedstats.jobs.study_run import run_study_job

    run = run_study_job(config, record=record_and_report)
    if run.exit_code == StudyExit.OK:
        typer.echo(run.reason)
        return
    fail(f"{run.exit_code.name.lower().replace('_', ' ')}: {run.reason}", run.exit_code)


def _plain_log() -> None:
    """fedstats jobs: progress as plain lines on stderr."""
    configure(quiet=False, json_log=False)


def main() -> None:
    """``python -m fedstats.cli.jobs``: the two jobs without the rest of the command line."""
    jobs = typer.Typer(
        no_args_is_help=True,
        add_completion=False,
        context_settings={"help_option_names": ["-h", "--help"]},
    )
    jobs.callback()(_plain_log)
    jobs.add_typer(site_app, name="site")
    jobs.add_typer(study_app, name="study")
    jobs()


if __name__ == "__main__":
    main()
