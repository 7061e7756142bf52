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
rebuilt when the site's configuration or frame changes; under the simulation
engine one worker process keeps the service of every site it serves.
"""

from __future__ import annotations

from pathlib import Path

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedstats.errors import ConfigError
from fedstats.flower import messages
from fedstats.jobs.site_service import SiteService, frame_path
from fedstats.toml_config import load_toml_model

SITE_CONFIG_KEY = "site-config"
SIMULATED_SITES_KEY = "simulated-sites"
PARTITION_KEY = "partition-id"

app = ClientApp()
_services: dict[str, tuple[tuple[float, float], SiteService]] = {}
"""The service of each site configuration served, with the times of its files when built."""


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

        return simulated_site(Path(listing), partition)
    raise ConfigError(
        f"this SuperNode has no node config {SITE_CONFIG_KEY!r}; start it with "
        f"--node-config '{SITE_CONFIG_KEY}=\"/path/to/site.toml\"'"
    )


def service_for(context: Context) -> SiteService:
    """The site service of this node's site.toml, built once per version of it."""
    from fedstats.jobs.site_config import SiteConfig

    path = site_config_path(context)
    config = load_toml_model(path, SiteConfig, what="site configuration")
    frame = frame_path(config)
    times = (path.stat().st_mtime, frame.stat().st_mtime if frame.exists() else 0.0)
    built = _services.get(str(path))
    if built is not None and built[0] == times:
        return built[1]
    if built is not None:
        built[1].close()
    service = SiteService(config)
    _services[str(path)] = (times, service)
    return service


def close_services() -> None:
    """Close every site service this process built (their ledgers)."""
    for _times, service in _services.values():
        service.close()
    _services.clear()


@app.query(messages.IDENTIFY_ACTION)
def identify(message: Message, context: Context) -> Message:
    """Say which site this node serves."""
    return Message(messages.identity(service_for(context).config.name), reply_to=message)


@app.query(messages.TASK_ACTION)
def answer(message: Message, context: Context) -> Message:
    """Answer one fedstats request with the site's silo (journaled before the reply leaves)."""
    reply = service_for(context).answer(messages.unpack(message))
    return Message(messages.pack(reply), reply_to=message)
