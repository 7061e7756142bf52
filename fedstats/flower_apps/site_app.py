"""The site's Flower ClientApp: every request reaches the site's own silo through its journal.

The SuperNode's node config names the site's configuration file
(``--node-config 'site-config="/etc/fedstats/site.toml"'``); the frame,
disclosure policy and ledger come from there, never from the coordinator.
Under Flower's simulation engine, whose virtual SuperNodes have no node
config of their own but a ``partition-id``, the run config's
``simulated-sites`` names a file listing each partition's site.toml
(:func:`fedstats.flower.local_study.write_simulated_sites`); a node with a
``site-config`` never reads it.
``query.fedstats`` messages carry codec bytes to :meth:`SiteService.answer`;
``query.identify`` answers with the site's name so the coordinator can map
sites to nodes. The service is kept for as long as the process lives (one
message under Flower's default isolation, many in a long-lived worker) and
rebuilt when the site's configuration, frame or identifier table changes; under the simulation
engine one worker process keeps the service of every site it serves, and holds
each such site's lock so that no other process serves it too. Nodes that name
one site, however its path is spelled, share its one service.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedstats.errors import ConfigError, JobAlreadyRunning
from fedstats.flower import messages
from fedstats.jobs.job_lock import JobLock
from fedstats.jobs.site_linkage import CURRENT_IDENTIFIERS
from fedstats.jobs.site_service import SiteService, frame_path
from fedstats.toml_config import load_toml_model

if TYPE_CHECKING:
    from fedstats.jobs.site_config import SiteConfig

SITE_CONFIG_KEY = "site-config"
SIMULATED_SITES_KEY = "simulated-sites"
PARTITION_KEY = "partition-id"
SIMULATED_SITE_LOCK = "simulated-site.lock"
"""In a simulated site's working folder: held by the one process that serves the site."""

app = ClientApp()
_services: dict[str, tuple[tuple[str, float, float, float], SiteService]] = {}
"""The service of each site served, by the site's working folder (its journal and differencing
guard), with the configuration file it was built from and the times of its files. Two nodes
naming one site.toml, however spelled (``sites/a/../a/site.toml``, a symbolic link), reach one
silo: a second silo of the same site would not see the row sets the first answered about."""
_simulated: dict[str, JobLock] = {}
"""The lock of each simulated site this process serves, by working folder, held until the
process ends: a simulation run with several ClientApp actors would otherwise serve one site
from several processes, each with a silo of its own. The process that did not take the lock
refuses the site's messages (``ConfigError``) and the site is not served twice."""


def site_config_path(context: Context) -> Path:
    """The site.toml this node serves: its node config's ``site-config``; under the
    simulation engine, its partition's entry of the run config's ``simulated-sites``."""
    value = context.node_config.get(SITE_CONFIG_KEY)
    if isinstance(value, str) and value:
        return Path(value)
    partition = context.node_config.get(PARTITION_KEY)
    listing = context.run_config.get(SIMULATED_SITES_KEY)
    if isinstance(partition, int) and isinstance(listing, str) and listing:
        from fedstats.flower.local_study import simulated_site

        return _per_version(
            Path(listing), f"partition {partition}", lambda f: simulated_site(f, partition)
        )
    raise ConfigError(
        f"this SuperNode has no node config {SITE_CONFIG_KEY!r}; start it with "
        f"--node-config '{SITE_CONFIG_KEY}=\"/path/to/site.toml\"'"
    )


_files: dict[tuple[str, str], tuple[int, Any]] = {}
"""What was read from each configuration file, with the file's modification time then."""


def _per_version(path: Path, what: str, read: Callable[[Path], Any]) -> Any:
    """``read(path)``, read again only when the file changes (not at every message); a file
    that cannot be looked at is read at once, for ``read`` to raise its typed error."""
    try:
        version = path.stat().st_mtime_ns
    except OSError:
        return read(path)
    key = (str(path), what)
    kept = _files.get(key)
    if kept is None or kept[0] != version:
        kept = _files[key] = (version, read(path))
    return kept[1]


def service_for(context: Context) -> SiteService:
    """The site service of this node's site.toml, built once per version of it; one per site
    (its working folder) in this process, whichever node or spelling of the path names it."""
    from fedstats.jobs.site_config import SiteConfig

    path = site_config_path(context)
    config = _per_version(
        path, "site", lambda f: load_toml_model(f, SiteConfig, what="site configuration")
    )
    frame = frame_path(config)
    identifiers = config.data.identifiers or config.workdir / CURRENT_IDENTIFIERS
    source = (
        str(path.resolve()),
        path.stat().st_mtime,
        frame.stat().st_mtime if frame.exists() else 0.0,
        identifiers.stat().st_mtime if identifiers.exists() else 0.0,
    )
    site = str(config.workdir.resolve())
    if not _deployed(context):
        hold_simulated_site(config)
    built = _services.get(site)
    if built is not None and built[0] == source:
        return built[1]
    if built is not None:
        built[1].close()
    service = SiteService(config)
    _services[site] = (source, service)
    return service


def close_services() -> None:
    """Close every site service this process built (their ledgers)."""
    for _times, service in _services.values():
        service.close()
    _services.clear()


def _deployed(context: Context) -> bool:
    """Whether the node names its own site.toml (a SuperNode of a deployment)."""
    value = context.node_config.get(SITE_CONFIG_KEY)
    return isinstance(value, str) and bool(value)


def hold_simulated_site(config: SiteConfig) -> None:
    """Take the simulated site's lock for this process (see :data:`_simulated`)."""
    site = str(config.workdir.resolve())
    if site in _simulated:
        return
    try:
        _simulated[site] = JobLock(config.workdir / SIMULATED_SITE_LOCK).acquire()
    except JobAlreadyRunning as error:
        raise ConfigError(
            f"site {config.name!r} is served by another process of this simulation ({error}); "
            "one process keeps a simulated site's silo, ledger and journal: run the simulation "
            "with one ClientApp actor (fedstats.flower.local_study.SIMULATION_FEDERATION)"
        ) from None


@app.query(messages.IDENTIFY_ACTION)
def identify(message: Message, context: Context) -> Message:
    """Say which site this node serves."""
    return Message(messages.identity(service_for(context).config.name), reply_to=message)


@app.query(messages.TASK_ACTION)
def answer(message: Message, context: Context) -> Message:
    """Answer one fedstats request with the site's silo (journaled before the reply leaves)."""
    reply = service_for(context).answer(messages.unpack(message))
    return Message(messages.pack(reply), reply_to=message)
