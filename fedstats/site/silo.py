"""The silo: the only code that touches a site's rows.

A :class:`Silo` receives a request as bytes, routes it by task name to a
handler registered in :mod:`fedstats.site.registry`, checks the reply with the site's
:class:`~fedstats.site.disclosure.DisclosurePolicy` and returns bytes. Every reply
leaves through :meth:`Silo.handle`, so the check happens in this one place.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

import accounting
from fedstats.contract import codec
from fedstats.contract.dp_request import DpRequest
from fedstats.contract.refusals import REFUSALS, refusal_reason
from fedstats.contract.secure_aggregation import MaskBlock, signed_payload
from fedstats.contract.task_spec import reply_schema
from fedstats.contract.tasks.design import PREPARE
from fedstats.errors import (
    BudgetExceededError,
    CodecError,
    DisclosureError,
    InternalSiteError,
    MalformedRequestError,
    NoBudgetError,
    SiteError,
    SiteLedgerIntegrityError,
    StudyConfigurationError,
    UnknownTaskError,
    to_wire,
)
from fedstats.schema import ReplySchema
from fedstats.secagg.roster import RosterPin
from fedstats.site import released_counts
from fedstats.site.ciphertext_replies import PaillierKeys
from fedstats.site.differencing import DifferencingGuard
from fedstats.site.disclosure import DisclosurePolicy, check_reply
from fedstats.site.error_replies import checked_error
from fedstats.site.frame_layout import held_frame
from fedstats.site.identifiers import site_identifiers
from fedstats.site.linked_rows import LinkageStore, LinkedRows
from fedstats.site.private_release import (
    add_noise,
    draw_noise,
    noisy_groups,
    release_event,
    training_event,
)
from fedstats.site.private_rows import check_private_request
from fedstats.site.protocol import Protocol
from fedstats.site.resource_limits import RequestLimits
from fedstats.site.secure_aggregation import (
    SiteSession,
    mask_facts,
    mask_reply,
    noise_multipliers,
    open_shares,
)
from fedstats.site.task import SiteContext, Task, TaskRegistry, TaskReply, plain_schema
from fedstats.site.verified_paths import (
    check_masked_round,
    remember,
    signature,
    verified_point,
)
from linkage import LinkageSchema
from studyfiles.names import name_problem

if TYPE_CHECKING:
    import dp_accounting

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SiteLogEntry:
    """The site's own record of one request it answered or refused."""

    task: str
    status: str  # "released", "refused" or "error"
    reply_bytes: int
    at: datetime
    detail: str = ""
    reason: str = ""
    """Why a request was refused or failed (a disclosure rule, "protocol", "resources",
    "formula", or the error's type); empty for released replies."""


class Silo:
    """One site's analysis frame behind the silo boundary.

    Parameters
    ----------
    name:
        The site's name, as the study knows it.
    frame:
        The harmonised analysis frame, one row per patient. The site holds its own copy,
        each numeric column contiguous and read-only (:mod:`fedstats.site.frame_layout`):
        changing ``frame`` afterwards changes nothing the site answers about.
    policy:
        The site's disclosure control (defaults: threshold of 10 patients).
    registry:
        The tasks this silo answers; defaults to :data:`fedstats.site.registry.REGISTRY`.
    ledger:
        The site's own privacy ledger. Private releases are charged to it
        (scope: unit ``patient``, owner this site, the request's study) before
        any row is read; the site's privacy officer sets the budgets in it.
    noise_seed:
        A fixed seed for the privacy noise, for tests and reproducibility runs
        only; every private reply then declares it. By default the noise
        generator is seeded from OS entropy for every release.
    protocol:
        The protocol the site's privacy officer approved
        (:class:`fedstats.site.protocol.Protocol`): exact requests outside it are
        refused with :class:`~fedstats.errors.ProtocolError`.
    secure_aggregation:
        The secure-aggregation roster and signing key the site pinned
        (:class:`fedstats.secagg.roster.RosterPin`); sessions whose roster or
        keys differ are refused. Without one, a site charges its ledger for
        the noise it adds itself, not for the noise of the sum.
    verified_paths:
        Answer an exact request of an iterative fit only at the point the site re-derives
        from the previous round's signed replies (:mod:`fedstats.site.verified_paths`);
        needs ``secure_aggregation`` (the roster whose keys sign the replies).
    trusts_client_level:
        With ``verified_paths``, still answer a client-level private fit's exact requests
        (rows clipped, no noise of the site's own), whose coefficients carry the
        coordinator's noise and cannot be re-derived: the site trusts the coordinator with
        them, as client-level differential privacy does. Off by default.
    limits:
        Resource limits per request (:class:`fedstats.site.resource_limits.RequestLimits`).
    guard_path:
        Where the differencing guard keeps the row sets this site answered
        (kept in memory when ``None``).
    linkages_path:
        A folder where the site keeps the linkages it accepted (a deployed site's
        ``workdir/linkages``; :mod:`fedstats.site.linked_rows`), so they serve later runs;
        ``None`` keeps them in memory only.
    identifiers:
        The identifier table of the frame's patients (``harmonize``'s
        ``Harmonized.identifiers``: same index, normalised columns), for record linkage;
        it never leaves the site, only its keyed encodings do
        (:mod:`fedstats.site.handlers.record_linkage`). Without it the site refuses the
        linkage tasks.
    linkage:
        The ``[linkage]`` table of the site's own study specification
        (``StudySpec.linkage``) or its :class:`linkage.LinkageSchema`: the one schema the
        site encodes under (needed with ``identifiers``).
    """

    def __init__(
        self,
        name: str,
        frame: pd.DataFrame,
        *,
        policy: DisclosurePolicy | None = None,
        registry: TaskRegistry | None = None,
        ledger: accounting.Ledger | None = None,
        noise_seed: int | None = None,
        protocol: Protocol | None = None,
        secure_aggregation: RosterPin | None = None,
        limits: RequestLimits | None = None,
        guard_path: Path | None = None,
        linkages_path: Path | None = None,
        verified_paths: bool = False,
        trusts_client_level: bool = False,
        identifiers: pd.DataFrame | None = None,
        linkage: LinkageSchema | Mapping[str, Any] | None = None,
    ) -> None:
        problem = name_problem(name)
        if problem is not None:
            raise StudyConfigurationError(
                f"site name: {problem} (it names the site's ledger scope, records and folders)"
            )
        if not isinstance(frame, pd.DataFrame):
            raise StudyConfigurationError(
                f"site {name!r}: the analysis frame must be a pandas DataFrame, "
                f"got {type(frame).__name__}"
            )
        frame = held_frame(frame)
        if verified_paths and secure_aggregation is None:
            raise StudyConfigurationError(
                f"site {name!r}: verified paths need the pinned roster and signing key "
                "(secure_aggregation): the replies a site checks are signed with them"
            )
        if registry is None:
            from fedstats.site.registry import REGISTRY

            registry = REGISTRY
        linking = site_identifiers(name, frame, identifiers, linkage)
        self.name = name
        self.policy = policy or DisclosurePolicy()
        self._registry = registry
        self.protocol = protocol
        self.limits = limits or RequestLimits()
        self._context = SiteContext(
            name=name,
            frame=frame,
            policy=self.policy,
            ledger=ledger,
            protocol=protocol,
            secure_aggregation=secure_aggregation,
            guard=DifferencingGuard(self.policy, frame, path=guard_path),
            verified_paths=verified_paths,
            trusts_client_level=trusts_client_level,
            reply_schema=partial(plain_schema, registry),
            linkages=LinkageStore(name, frame, self.policy, folder=linkages_path),
            paillier_keys=PaillierKeys(),
            identifiers=linking,
        )
        self.ledger = ledger
        self._seeded_rng = None if noise_seed is None else np.random.default_rng(noise_seed)
        self.log: list[SiteLogEntry] = []

    def __repr__(self) -> str:
        return f"Silo({self.name!r}, {len(self._context.frame)} patients, {self.policy})"

    @property
    def pin(self) -> RosterPin | None:
        """The site's pinned roster and signing key (``None`` when not pinned)."""
        return self._context.secure_aggregation

    @property
    def verifies_paths(self) -> bool:
        """Whether this site answers exact iterative fits only on verified paths."""
        return self._context.verified_paths

    def accept_linkage(self, rows: LinkedRows) -> None:
        """Accept a linkage of this site's patients (:mod:`fedstats.site.linked_rows`): vertical
        tasks then answer about its linked pairs. A site-local step, taken by the site (or
        by the wire task that receives the linkage unit's mapping); refusals raise
        :class:`~fedstats.errors.DisclosureError` or
        :class:`~fedstats.errors.MalformedRequestError` naming the site."""
        self._context.linkages.accept(rows)

    def linked_rows(self, linkage_id: str) -> LinkedRows:
        """The linkage this site accepted under ``linkage_id``: its pair ids and the frame's
        patients linked under them. A site-local look (nothing is sent); raises
        :class:`~fedstats.errors.MalformedRequestError` for a linkage the site never accepted."""
        return self._context.linkages.rows(linkage_id)[0]

    def handle(self, request: bytes) -> bytes:
        """Answer one request; the reply is always bytes, an error reply included.

        In order, before any row is read: the request's size and its header's
        (before decoding), the design columns its agreed levels imply (before any
        design is built), its arguments (the task's schema, which for a network
        counts the parameters its hyperparameters make without building it), the
        site's other resource limits, its approved
        protocol, whether it requires privacy or secure aggregation, and the
        rounds of the analysis; for a private request, everything that decides
        whether it is answered (:mod:`fedstats.site.private_rows`) and the
        charge to the site's ledger. Then the handler computes the reply (for
        an exact request, data checks and small-cell rules refuse here; a
        private one leaves unusable rows out instead), and a private release
        is noised before it leaves. Every reply and every error reply is checked before it
        leaves (:func:`~fedstats.site.disclosure.check_reply`,
        :func:`~fedstats.site.error_replies.checked_error`).
        """
        task_name = "?"
        context = self._context
        try:
            self.limits.check_request(self.name, task_name, request)
            task_name, args = self._parse(request)
            task = self._registry.get(task_name)
            if task is None:
                raise UnknownTaskError(site=self.name, task=task_name)
            self.limits.check_design(self.name, task_name, args)
            plain = task.schema(args)
            schema = reply_schema(task, args, plain)
            dp = DpRequest.from_args(args)
            secure = MaskBlock.from_args(args)
            self._admit(task, task_name, args, private=dp is not None, secure=secure is not None)
            point = verified_point(context, task_name, args, secure=secure is not None)
            context.path_round = (
                point.round if point is not None and context.verified_paths else None
            )
            context.deadline = self.limits.deadline()
            context.exact = dp is None
            session = None if secure is None else open_shares(context, secure, task_name)
            if point is not None and session is not None:
                check_masked_round(context, task_name, point, session)
            if dp is None:
                reply, noise, facts = task.handler(context, args), None, {}
            elif task.private_training is not None:
                reply, noise, facts = self._trained(task, task_name, args, dp)
            else:
                reply, noise, facts = self._released(task, task_name, args, dp, session, plain)
            payload = self._outgoing(
                task_name, reply, noise, session, plain, private=dp is not None
            )
            payload.update(facts)
            check_reply(
                self.policy,
                site=self.name,
                task=task_name,
                schema=schema,
                payload=payload,
                contributors=None if dp is not None else reply.contributors,
                paillier_keys=context.paillier_keys,
                identifiers=context.identifiers,
            )
            if task_name == PREPARE.name and dp is not None and session is None:
                released_counts.remember(context, dp, payload)  # a private training's weight
            envelope = {"status": "ok", "result": payload}
            if point is not None:  # the next round's sites check this reply by its signature
                if session is not None:  # masked: signed with its session and seed commitment
                    envelope["mask"] = mask_facts(session)
                signed = signed_payload(payload, envelope.get("mask"))
                envelope["signature"] = signature(context, point, signed)
                envelope["verified"] = context.verified_paths
                remember(context, args, point)
            out = codec.encode(envelope)
        except SiteError as error:
            error = checked_error(error.located(self.name, task_name), self.policy)
            status = "refused" if isinstance(error, REFUSALS) else "error"
            return self._record(
                task_name,
                status,
                {"status": "error", "error": to_wire(error)},
                detail=str(error),
                reason=refusal_reason(error),
            )
        except Exception as error:
            log.exception("site %s: task %s failed", self.name, task_name)
            wire = to_wire(
                InternalSiteError(site=self.name, task=task_name, error_type=type(error).__name__)
            )
            return self._record(
                task_name,
                "error",
                {"status": "error", "error": wire},
                detail=repr(error),
                reason="InternalSiteError",
            )
        finally:
            context.deadline, context.exact = None, True
        self.log.append(SiteLogEntry(task_name, "released", len(out), _now()))
        return out

    def _trained(
        self, task: Task, task_name: str, args: dict[str, Any], dp: DpRequest
    ) -> tuple[TaskReply, None, dict[str, Any]]:
        """A task whose handler runs the mechanism itself (DP-SGD): every data check, then the
        charge of the declared event, then the handler; its output is the release."""
        if task.validate is not None:
            task.validate(self._context, args)
        event = training_event(task, args, self.name)
        entry, budget = self._charge(task_name, dp, event, {})
        reply = task.handler(self._context, {**args, "noise_seed": self._training_seed()})
        return reply, None, self._private_facts(entry, budget)

    def _released(
        self,
        task: Task,
        task_name: str,
        args: dict[str, Any],
        dp: DpRequest,
        session: SiteSession | None,
        plain: ReplySchema,
    ) -> tuple[TaskReply, dict[str, Any], dict[str, Any]]:
        """A Gaussian release: the ledger charged, then the reply computed, and only then the
        noise drawn (this site's share of it under secure aggregation).

        The charge comes before any row is read: a private request is answered or refused on
        the request alone (:mod:`fedstats.site.private_rows`), so over budget is refused with
        no row touched, and nothing the rows hold can turn a charged request into a refusal.
        """
        if task.validate is not None:
            task.validate(self._context, args)
        groups = noisy_groups(task, args, self.name)
        sigmas = dp.sigmas_for(groups, self.name, task_name)
        site_sigmas = (
            sigmas if session is None else noise_multipliers(session, groups, sigmas, plain)
        )
        distributed = (
            {}
            if session is None
            else {
                "secure_aggregation_threshold": session.threshold,
                "secure_aggregation_roster": "pinned" if session.pinned else "unpinned",
                **{
                    f"site_noise_multiplier[{g.fields[0]}]": v
                    for g, v in zip(groups, site_sigmas, strict=True)
                },
            }
        )
        event = release_event(charged_sigmas(sigmas, session))
        entry, budget = self._charge(task_name, dp, event, distributed)
        reply = task.handler(self._context, args)
        noise = draw_noise(
            reply.payload, groups, site_sigmas, self._noise_rng(), site=self.name, task=task_name
        )
        return reply, noise, self._private_facts(entry, budget)

    def _outgoing(
        self,
        task_name: str,
        reply: TaskReply,
        noise: dict[str, Any] | None,
        session: SiteSession | None,
        plain: ReplySchema,
        *,
        private: bool,
    ) -> dict[str, Any]:
        """The payload as it leaves: noised, or (inside secure aggregation) checked plain for
        shape and (exact replies) threshold, then masked."""
        if session is None:
            return reply.payload if noise is None else add_noise(reply.payload, noise)
        check_reply(
            self.policy,
            site=self.name,
            task=task_name,
            schema=plain,
            payload=reply.payload,
            contributors=None if private else reply.contributors,
        )
        return mask_reply(session, reply.payload, noise, plain, task_name)

    def _admit(
        self, task: Task, task_name: str, args: dict[str, Any], *, private: bool, secure: bool
    ) -> None:
        """Every check that needs no row: limits, protocol, required privacy, rounds."""
        self.limits.check_arguments(self.name, task_name, args)
        if task.cost is not None:
            self.limits.check_work(self.name, task_name, task.cost(self._context, args))
        if not task.about_patients:
            return
        approved = (
            None
            if self.protocol is None
            else self.protocol.admit(self.name, task_name, args, private=private)
        )
        if private:  # answered or refused on the request alone (fedstats.site.private_rows)
            check_private_request(self.name, task_name, args, self._context.frame.columns)
        if not private and self.policy.require_privacy:
            raise DisclosureError(
                site=self.name,
                task=task_name,
                reason="this site answers it only as a differentially private release",
                rule="privacy-required",
            )
        pin = self._context.secure_aggregation
        if pin is not None and getattr(pin, "require", False) and not secure:
            raise DisclosureError(
                site=self.name,
                task=task_name,
                reason="this site answers it only inside secure aggregation with its pinned roster",
                rule="secure-aggregation",
            )
        if not private:
            self._context.guard.count_round(self.name, task_name, analysis_key(task_name, args))
            if approved is not None and approved.max_rounds is not None:
                self._context.guard.count_round(
                    self.name, task_name, f"protocol:{approved.name}", limit=approved.max_rounds
                )

    def _private_facts(self, entry: accounting.Entry, budget: float) -> dict[str, Any]:
        """:data:`~fedstats.contract.dp_request.DP_REPLY_FIELDS` after the charge ``entry``."""
        return {
            "dp_epsilon_spent": entry.epsilon_after,
            "dp_budget_epsilon": budget,
            "dp_fixed_seed": self._seeded_rng is not None,
            "dp_ledger_entries": entry.seq,
            "dp_ledger_head": entry.entry_hash,
        }

    def _charge(
        self,
        task: str,
        dp: DpRequest,
        event: dp_accounting.DpEvent,
        distributed: dict[str, float],
    ) -> tuple[accounting.Entry, float]:
        """Charge the site's ledger for a release; returns (the entry committed, budget).

        ``event`` describes the release the coordinator can see; under secure
        aggregation this site adds only its share of the noise, which the
        entry records beside it (``distributed``: the threshold and this
        site's multiplier per group).
        """
        if self.ledger is None:
            raise NoBudgetError(
                site=self.name, task=task, study=dp.study, reason="the site keeps no privacy ledger"
            )
        scope = accounting.Scope(unit="patient", owner=self.name, study=dp.study)
        try:
            entry = self.ledger.charge(
                scope,
                event,
                note=dp.note,
                analysis=dp.analysis,
                task=task,
                parameters={
                    **{f"noise_multiplier[{k}]": v for k, v in dp.noise_multipliers.items()},
                    **distributed,
                },
            )
        except accounting.UnknownScope:
            raise NoBudgetError(
                site=self.name,
                task=task,
                study=dp.study,
                reason="no privacy budget is set for this study",
            ) from None
        except accounting.BudgetExceeded as exceeded:
            raise BudgetExceededError(
                site=self.name,
                task=task,
                study=dp.study,
                spent=exceeded.spent,
                requested=exceeded.requested,
                remaining=exceeded.remaining,
                budget=exceeded.budget_epsilon,
            ) from None
        except accounting.UnsupportedMechanism as unsupported:
            raise DisclosureError(site=self.name, task=task, reason=str(unsupported)) from None
        except accounting.LedgerIntegrityError as broken:
            log.error("site %s: %s", self.name, broken)
            raise SiteLedgerIntegrityError(site=self.name, task=task, study=dp.study) from None
        return entry, self.ledger.budget(scope).epsilon

    def _training_seed(self) -> int | None:
        """The seed a training mechanism must use: ``None`` (OS entropy) unless fixed for tests."""
        if self._seeded_rng is None:
            return None
        return int(self._seeded_rng.integers(2**63 - 1))

    def _noise_rng(self) -> np.random.Generator:
        """A fresh OS-entropy generator per release, unless a fixed seed was asked for."""
        return self._seeded_rng if self._seeded_rng is not None else np.random.default_rng()

    def _parse(self, request: bytes) -> tuple[str, dict[str, Any]]:
        try:
            message = codec.decode(request)
        except CodecError as error:
            raise MalformedRequestError(site=self.name, task="?", reason=str(error)) from None
        if not (isinstance(message, dict) and set(message) == {"task", "args"}):
            raise MalformedRequestError(
                site=self.name, task="?", reason="a request holds exactly 'task' and 'args'"
            )
        task, args = message["task"], message["args"]
        if not isinstance(task, str) or not isinstance(args, dict):
            raise MalformedRequestError(
                site=self.name,
                task=str(task)[:80],
                reason="'task' must be a string, 'args' a mapping",
            )
        return task, args

    def _record(self, task: str, status: str, message: dict, detail: str, reason: str) -> bytes:
        out = codec.encode(message)
        self.log.append(SiteLogEntry(task, status, len(out), _now(), detail, reason))
        return out


def charged_sigmas(sigmas: list[float], session: SiteSession | None) -> list[float]:
    """The noise multipliers a release is charged for.

    Alone, or inside secure aggregation with a pinned roster, the site is
    charged for the release the coordinator can see: the sum's noise,
    ``sigma`` per group. Inside a session the site could not check (no pinned
    roster), the coordinator may be able to unmask this site's reply alone, so
    the site is charged for the noise it adds itself, ``sigma / sqrt(t)`` of the
    (rounding-inflated) sensitivity (:func:`fedstats.site.secure_aggregation.noise_multipliers`).
    """
    if session is None or session.pinned:
        return sigmas
    return [s / math.sqrt(session.threshold) for s in sigmas]


def analysis_key(task: str, args: dict[str, Any]) -> str:
    """What the site counts as one analysis: the agreed design, or the survival outcome.

    Derived from the request's content, never from a label the coordinator
    chooses, so renaming an analysis does not reset its rounds.
    """
    if isinstance(args.get("design"), dict):
        what: Any = args["design"]
    else:
        what = [task, *(args.get(k) for k in ("time", "event", "group", "variables"))]
    canonical = json.dumps(what, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _now() -> datetime:
    return datetime.now(UTC)
