"""The coordinator's Flower ServerApp: the study's fits over the Flower network.

``flwr run`` submits this app with the run config ``study-config`` (the path
of ``study.toml`` on the coordinator's machine). The ServerApp finds each
expected site's node (with ``[identity]``, only the node whose authenticated
key the study's enrolment list binds to the site's name:
:mod:`fedstats.flower.site_claims`), checks the sites' fingerprints before any
other task, makes the configured record linkages and fits
(:func:`fedstats.jobs.study_fits.run_fits`,
the same code as the embedded runtime) and writes, under the study's ``out`` folder,
one result per fit, the message inventory and ``status.json`` (with each
site's node and key fingerprint, and every refused claim: ``site_identity``).
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.superlink.grid import http_grid

from fedstats.errors import FedstatsError
from fedstats.flower.enrolment import Enrolment, read_enrolment
from fedstats.flower.study_pace import checked_flower, quick_object_pulls
from fedstats.flower_apps.grid_transport import GridFederation, GridLink
from fedstats.jobs.study_config import StudyConfig, load_study_config
from fedstats.jobs.study_fits import run_fits
from fedstats.jobs.study_links import STEPS_KEY, run_links
from studyfiles.durable import write_json_atomically

STUDY_CONFIG_KEY = "study-config"
STATUS_FILE = "status.json"
INVENTORY_FILE = "inventory-{run_id}.jsonl"

app = ServerApp()

if checked_flower():  # the grid pulls a reply's objects after 5 ms, not 1 s (see the module)
    quick_object_pulls(http_grid)


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run the study named by the run config's ``study-config``."""
    path = context.run_config.get(STUDY_CONFIG_KEY)
    if not isinstance(path, str) or not path:
        raise FedstatsError(
            f"the run config has no {STUDY_CONFIG_KEY!r}; submit with "
            f"flwr run --run-config '{STUDY_CONFIG_KEY}=\"/path/to/study.toml\"'"
        )
    steps = context.run_config.get(STEPS_KEY, "all")
    run_study(grid, load_study_config(path), run_id=context.run_id, links_only=steps == "links")


def load_enrolment(config: StudyConfig) -> Enrolment | None:
    """The study's enrolment list (``[identity]``), verified against the study CA."""
    if config.identity is None:
        return None
    enrolment = read_enrolment(
        config.identity.enrolment, config.identity.study_ca, study=config.study.name
    )
    for site in config.study.sites:
        enrolment.fingerprint(site)  # EnrolmentError names a study site the list lacks
    return enrolment


def run_study(
    grid: Grid, config: StudyConfig, *, run_id: int = 0, links_only: bool = False
) -> dict[str, Any]:
    """Discover sites, verify fingerprints, make the linkages and the fits (``links_only``:
    the linkages only); always write ``status.json``."""
    out = Path(config.study.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    link = GridLink(grid, config.policy)
    status: dict[str, Any] = {"run_id": run_id, "study": config.study.name, "status": "running"}
    federation = None
    try:
        link.claims.enrolment = load_enrolment(config)
        link.discover(config.study.sites)
        status["nodes"] = {site: str(node) for site, node in link.nodes.items()}
        federation = GridFederation(link, config.study.sites, study=config.study.name)
        if links_only:
            linked = run_links(config, federation)
            status.update(status="completed", links=sorted(linked))
        else:
            results = run_fits(config, federation)
            status.update(
                status="completed",
                fits=sorted(results),
                links=sorted(entry.id for entry in config.links),
            )
    except Exception as error:
        status.update(
            status="failed",
            error_type=type(error).__name__,
            error=str(error),
            traceback=traceback.format_exc(limit=5),
        )
        raise
    finally:
        status["seconds"] = time.perf_counter() - started
        status["lost"] = link.lost
        status["site_identity"] = link.claims.record()
        status["bytes_sent"], status["bytes_received"] = link.bytes_sent, link.bytes_received
        if federation is not None:
            federation.inventory.save(out / INVENTORY_FILE.format(run_id=run_id))
            status["messages"] = len(federation.inventory)
            status["site_protocols"] = dict(federation.site_protocols)
            status["site_paths"] = sorted(federation.path_sites or ())
        write_json_atomically(out / STATUS_FILE, status)
    return status
