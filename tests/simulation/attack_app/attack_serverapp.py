"""The ServerApp of a malicious coordinator: the attacks of ``silo_attacks`` over Flower.

It reads the study.toml of run config ``study-config`` (the sites and the failure policy),
discovers the sites as the fedstats coordinator does (:class:`GridLink`; with two nodes
claiming one name, discovery refuses the study, and the attacker goes on regardless), asks
every node which site it claims, and makes every attack of :data:`silo_attacks.ATTACKS`
through a :class:`GridFederation` with one node per site; then asks the first site, through
each other node claiming it, for the second fit of a differencing pair. Everything it saw is
written as JSON to run config ``attacks-out``, also when an attack run fails.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path
from typing import Any

import silo_attacks
from flwr.app import Context, Message
from flwr.serverapp import Grid, ServerApp

from fedstats.errors import MessageFormatError, SiteIdentityError
from fedstats.flower import messages
from fedstats.flower_apps.grid_transport import GridFederation, GridLink
from fedstats.jobs.study_config import StudyConfig, load_study_config
from studyfiles.durable import write_json_atomically

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    out = Path(str(context.run_config["attacks-out"]))
    record: dict[str, Any] = {"run_id": context.run_id}
    try:
        config = load_study_config(str(context.run_config["study-config"]))
        record.update(attack(grid, config, marker=out.parent / "injected-marker"))
    except Exception as error:  # noqa: BLE001 - the test reads why the attacks did not run
        record["error"] = f"{type(error).__name__}: {error}"
        record["traceback"] = traceback.format_exc(limit=8)
    finally:
        write_json_atomically(out, record)


def claims_of(grid: Grid, timeout: float) -> dict[int, str]:
    """The site every node claims to serve (``query.identify``), by node."""
    nodes = list(grid.get_node_ids())
    ids = grid.push_messages(
        [
            Message(messages.pack(b""), dst_node_id=node,
                    message_type=messages.IDENTIFY_MESSAGE_TYPE, ttl=timeout + 60)
            for node in nodes
        ]
    )  # fmt: skip
    asked = dict(zip(ids, nodes, strict=True))
    claimed: dict[int, str] = {}
    deadline = time.monotonic() + timeout
    while asked and time.monotonic() < deadline:
        for reply in grid.pull_messages(list(asked)):
            node = asked.pop(reply.metadata.reply_to_message_id, None)
            if node is not None:
                try:
                    claimed[node] = messages.site_of(reply)
                except MessageFormatError:
                    continue
        time.sleep(0.02)
    return claimed


def attack(grid: Grid, config: StudyConfig, *, marker: Path) -> dict[str, Any]:
    sites, study = config.study.sites, config.study.name
    link = GridLink(grid, config.policy)
    try:
        link.discover(sites)
        discovery: dict[str, Any] = {"outcome": "admitted", "nodes": dict(link.nodes)}
    except SiteIdentityError as error:
        discovery = {"outcome": "refused", "error_type": type(error).__name__, "error": str(error)}
    discovery["claims"] = link.claims.record()
    claimed = claims_of(grid, config.policy.discovery_timeout)
    bound = {site: int(node) for site, node in link.claims.bound.items()}
    primary = {site: bound.get(site, min(n for n, s in claimed.items() if s == site))
               for site in sites}  # fmt: skip
    twins = sorted((n, s) for n, s in claimed.items() if s in sites and primary[s] != n)
    link.nodes = dict(primary)
    fed = GridFederation(link, sites, study=study)
    arena = silo_attacks.Arena(study=study, marker=marker)
    outcomes = silo_attacks.run_attacks(fed, arena)
    inventories = [fed.inventory]
    twin_outcomes = []
    for node, site in twins:
        twin = GridLink(grid, config.policy)
        twin.nodes = {site: node}
        twin_fed = GridFederation(twin, [site], study=study)
        twin_outcomes.append({"node": node, **silo_attacks.twin_differencing(twin_fed)})
        inventories.append(twin_fed.inventory)
    requests: dict[str, int] = {}
    for inventory in inventories:
        for message in inventory.records():
            requests[message.site] = requests.get(message.site, 0) + 1
    return {
        "discovery": discovery,
        "claimed": {str(node): site for node, site in claimed.items()},
        "primary": primary,
        "outcomes": outcomes,
        "twins": twin_outcomes,
        "requests": requests,
        "lost": link.lost,
    }
