"""A site answering requests from its own configuration, with every answer journaled.

:class:`SiteService` builds the site's :class:`~fedstats.site.silo.Silo` from
``site.toml`` alone (its frame, disclosure policy and ledger, and in a vertical
study its identifier table and its specification's ``[linkage]`` table:
:mod:`fedstats.jobs.site_linkage`) and wraps
:meth:`Silo.handle` with the site's journal (:mod:`fedstats.jobs.site_journal`):
a ``received`` line before the silo runs, an ``answered`` line after and
before the reply is returned, which records the ledger's chain heads
(:mod:`fedstats.jobs.ledger_heads`) so a later rewrite of the ledger shows:
a new service compares its ledger with the last heads the journal and run
records hold, and a scope that does not extend them is charged no more.
Any transport (Flower's ClientApp, a test) calls :meth:`SiteService.answer`
with the request bytes.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

import accounting
from fedstats.contract import codec
from fedstats.errors import CodecError, ResourceLimitError, StudyConfigurationError
from fedstats.jobs.ledger_heads import HEADS_FIELD, RUNS_DIR, check_ledger, head_records
from fedstats.jobs.path_audit import archive, archived_answer
from fedstats.jobs.site_config import SiteConfig, load_site_config
from fedstats.jobs.site_identity import check_site_identity
from fedstats.jobs.site_journal import JOURNAL_FILE, SiteJournal, digest, ledger_entry_count
from fedstats.jobs.site_linkage import site_linking
from fedstats.secagg.roster import load_roster_pin
from fedstats.site.protocol import load_protocol
from fedstats.site.resource_limits import RequestLimits
from fedstats.site.silo import Silo

_log = logging.getLogger(__name__)

CURRENT_FRAME = Path("current") / "frame.parquet"
"""Where ``fedstats site run`` keeps the last harmonised frame, under the site's workdir."""


def frame_path(config: SiteConfig) -> Path:
    """The analysis frame this site serves: the configured one, or the last harmonised one."""
    if config.data.frame is not None:
        return config.data.frame
    return config.workdir / CURRENT_FRAME


def read_frame(path: Path) -> pd.DataFrame:
    """Read an analysis frame (Parquet, keeping its fingerprint, or CSV)."""
    if not path.is_file():
        raise StudyConfigurationError(
            f"{path}: no analysis frame; harmonise the site's sources first (fedstats site run)"
        )
    if path.suffix == ".csv":
        return pd.read_csv(path)
    return pd.read_parquet(path)


GUARD_FILE = "differencing-guard.sqlite"
"""The differencing guard's record of answered row sets, in the site's working folder."""
LINKAGES_DIR = "linkages"
"""The linkages the site accepted (pair ids to its patient ids; they never leave the site),
in the site's working folder, so a linkage made in one run serves the next."""


class SiteService:
    """One site's silo, ledger and journal, built from its ``site.toml``."""

    def __init__(self, config: SiteConfig, *, noise_seed: int | None = None) -> None:
        self.config = config
        self.node_key_fingerprint = check_site_identity(config)
        self.frame_path = frame_path(config)
        frame = read_frame(self.frame_path)
        identifiers, linkage_table = site_linking(config, frame)
        self.ledger = accounting.Ledger(config.privacy.ledger)
        self.silo = Silo(
            config.name,
            frame,
            identifiers=identifiers,
            linkage=linkage_table,
            policy=config.disclosure.policy(),
            ledger=self.ledger,
            noise_seed=noise_seed,
            protocol=None
            if config.disclosure.protocol is None
            else load_protocol(
                config.disclosure.protocol, sha256=config.disclosure.protocol_sha256
            ),
            secure_aggregation=None
            if config.secure_aggregation is None
            else load_roster_pin(config.secure_aggregation, site=config.name),
            guard_path=config.workdir / GUARD_FILE,
            linkages_path=config.workdir / LINKAGES_DIR,
            verified_paths=config.disclosure.verified_paths,
        )
        self.journal = SiteJournal(config.workdir / JOURNAL_FILE)
        try:
            check_ledger(self.ledger, config.name, self.journal, config.workdir / RUNS_DIR)
        except accounting.LedgerIntegrityError as error:
            # where a batch run would not serve, the service refuses every charge to the
            # site's scopes: private requests are answered SiteLedgerIntegrityError
            _log.error("site %s: %s", config.name, error)
            for head in self.ledger.heads():
                if head.scope.owner == config.name:
                    self.ledger.refuse(head.scope, str(error))
        self.journal.roll_forward(self.ledger)

    @classmethod
    def from_file(cls, path: str | Path) -> SiteService:
        """The service of the site configured in ``path``."""
        return cls(load_site_config(path))

    def answer(self, request: bytes) -> bytes:
        """Journal the request, let the silo answer, journal the answer, return the reply bytes."""
        seq = self.journal.next_seq()
        task, analysis, args = _task_of(request, self.silo.limits)
        self.journal.append(
            {
                "event": "received",
                "seq": seq,
                "task": task,
                "request_sha256": digest(request),
                "request_bytes": len(request),
                "ledger_entries": ledger_entry_count(self.ledger),
            }
        )
        reply = self.silo.handle(request)
        entry = self.silo.log[-1]
        envelope = codec.decode(reply)
        _status, private, error_type = _reply_facts(envelope)
        heads = head_records(self.ledger)
        kept = {}
        if self.silo.verifies_paths and archived_answer(task, args, envelope):
            kept["path_archive"] = archive(self.config.workdir, seq, request, reply)
        self.journal.append(
            {
                "event": "answered",
                "seq": seq,
                "task": task,
                "analysis": analysis,
                "status": entry.status,
                "private": private,
                "error_type": error_type,
                "reason": entry.reason,
                "detail": entry.detail[:500],
                "reply_sha256": digest(reply),
                "reply_bytes": len(reply),
                "ledger_entries": sum(head["entries"] for head in heads),
                HEADS_FIELD: heads,
                **kept,
            }
        )
        return reply

    def close(self) -> None:
        """Close the site's ledger."""
        self.ledger.close()


def _task_of(request: bytes, limits: RequestLimits) -> tuple[str, str | None, dict | None]:
    """The request's task, for a private release the analysis it names, and its arguments
    (``"?"``, None, None when the bytes are not a request, or are more than the silo's
    limits let it decode)."""
    try:
        limits.check_request("?", "?", request)
        message = codec.decode(request)
    except (CodecError, ResourceLimitError):
        return "?", None, None
    if not isinstance(message, dict):
        return "?", None, None
    task = message.get("task")
    args = message.get("args")
    if not isinstance(args, dict):
        args = None
    dp = args.get("dp") if args is not None else None
    analysis = dp.get("analysis") if isinstance(dp, dict) else None
    return (
        task if isinstance(task, str) else "?",
        analysis if isinstance(analysis, str) else None,
        args,
    )


def _reply_facts(message: dict) -> tuple[str, bool, str]:
    """(status, is a private release, error type) of a decoded reply."""
    if message.get("status") == "ok":
        result = message.get("result") or {}
        return "ok", "dp_epsilon_spent" in result, ""
    error = message.get("error") or {}
    return "error", False, str(error.get("type", ""))
