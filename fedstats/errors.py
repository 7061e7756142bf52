"""Domain errors and warnings of :mod:`fedstats`.

Every error names where it happened (site, task, column) and what to do.
Errors raised inside a :class:`~fedstats.site.silo.Silo` cross the silo boundary as
a small, typed error reply (see :func:`to_wire` / :func:`from_wire`): only the
error's type and its declared fields travel, never a traceback, which could
quote row-level data.
"""

from __future__ import annotations

from typing import Any, ClassVar


class FedstatsError(Exception):
    """Base class of every error this package raises on purpose."""


class FedstatsWarning(UserWarning):
    """Base class of every warning this package emits."""


class CodecError(FedstatsError):
    """A message could not be encoded or decoded by the codec."""


class InvalidReplyError(FedstatsError):
    """A site's reply could not be decoded or does not match the task's declared shape."""


class SiteUnreachableError(FedstatsError):
    """A site's transport failed: no reply came back (network, process or timeout)."""


class SecureAggregationAborted(FedstatsError):
    """Fewer sites than the threshold completed a secure-aggregation round; nothing was unmasked."""


class FormulaError(FedstatsError):
    """A model formula or design option cannot be used for a federated fit."""


class StudyConfigurationError(FedstatsError):
    """The federation or study options are inconsistent."""


class FingerprintMismatchError(StudyConfigurationError):
    """Sites' harmonised frames disagree (specification, columns, levels or units)."""


class PlannedBudgetError(StudyConfigurationError):
    """A planned private fit would exceed a privacy budget; nothing was charged or released."""


class ConvergenceWarning(FedstatsWarning):
    """An iterative fit stopped before meeting its convergence criterion."""


class SeparationWarning(FedstatsWarning):
    """Quasi-complete separation: some coefficients are not identified."""


class PrivacyUtilityWarning(FedstatsWarning):
    """A private result that the privacy noise, a noisy count or a survival horizon makes
    misleading: read its intervals, not its point estimates, or do not use it."""


class SurvivalHorizonWarning(FedstatsWarning):
    """A pooled survival curve is not released from some grid time on: some sites' counts
    stop earlier, at their safe horizon (the disclosure rule), so a sum there is not the
    pooled count. The warning names the sites and their horizons."""


class SiteError(FedstatsError):
    """An error that a site reports about its own data or a task it refused.

    Subclasses declare the fields they carry in ``fields``; the message is built
    from those fields by :meth:`describe`, so a site's reply carries only typed
    values and the coordinator reconstructs the same message.
    """

    fields: ClassVar[tuple[str, ...]] = ("site", "task")

    def __init__(self, **values: Any) -> None:
        unknown = set(values) - set(self.fields)
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field(s) {sorted(unknown)}")
        for name in self.fields:
            setattr(self, name, values.get(name))
        super().__init__(self.describe())

    def describe(self) -> str:
        return f"site {self.site!r}: task {self.task!r} failed"

    def values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.fields}

    def located(self, site: str, task: str) -> SiteError:
        """The same error, naming this site, and this task when it named none."""
        values = self.values()
        values["site"] = site
        if "task" in self.fields and values.get("task") is None:
            values["task"] = task
        return type(self)(**values)


class DisclosureError(SiteError):
    """A reply was refused by the site's disclosure control.

    ``rule`` names the rule that refused it (see :data:`DISCLOSURE_RULES`), so a
    site's log and the compliance report can count refusals by reason.
    """

    fields = ("site", "task", "reason", "rule")

    def describe(self) -> str:
        return (
            f"site {self.site!r} refused task {self.task!r}: {self.reason}. Nothing was released."
        )


DISCLOSURE_RULES = (
    "threshold",
    "shape",
    "cells",
    "differencing",
    "levels",
    "saturation",
    "privacy-required",
    "secure-aggregation",
    "rounds",
    "grid",
    "entry",
    "dominance",
    "guard-full",
    "cross-cells",
    "path",
    "roster",
    "secagg-graph",
    "secagg-shares",
    "secagg-survivors",
    "vertical",
    "linkage",
)
"""The disclosure rules a site applies; a refusal names one of them."""


class ProtocolError(SiteError):
    """An exact request falls outside the protocol the site approved."""

    fields = ("site", "task", "analysis", "term", "reason")

    def describe(self) -> str:
        where = f" (term {self.term!r})" if self.term else ""
        return (
            f"site {self.site!r} refused task {self.task!r}: analysis {self.analysis!r}{where} "
            f"is outside the protocol the site approved: {self.reason}. Nothing was released; "
            "ask the site's privacy officer to approve it, or request it with differential "
            "privacy where the protocol allows."
        )


class ResourceLimitError(SiteError):
    """A request asks for more work or memory than the site allows per request."""

    fields = ("site", "task", "limit", "reason")

    def describe(self) -> str:
        return (
            f"site {self.site!r} refused task {self.task!r} before any work: {self.reason} "
            f"(limit {self.limit!r}). Split the work into smaller requests."
        )


class FormulaRefusedError(SiteError, FormulaError):
    """A site refused a formula its grammar does not allow; nothing was evaluated."""

    fields = ("site", "task", "term", "reason")

    def describe(self) -> str:
        return (
            f"site {self.site!r} refused the formula of task {self.task!r}: {self.term!r} "
            f"{self.reason}. Formulas may use column names, numbers, + - * / **, comparisons, "
            "& | ~, C() and the functions listed in fedstats.contract.formula_grammar."
        )


class UnknownTaskError(SiteError):
    """The coordinator asked for a task that the site does not answer."""

    fields = ("site", "task")

    def describe(self) -> str:
        return (
            f"site {self.site!r} does not answer task {self.task!r}: only tasks registered "
            "in fedstats.site.registry are served."
        )


class ExtraNotInstalledError(UnknownTaskError):
    """A task served by an optional extra (``fedstats[deep]``) that the site did not install."""

    fields = ("site", "task", "extra")

    def describe(self) -> str:
        return (
            f"site {self.site!r} cannot answer task {self.task!r}: fedstats's {self.extra!r} "
            f"extra is not installed there. Its data engineer installs it with "
            f"pip install 'fedstats[{self.extra}]'; every statistical task is served without it."
        )


class MalformedRequestError(SiteError):
    """A request's arguments do not fit the task."""

    fields = ("site", "task", "reason")

    def describe(self) -> str:
        return f"site {self.site!r} rejected a malformed {self.task!r} request: {self.reason}"


class InternalSiteError(SiteError):
    """An unexpected failure inside a site; details stay in the site's own log."""

    fields = ("site", "task", "error_type")

    def describe(self) -> str:
        return (
            f"site {self.site!r} failed while computing {self.task!r} ({self.error_type}); "
            "the details stay in the site's own log, ask the site's data engineer."
        )


class BudgetExceededError(SiteError):
    """A site refused a release that would exceed its privacy budget; nothing was released."""

    fields = ("site", "task", "study", "spent", "requested", "remaining", "budget")

    def describe(self) -> str:
        return (
            f"site {self.site!r} refused task {self.task!r}: its privacy budget for study "
            f"{self.study!r} would be exceeded (spent epsilon {_num(self.spent)}, this release "
            f"needs {_num(self.requested)}, remaining {_num(self.remaining)} of "
            f"{_num(self.budget)}). Nothing was released."
        )


DEFAULT_STUDY = "study"
"""The study name a :class:`~fedstats.models.federation.Federation` uses when none is given."""


class NoBudgetError(SiteError):
    """A site cannot make a private release: it has no ledger or no budget for the study."""

    fields = ("site", "task", "study", "reason")

    def describe(self) -> str:
        study = (
            f"study {DEFAULT_STUDY!r} (the default: no study name was set)"
            if self.study in (None, DEFAULT_STUDY)
            else f"study {self.study!r}"
        )
        return (
            f"site {self.site!r} refused task {self.task!r} for {study}: {self.reason}. "
            "Pass the site's ledger with ledgers={site: accounting.Ledger(path)} and the study's "
            "name with study= (Federation.in_process(frames, study=..., ledgers=...)); the "
            "site's privacy officer sets the budget of Scope(unit='patient', owner=site, "
            "study=...) in that ledger (fedstats budget set)."
        )


class SiteLedgerIntegrityError(SiteError):
    """A site refused a private release because its privacy ledger does not verify.

    The site's ledger recomputes what each budget has spent from its
    hash-chained entries and refuses to charge when the stored state
    disagrees (``accounting.LedgerIntegrityError``): the file was edited or
    replaced. Nothing was charged or released; what disagrees is in the
    site's own log, not in the reply.
    """

    fields = ("site", "task", "study")

    def describe(self) -> str:
        return (
            f"site {self.site!r} refused task {self.task!r} for study {self.study!r}: its privacy "
            "ledger does not verify (the budget it has stored disagrees with its hash-chained "
            "entries, or the ledger does not extend the chain head it recorded before), so "
            "nothing was charged or released. The site's privacy officer must restore the "
            "ledger from a backup and check it (fedstats budget show --ledger) before the site "
            "answers private requests again."
        )


class SiteDataError(SiteError):
    """Base class of problems with a site's analysis frame."""

    fields = ("site", "column")


class MissingColumnError(SiteDataError):
    fields = ("site", "column")

    def describe(self) -> str:
        return (
            f"site {self.site!r}: column {self.column!r} is missing from the analysis frame; "
            "harmonise the site's data with the study specification or fix the formula."
        )


class NonBinaryOutcomeError(SiteDataError):
    fields = ("site", "column", "count")

    def describe(self) -> str:
        return (
            f"site {self.site!r}: outcome {self.column!r} has {_count(self.count)} value(s) "
            "other than 0 and 1; code the outcome as 0/1 (or True/False) before fitting."
        )


class MissingValuesError(SiteDataError):
    fields = ("site", "column", "count")

    def describe(self) -> str:
        return (
            f"site {self.site!r}: column {self.column!r} has {_count(self.count)} missing "
            "value(s); impute or exclude them during harmonisation, or fit with missing='drop' "
            "to use complete cases (the dropped counts are reported)."
        )


class UnknownLevelError(SiteDataError):
    fields = ("site", "column", "level", "count")

    def describe(self) -> str:
        return (
            f"site {self.site!r}: column {self.column!r} has {_count(self.count)} value(s) of "
            f"{'a level' if self.level is None else f'level {self.level!r}'}, which is not "
            "among the levels agreed for the study; add it to "
            "the agreed levels or recode it during harmonisation."
        )


class InconsistentColumnError(SiteDataError):
    fields = ("site", "column", "reason")

    def describe(self) -> str:
        return f"site {self.site!r}: column {self.column!r} {self.reason}"


class NoEventsError(SiteDataError):
    fields = ("site", "column", "outcome_value")

    def describe(self) -> str:
        return (
            f"site {self.site!r}: every patient has {self.column!r} = {self.outcome_value}, so "
            "the site's aggregates would disclose every patient's outcome and the site adds "
            "no information on it; leave the site out of this analysis or check the outcome "
            "definition."
        )


class StatusCodeError(SiteDataError):
    """A competing-risks status column holds codes other than 0 (censored) and 1, 2, ... (the
    cause that occurred)."""

    fields = ("site", "column", "count")

    def describe(self) -> str:
        return (
            f"site {self.site!r}: status {self.column!r} has {_count(self.count)} value(s) that "
            "are not non-negative integers; code it 0 = censored and 1, 2, ... = the cause that "
            "occurred during harmonisation."
        )


def _count(value: object) -> str:
    """A count from a site; ``None`` when the site withheld a count below its cell threshold."""
    return "a few (fewer than the site's small-cell threshold)" if value is None else str(value)


def _num(value: object) -> str:
    return f"{value:.4g}" if isinstance(value, int | float) else str(value)


class PerfectSeparationError(FedstatsError):
    """The outcome is perfectly predicted: the maximum likelihood estimate does not exist."""


SITE_ERRORS: dict[str, type[SiteError]] = {
    cls.__name__: cls
    for cls in (
        SiteError,
        DisclosureError,
        UnknownTaskError,
        ExtraNotInstalledError,
        MalformedRequestError,
        InternalSiteError,
        BudgetExceededError,
        NoBudgetError,
        SiteLedgerIntegrityError,
        MissingColumnError,
        NonBinaryOutcomeError,
        MissingValuesError,
        UnknownLevelError,
        InconsistentColumnError,
        NoEventsError,
        StatusCodeError,
        ProtocolError,
        ResourceLimitError,
        FormulaRefusedError,
    )
}


def to_wire(error: SiteError) -> dict[str, Any]:
    """Describe a site error as plain values for an error reply."""
    return {"type": type(error).__name__, "values": error.values()}


def from_wire(payload: dict[str, Any], site: str) -> SiteError:
    """Rebuild the typed error a site reported; unknown types become :class:`SiteError`.

    The ``site`` field is always the name of the site the reply came from: a site
    cannot speak for another.
    """
    cls = SITE_ERRORS.get(str(payload.get("type")), SiteError)
    raw = payload.get("values")
    values = raw if isinstance(raw, dict) else {}
    kept = {k: v for k, v in values.items() if k in cls.fields and isinstance(v, str | int | float)}
    kept["site"] = site
    return cls(**kept)


# ---- operations (site job, study run, Flower), data files, configuration and models


class JobStopped(FedstatsError):
    """The job received SIGTERM; every process it started was stopped."""


class SiteHarmonisationError(FedstatsError):
    """The site's sources could not be harmonised (the message names the file, line or field)."""


class CoordinatorUnreachable(FedstatsError):
    """The study's SuperLink did not accept a connection within ``connect_timeout``."""


class SiteProcessesFailed(FedstatsError):
    """The site's SuperNode or site worker ended by itself while serving.

    :func:`serve_over_flower` sets ``processes``: the ids of the processes the
    run had started (all stopped).
    """


class JobAlreadyRunning(FedstatsError):
    """Another run of the job holds the lock; this one did nothing."""


class RunFailed(FedstatsError):
    """The study's run did not produce what a completed run must, or could not be recorded."""


class DemoFailed(Exception):
    """The demonstration stopped; the message says why, the exit code how."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


class DataFileError(FedstatsError):
    """A data file is missing or malformed (the message names the file and line)."""


class MessageFormatError(ValueError):
    """A Flower message does not hold what a fedstats message must hold."""


class SiteLost(RuntimeError):
    """A site's reply did not come back in time (after the retries the policy allows)."""


class SitesMissingError(FedstatsError):
    """Sites the study expects never answered on the Flower network."""


class FlowerProcessError(RuntimeError):
    """A Flower process could not be started, or a run could not be submitted."""


class StudyPkiError(FedstatsError):
    """A study key or certificate could not be made (e.g. the file already exists)."""


class EnrolmentError(StudyConfigurationError):
    """The study's enrolment list (site name -> node key) is unreadable, malformed, not signed
    by the study CA, or does not bind the site that reads it to its own key."""


class SiteIdentityError(FedstatsError):
    """A Flower node claims a site name enrolled with another key, or two nodes claim one name."""


class ConfigError(FedstatsError):
    """A job configuration file is missing, unreadable or invalid (the message names the field)."""


class PrevalenceShiftWarning(FedstatsWarning):
    """The intercept shift is only approximate for this model."""


class ModelSpecError(StudyConfigurationError):
    """A model name or hyperparameters cannot build a module (message names which and why)."""


class UnsafeTermError(FormulaError):
    """A formula term the grammar does not allow; ``token`` is the offending text."""

    def __init__(self, token: str, reason: str) -> None:
        self.token = token[:200]
        self.reason = reason
        super().__init__(f"formula term {self.token!r} {reason}")


class DomainError(FormulaError):
    """An expression cannot be computed for every row (outside a function's domain)."""

    def __init__(self, term: str) -> None:
        self.term = term
        super().__init__(
            f"{term!r} cannot be computed for every row (a value outside the domain of a "
            "function, a division by zero or an overflow)"
        )
