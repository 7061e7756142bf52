"""The coordinator's view of a federation: sites reached only through bytes.

A :class:`Federation` sends each request through the codec to a transport
(in-process sites: :mod:`fedstats.in_process`; Flower for multi-machine studies), records it in the
:class:`~studyfiles.inventory.MessageInventory`, decodes the reply, checks it
against the task's declared schema and turns error replies back into the
typed errors the site reported.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import numpy as np

import accounting
from fedstats.contract import codec
from fedstats.contract.paths import SignedReply
from fedstats.contract.refusals import REFUSALS, refusal_reason
from fedstats.contract.secure_aggregation import signed_payload
from fedstats.contract.task_spec import Catalogue, reply_schema
from fedstats.contract.tasks import TASKS
from fedstats.errors import (
    CodecError,
    ExtraNotInstalledError,
    FedstatsError,
    FingerprintMismatchError,
    InvalidReplyError,
    SiteError,
    SiteUnreachableError,
    StudyConfigurationError,
    from_wire,
)
from fedstats.schema import schema_mismatch
from harmonize.fingerprint import SiteFingerprint
from studyfiles.inventory import MessageInventory, MessageRecord

FINGERPRINT_TASK = "harmonize.fingerprint"
Transport = Callable[[bytes], bytes]
"""Carries one encoded request to a site and returns its encoded reply."""


def check_fingerprints(records: Mapping[str, Mapping | None]) -> None:
    """Refuse sites whose harmonised frames disagree, before any task runs.

    ``records`` maps sites to the fingerprint their harmonisation attached
    (``frame.attrs["fingerprint"]``) or ``None``. When any site has one,
    every site must, and all must equal the first site's; otherwise
    :class:`~fedstats.errors.FingerprintMismatchError` names the site and
    the differences (study specification, columns, kinds, levels, units).
    """
    present = {site: record for site, record in records.items() if record is not None}
    if not present:
        return
    missing = sorted(set(records) - set(present))
    if missing:
        raise FingerprintMismatchError(
            f"site(s) {missing} have no harmonisation fingerprint while "
            f"{sorted(present)} do; harmonise every site under the study specification"
        )
    reference_site, reference = next(iter(present.items()))
    expected = SiteFingerprint.from_record(reference)
    for site, record in present.items():
        differences = SiteFingerprint.from_record(record).differences(expected)
        if differences:
            raise FingerprintMismatchError(
                f"site {site!r} cannot be combined with {reference_site!r}: "
                + "; ".join(differences)
                + ". Harmonise both under the same study specification."
            )


class Federation:
    """A set of sites reached through transports, with a message inventory.

    Parameters
    ----------
    transports:
        Site name to transport. The order fixes the order of sites in results.
    study:
        The study's name, recorded in provenance.
    registry:
        The tasks whose schemas replies are checked against: the contract's
        (:data:`fedstats.contract.tasks.TASKS`) unless given; a site's task
        registry serves too (its tasks carry the contract's names and schemas).
    ledger:
        The coordinator's privacy ledger (client-level budgets, unit ``site``).
    noise_seed:
        Fixed seed for the coordinator's privacy noise (tests and
        reproducibility runs only; reported). Default: OS entropy.
    verify_fingerprints:
        Ask every site for its frame's fingerprint before the first other
        task and refuse sites that differ (see :meth:`verify_fingerprints`).
        Federations of remote sites should; :meth:`fedstats.Federation.in_process` checks the
        frames' fingerprints directly instead.
    """

    def __init__(
        self,
        transports: Mapping[str, Transport],
        *,
        study: str = "study",
        registry: Catalogue | None = None,
        ledger: accounting.Ledger | None = None,
        noise_seed: int | None = None,
        verify_fingerprints: bool = False,
    ) -> None:
        if len(transports) == 0:
            raise StudyConfigurationError("a federation needs at least one site")
        if registry is None:
            registry = TASKS
        self._transports = dict(transports)
        self._registry = registry
        self.study = study
        self.inventory = MessageInventory()
        self.site_protocols: dict[str, str | None] = {}
        """Each site's approved protocol (SHA-256), as its fingerprint reply declared it."""
        self._seq = itertools.count(1)
        self._analysis_ids = itertools.count(1)
        self._analyses: list[str] = []
        """Every analysis label handed out, in order (shared with subsets)."""
        self.silos: dict[str, Any] = {}
        """The sites this process runs, by name (:meth:`fedstats.Federation.in_process`)."""
        self.ledger = ledger
        self.noise_seed = noise_seed
        self._fingerprints_pending = verify_fingerprints
        self.path_sites: set[str] | None = None
        """The sites that answer exact iterative fits only on verified paths, as their
        fingerprints say (``None``: not asked yet; the coordinator then relays every path)."""
        self.signed_replies: dict[str, SignedReply] = {}
        """The signed replies of the last request on a verified path, by site (masked ones carry
        the session facts they were signed with)."""
        self.mask_seeds: dict[str, str] = {}
        """The self-mask seeds (hex) rebuilt when the last masked path round was unmasked."""
        """The last request's replies that their sites signed (a point of a verified path),
        by site: the next round relays them (:mod:`fedstats.contract.paths`)."""

    @property
    def registry(self) -> Catalogue:
        """The tasks the sites answer, with their reply schemas."""
        return self._registry

    @property
    def sites(self) -> tuple[str, ...]:
        return tuple(self._transports)

    def subset(self, sites: Sequence[str]) -> Federation:
        """These sites only, as a federation sharing this one's inventory, registry and ledger.

        For site-by-site analyses (e.g. heterogeneity): every message still
        goes through the same transports, checks and inventory.
        """
        unknown = [s for s in sites if s not in self._transports]
        if unknown or not sites:
            raise StudyConfigurationError(
                f"a subset needs sites of this federation {self.sites}, got {list(sites)}"
            )
        part = Federation(
            {s: self._transports[s] for s in sites},
            study=self.study,
            registry=self._registry,
            ledger=self.ledger,
            noise_seed=self.noise_seed,
        )
        part.inventory = self.inventory
        part.site_protocols = self.site_protocols
        part._seq, part._analysis_ids = self._seq, self._analysis_ids
        part._analyses = self._analyses
        part.silos = {s: self.silos[s] for s in sites if s in self.silos}
        part._fingerprints_pending = self._fingerprints_pending
        part.path_sites = None if self.path_sites is None else self.path_sites & set(sites)
        return part

    def __repr__(self) -> str:
        return f"Federation(study={self.study!r}, sites={list(self.sites)})"

    def noise_rng(self) -> np.random.Generator:
        """The coordinator's noise generator: OS entropy unless a fixed seed was asked for."""
        return np.random.default_rng(self.noise_seed)

    def new_analysis(self, kind: str) -> str:
        """A fresh label tying the messages of one fit together in the inventory."""
        label = f"{kind}-{next(self._analysis_ids)}"
        self._analyses.append(label)
        return label

    @contextmanager
    def analyses_started(self) -> Iterator[list[str]]:
        """The labels of every analysis started inside the block (this federation's or a
        subset's), filled in as the block ends.

        What a study records with a result (``StudyRecorder.record_release(...,
        analyses=...)``) so that its compliance report ties each analysis in the message
        inventory to the result it produced, e.g. a heterogeneity table to the one fit per
        site it is made of::

            with federation.analyses_started() as analyses:
                table = fedstats.heterogeneity(model, federation)
        """
        start = len(self._analyses)
        started: list[str] = []
        try:
            yield started
        finally:
            started.extend(self._analyses[start:])

    def request(
        self,
        task: str,
        args: Mapping[str, Any],
        *,
        analysis: str,
        sites: Sequence[str] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Send the same request to each site; return each site's checked reply.

        Raises the typed error a site reported (the first one, with the
        others attached as notes) after every site has been asked.
        """
        replies, failures = self.gather(task, args, analysis=analysis, sites=sites)
        if failures:
            errors = list(failures.values())
            first = errors[0]
            for other in errors[1:]:
                first.add_note(f"also: {other}")
            raise first
        return replies

    def gather(
        self,
        task: str,
        args: Mapping[str, Any],
        *,
        analysis: str,
        sites: Sequence[str] | None = None,
        site_args: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> tuple[dict[str, dict[str, Any]], dict[str, FedstatsError]]:
        """Ask each site; return the checked replies and, apart, each failed site's typed error.

        For protocols that go on without sites that dropped out (secure
        aggregation). A transport that raises (a site that cannot be reached)
        counts as :class:`~fedstats.errors.SiteUnreachableError`. ``site_args``: fields
        added to ``args`` for one site only (secure aggregation sends each site only what is
        addressed to it); each such site's request is encoded, sent and checked on its own.
        """
        if self._fingerprints_pending and task != FINGERPRINT_TASK:
            self.verify_fingerprints()
        targets = list(self.sites if sites is None else sites)
        unknown = [s for s in targets if s not in self._transports]
        if unknown:
            raise StudyConfigurationError(
                f"unknown site(s) {unknown}; the federation has {self.sites}"
            )
        try:
            task_def = self._registry.get(task)
        except ExtraNotInstalledError as missing:
            raise StudyConfigurationError(
                f"task {task!r} needs fedstats's {missing.extra!r} extra at the coordinator as "
                f"well as at the sites: pip install 'fedstats[{missing.extra}]'"
            ) from None
        if task_def is None:
            raise StudyConfigurationError(f"no task {task!r} is registered")
        requests = _requests(task, task_def, args, targets, site_args or {})
        for request_bytes, group in _grouped(targets, requests):
            self._dispatch(group, request_bytes)
        replies: dict[str, dict[str, Any]] = {}
        failures: dict[str, FedstatsError] = {}
        self.signed_replies, self.mask_seeds = {}, {}
        for site in targets:
            request_bytes, schema = requests[site]
            sent_at = datetime.now(UTC)
            start = time.perf_counter()
            reply_bytes, reason = b"", ""
            try:
                reply_bytes = self._transports[site](request_bytes)
                status, payload = self._read_reply(site, task, reply_bytes)
            except FedstatsError as error:
                status = "refused" if isinstance(error, REFUSALS) else "error"
                reason = refusal_reason(error) if isinstance(error, SiteError) else ""
                payload = None
                failures[site] = error
            except Exception as error:  # noqa: BLE001 - any transport failure: no reply came
                status, payload, reason = "unreachable", None, "unreachable"
                failures[site] = SiteUnreachableError(
                    f"site {site!r} could not be reached for task {task!r} "
                    f"({type(error).__name__}: {error})"
                )
            seconds = time.perf_counter() - start
            self.inventory.append(
                MessageRecord(
                    seq=next(self._seq),
                    task=task,
                    site=site,
                    request_bytes=len(request_bytes),
                    reply_bytes=len(reply_bytes),
                    sent_at=sent_at,
                    seconds=seconds,
                    status=status,
                    analysis=analysis,
                    reason=reason,
                    path=_path_kind(self.signed_replies.get(site)),
                )
            )
            if payload is None:
                continue
            problem = schema_mismatch(payload, schema)
            if problem:
                failures[site] = InvalidReplyError(f"site {site!r}, task {task!r}: {problem}")
                continue
            replies[site] = payload
        return replies, failures

    def _dispatch(self, sites: list[str], request_bytes: bytes) -> None:
        """Called once per request before any transport is used; transports that can send
        to every site at once (a round in parallel) start here. In process: nothing to do."""

    def verify_fingerprints(self) -> None:
        """Ask every site for its frame's fingerprint; refuse sites that differ.

        Raises :class:`~fedstats.errors.FingerprintMismatchError` naming the
        site and the differences (see :func:`check_fingerprints`), or
        :class:`~fedstats.errors.InvalidReplyError` for a reply that is not a
        fingerprint. The exchange is recorded in the message inventory.
        """
        replies = self.request(FINGERPRINT_TASK, {}, analysis="fingerprints")
        records: dict[str, Mapping | None] = {}
        for site, reply in replies.items():
            text = reply["fingerprint"]
            try:
                records[site] = json.loads(text) if text else None
                if records[site] is not None:
                    SiteFingerprint.from_record(records[site])
            except (ValueError, TypeError, KeyError) as error:
                raise InvalidReplyError(
                    f"site {site!r}, task {FINGERPRINT_TASK!r}: not a fingerprint ({error})"
                ) from None
        check_fingerprints(records)
        self.site_protocols.update(
            {site: reply["protocol_sha256"] or None for site, reply in replies.items()}
        )
        self.path_sites = {site for site, reply in replies.items() if reply["paths"]}
        self._fingerprints_pending = False

    def _read_reply(self, site: str, task: str, reply_bytes: bytes) -> tuple[str, dict | None]:
        try:
            message = codec.decode(reply_bytes)
        except CodecError as error:
            raise InvalidReplyError(f"site {site!r}, task {task!r}: {error}") from None
        if not isinstance(message, dict) or message.get("status") not in ("ok", "error"):
            raise InvalidReplyError(f"site {site!r}, task {task!r}: reply has no valid status")
        if message["status"] == "error":
            error = message.get("error")
            site_error: SiteError = from_wire(error if isinstance(error, dict) else {}, site)
            raise site_error
        result = message.get("result")
        if not isinstance(result, dict):
            raise InvalidReplyError(f"site {site!r}, task {task!r}: reply has no result mapping")
        if isinstance(message.get("signature"), str):
            verified = message.get("verified") is True
            signed = signed_payload(result, message.get("mask"))
            self.signed_replies[site] = SignedReply(signed, message["signature"], verified)
        return "ok", result


def _requests(
    task: str,
    task_def: Any,
    args: Mapping[str, Any],
    targets: list[str],
    site_args: Mapping[str, Mapping[str, Any]],
) -> dict[str, tuple[bytes, Any]]:
    """Each site's request bytes and reply schema; the sites asked the same share one
    encoding (and so one dispatch)."""
    common: tuple[bytes, Any] | None = None
    out = {}
    for site in targets:
        if site in site_args:
            asked = {**args, **site_args[site]}
            out[site] = (codec.encode({"task": task, "args": asked}), reply_schema(task_def, asked))
            continue
        if common is None:
            asked = dict(args)
            common = (codec.encode({"task": task, "args": asked}), reply_schema(task_def, asked))
        out[site] = common
    return out


def _grouped(
    targets: list[str], requests: Mapping[str, tuple[bytes, Any]]
) -> list[tuple[bytes, list[str]]]:
    """The sites asked the same bytes, together, in the order they are first asked."""
    groups: dict[int, tuple[bytes, list[str]]] = {}
    for site in targets:
        request_bytes = requests[site][0]
        groups.setdefault(id(request_bytes), (request_bytes, []))[1].append(site)
    return list(groups.values())


def _path_kind(signed: SignedReply | None) -> str:
    """How a reply stands on its fit's path, for the message inventory."""
    if signed is None:
        return ""
    return "verified" if signed.verified else "signed"
