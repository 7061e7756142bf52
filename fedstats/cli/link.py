"""``fedstats link check`` (a site) and ``fedstats link run`` (the coordinator).

``link check --config site.toml`` prepares the site's frame as ``fedstats site run`` does
and prints what the site would encode for a record linkage: patients, per identifier field
the number without a value, and the ``[linkage]`` schema's fingerprint — never a value
(:mod:`fedstats.jobs.link_check`). ``link run --config study.toml`` makes only the study's
``[[links]]``, over Flower as ``fedstats study run`` would, and prints each linkage's pairs
and per-site counts (counts from 1 to k - 1 as ``< k``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from fedstats.cli.logs import fail
from fedstats.jobs.exit_codes import SITE_EXIT_HELP, STUDY_EXIT_HELP, SiteExit, StudyExit

link_app = typer.Typer(help="Record linkage of a vertical study.", no_args_is_help=True)


@link_app.callback()
def link() -> None:
    """Record linkage: fedstats link check (a site), fedstats link run (the coordinator)."""


@link_app.command(
    "check",
    help=f"""Print what this site would encode for a record linkage, never a value.

Reads only SITE.TOML. Harmonises the sources if they changed (else reuses the
last frame), reads the identifier table kept beside the frame (or the data
section's identifiers file) and checks it against the frame and the linkage
table of the study specification. Prints the patients the site would encode, per identifier
field how many have no value, and the schema's SHA-256 fingerprint (the other
site and the coordinator must show the same). Nothing is sent.

{SITE_EXIT_HELP}""",
)
def link_check(
    config: Annotated[Path, typer.Option(help="The site's configuration (site.toml).")],
) -> None:
    from fedstats.jobs.link_check import check_site_linkage

    outcome = check_site_linkage(config)
    check = outcome.check
    if outcome.exit_code != SiteExit.OK or check is None:
        name = outcome.exit_code.name.lower().replace("_", " ")
        fail(f"{name}: {outcome.reason}", outcome.exit_code)
        return
    typer.echo(f"site: {check.site} (frame {check.frame_origin})")
    typer.echo(f"patients to encode: {check.patients}")
    for field, missing in check.missing.items():
        typer.echo(f"missing {field}: {missing}")
    typer.echo(f"linkage schema fingerprint: {check.fingerprint}")


@link_app.command(
    "run",
    help=f"""Make the study's record linkages (the links tables of STUDY.TOML) over Flower.

Submits the study's ServerApp as fedstats study run does, with only the
links step: each linkage is recorded in OUT/linkages/<id>.json and one
already recorded is not made again. Prints per linkage its pairs and per site
the records sent and linked (counts from 1 to k - 1 as "< k").

{STUDY_EXIT_HELP}""",
)
def link_run(
    config: Annotated[Path, typer.Option(help="The coordinator's study configuration.")],
) -> None:
    from fedstats.jobs.study_config import load_study_config
    from fedstats.jobs.study_links import linkage_lines, load_linkages
    from fedstats.jobs.study_run import run_study_job

    run = run_study_job(config, record=None, links_only=True)
    if run.exit_code != StudyExit.OK:
        fail(f"{run.exit_code.name.lower().replace('_', ' ')}: {run.reason}", run.exit_code)
        return
    for line in linkage_lines(load_linkages(load_study_config(config))):
        typer.echo(line)
    typer.echo(run.reason)
