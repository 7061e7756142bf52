"""The site's Flower ClientApp: every request reaches the site's own silo through its journal.

The SuperNode's node config names the site's configuration file
(``--node-config 'site-config="/etc/fedstats/site.toml"'``); the frame,
disclosure policy and ledger come from there, never from the coordinator.
``query.fedstats`` messages carry codec bytes to :meth:`SiteService.answer`;
``query.identify`` answers with the site's name so the coordinator can map
sites to nodes. The service is kept for as long as the process lives (one
message under Flower's default isolation, many in a long-lived worker) and
rebuilt when the site's configuration or frame changes.
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

app = ClientApp()
_services: dict[tuple[str, float, float], SiteService] = {}


def service_for(context: Context) -> SiteService:
    """The site service named by this node's ``site-config``, built once per version of it."""
    value = context.node_config.get(SITE_CONFIG_KEY)
    if not isinstance(value, str) or not value:
        raise ConfigError(
            f"this SuperNode has no node config {SITE_CONFIG_KEY!r}; start it with "
            f"--node-config '{SITE_CONFIG_KEY}=\"/path/to/site.toml\"'"
        )
    from fedstats.jobs.site_config import SiteConfig

    path = Path(value)
    config = load_toml_model(path, SiteConfig, what="site configuration")
    frame = frame_path(config)
    key = (str(path), path.stat().st_mtime, frame.stat().st_mtime if frame.exists() else 0.0)
    service = _services.get(key)
    if service is None:
        for old in _services.values():
            old.close()
        _services.clear()
        service = _services[key] = SiteService(config)
    return service


@app.query(messages.IDENTIFY_ACTION)
def identify(message: Message, context: Context) -> Message:
    """Say which site this node serves."""
    return Message(messages.identity(service_for(context).config.name), reply_to=message)


@app.query(messages.TASK_ACTION)
def answer(message: Message, context: Context) -> Message:
    """Answer one fedstats request with the site's silo (journaled before the reply leaves)."""
    reply = service_for(context).answer(messages.unpack(message))
    return Message(messages.pack(reply), reply_to=message)
