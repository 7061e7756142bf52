"""``fedstats site verify``: re-derive, from a site's own records, every exact answer it gave on
a verified path.

A site that verifies paths (:mod:`fedstats.site.verified_paths`) keeps, beside its
journal, the bytes of every request it answered on a verified path and of every
evaluation of a fitted model it answered (``WORKDIR/paths/<seq>.request`` and
``.reply``; :func:`archive`). :func:`audit_site` replays them in order, offline,
with the site's pinned roster and nothing else: each archived request must be the
one the journal recorded (SHA-256), its path must verify again (every relayed
signature against the roster, every point re-derived with the contract's path
code), and the archived reply must carry the site's own signature over that
point. It reports each fit's path (task, request digest, rounds, last point's
digest) so a privacy officer can compare the released coefficients with the end
of a path the site itself verified, and lists every problem found.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pandas as pd

from fedstats.contract import codec
from fedstats.contract.paths import point_digest
from fedstats.contract.secure_aggregation import signed_payload
from fedstats.errors import CodecError, DisclosureError, StudyConfigurationError
from fedstats.jobs.site_config import SiteConfig
from fedstats.jobs.site_journal import JOURNAL_FILE, SiteJournal, digest
from fedstats.secagg.roster import load_roster_pin
from fedstats.site.registry import REGISTRY
from fedstats.site.task import SiteContext, plain_schema
from fedstats.site.verified_paths import audited, remember, verified_point

ARCHIVE_DIR = "paths"
"""Where, under the site's workdir, the answers on verified paths are kept."""


def archive(workdir: Path, seq: int, request: bytes, reply: bytes) -> str:
    """Keep one answered request and its reply; returns the name the journal records."""
    folder = workdir / ARCHIVE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{seq:08d}"
    (folder / f"{name}.request").write_bytes(request)
    (folder / f"{name}.reply").write_bytes(reply)
    return name


def archived_answer(task: str, args: dict[str, Any] | None, envelope: dict[str, Any]) -> bool:
    """Whether an answer (the decoded request arguments and reply) is one :func:`audit_site`
    re-derives: an answer on a verified path, exact or a DP-SGD round (its reply is signed and
    says it verified), or an evaluation of a fitted model."""
    if envelope.get("status") != "ok" or args is None:
        return False
    return envelope.get("verified") is True or audited(task, args)


@dataclass
class FitPath:
    """One fit's path as the site answered it."""

    task: str
    request: str
    """The digest of the fit's request arguments but its point (what every reply is bound to)."""
    sites: tuple[str, ...]
    answers: int = 0
    rounds: int = 0
    last_point: str = ""
    """SHA-256 of the last answered point's float64 bytes."""


@dataclass
class PathAudit:
    """What :func:`audit_site` re-derived."""

    site: str
    fits: list[FitPath] = field(default_factory=list)
    evaluations: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return sum(f.answers for f in self.fits)

    @property
    def ok(self) -> bool:
        return not self.problems


def audit_site(config: SiteConfig) -> PathAudit:
    """Replay every archived answer of the site in ``config`` (see the module docstring)."""
    if config.secure_aggregation is None:
        raise StudyConfigurationError(
            f"site {config.name!r}: no [secure_aggregation] roster and signing key, so no "
            "answer was signed on a verified path; nothing to verify"
        )
    pin = load_roster_pin(config.secure_aggregation, site=config.name)
    context = SiteContext(
        name=config.name,
        frame=pd.DataFrame(),
        policy=config.disclosure.policy(),
        secure_aggregation=pin,
        verified_paths=True,
        reply_schema=partial(plain_schema, REGISTRY),
    )
    journal = SiteJournal(config.workdir / JOURNAL_FILE)
    records = journal.records()
    received = {r["seq"]: r for r in records if r.get("event") == "received"}
    audit = PathAudit(site=config.name)
    fits: dict[tuple[str, str], FitPath] = {}
    for record in records:
        name = record.get("path_archive")
        if record.get("event") != "answered" or not isinstance(name, str):
            continue
        problem = _replay(config.workdir, record, received.get(record["seq"]), name, context,
                          fits, audit)  # fmt: skip
        if problem:
            audit.problems.append(f"request {record['seq']} ({record.get('task')}): {problem}")
    return audit


def _replay(
    workdir: Path,
    record: dict[str, Any],
    received: dict[str, Any] | None,
    name: str,
    context: SiteContext,
    fits: dict[tuple[str, str], FitPath],
    audit: PathAudit,
) -> str | None:
    folder = workdir / ARCHIVE_DIR
    try:
        request = (folder / f"{name}.request").read_bytes()
        reply = (folder / f"{name}.reply").read_bytes()
    except OSError as error:
        return f"its archived bytes cannot be read ({error.strerror})"
    if received is None or digest(request) != received.get("request_sha256"):
        return "the archived request is not the one the journal recorded"
    if digest(reply) != record.get("reply_sha256"):
        return "the archived reply is not the one the journal recorded"
    try:
        message, envelope = codec.decode(request), codec.decode(reply)
    except CodecError as error:
        return f"the archived bytes do not decode ({error})"
    task, args = message.get("task"), message.get("args")
    if not (isinstance(task, str) and isinstance(args, dict)):
        return "the archived request is not a request"
    try:
        point = verified_point(context, task, args, secure=False)
    except DisclosureError as error:
        return f"its path does not verify again: {error.reason}"
    if point is None:
        audit.evaluations += 1
        return None
    result = envelope.get("result")
    signed = point.statement(
        signed_payload(result if isinstance(result, dict) else {}, envelope.get("mask")),
        verified=True,
    )
    if not context.secure_aggregation.verify_advert(
        context.name, signed, str(envelope.get("signature", ""))
    ):
        return "the archived reply does not carry this site's signature over that point"
    remember(context, args, point)
    key = (point.task, point.request)
    if key not in fits or point.round == 1:  # round 1: a fit (or a retry of it) begins
        fits[key] = FitPath(point.task, point.request, point.sites)
        audit.fits.append(fits[key])
    fit = fits[key]
    fit.answers += 1
    fit.rounds = max(fit.rounds, point.round)
    fit.last_point = point_digest(point.beta)
    return None
