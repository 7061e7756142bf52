"""The protocol a site approved: the analyses it answers exactly.

A privacy officer (or an ethics board) approves a study protocol: which
models, on which outcome, with which terms, strata, groups and survival time
grid, for how many rounds, and whether only differentially private answers
are allowed. The site loads it (a TOML file beside ``site.toml``, or the
``[protocol]`` table of the study specification), pins its SHA-256 digest, and
:meth:`Protocol.admit` refuses, before any row is read, every exact request
about patients outside it with :class:`~fedstats.errors.ProtocolError` naming
the analysis and the term. A private request outside it is answered only
where the protocol allows differential-privacy exploration
(``dp_exploration = true``), and charged like any private release.

This is the guarantee the heuristics (cell rules, the differencing guard) are
not: a coordinator can only ask for what the site approved — the model
DataSHIELD's and vantage6's node-side allow-lists approximate, made specific to
one study (Gaye et al. 2014; Moncada-Torres et al. 2021).

The file::

    [protocol]
    title = "HEART-2026: risk factors of coronary disease"
    approved_by = "Cleveland Clinic privacy office"
    approved_on = 2026-11-20
    dp_exploration = false          # private requests outside the analyses

    [[protocol.analysis]]
    name = "risk model"
    model = "logistic"              # logistic | glm | cox | kaplan_meier | deep
                                    # | cumulative_incidence | fine_gray
                                    # | vertical_logistic (linked to another site's rows)
    formula = "disease ~ age + C(sex) + chol + C(cp)"
    max_rounds = 50                 # exact requests of this analysis
    privacy = "exact"               # "exact" (exact or private) or "dp" (private only)

    [[protocol.analysis]]
    name = "survival by arm"
    model = "kaplan_meier"
    outcome = "Surv(time, death)"
    groups = ["arm"]
    time_grid = [0, 30, 60, 90, 180, 365]
    # strata = ["stage"]            # a stratified log-rank test; weights = "n" for weighted counts

    [[protocol.analysis]]
    name = "infection rates"
    model = "glm"
    family = "poisson"              # binomial | poisson | gaussian
    formula = "infections ~ C(ward) + age"
    exposure = "patient_days"       # its log joins the linear predictor
    weights = "n_patients"          # frequency weights, when the model takes them

A request matches an analysis when its model kind, outcome and set of terms
(interactions order-free; the intercept aside) equal the analysis's, its
strata, offset, exposure, weights (and a GLM's family) are the analysis's, and its
group (fairness, Kaplan–Meier)
or cluster (robust Cox variance) is one of the analysis's ``groups``.
``time_grid`` fixes the survival grid of the outcome for exact Kaplan–Meier
and pooled-Cox requests (:mod:`fedstats.site.survival_grid`); ``networks`` lists
the deep models allowed.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedstats.contract.design import DesignSpec, counting_outcome, parse_formula, survival_outcome
from fedstats.errors import FormulaError, ProtocolError, StudyConfigurationError

MODELS = (
    "logistic",
    "glm",
    "cox",
    "kaplan_meier",
    "deep",
    "cumulative_incidence",
    "fine_gray",
    "vertical_logistic",
)
FAMILIES = ("binomial", "poisson", "gaussian")
KIND_FAMILIES = {"binary": "binomial", "count": "poisson", "continuous": "gaussian"}
"""The GLM family a design's outcome kind implies (the site checks a request's family
against its design's outcome kind, :func:`fedstats.site.handlers.glm.checked_family`)."""
PRIVACY = ("exact", "dp")
COMPETING_MODELS = ("cumulative_incidence", "fine_gray")
CURVE_MODELS = ("kaplan_meier", "cumulative_incidence")
"""Models whose analyses name an outcome and no terms (curves on a time grid)."""

TASK_MODELS: dict[str, tuple[str, ...]] = {
    "prepare": ("logistic", "glm", "cox", "deep"),
    "logistic.summaries": ("logistic",),
    "logistic.evaluate": ("logistic",),
    "glm.summaries": ("glm", "logistic"),
    "fairness.summaries": ("logistic",),
    "cox.summaries": ("cox",),
    "cox.grid_summaries": ("cox",),
    "cox.concordance": ("cox",),
    "cox.robust": ("cox",),
    "cox.piecewise_summaries": ("cox",),
    "survival.counts": ("kaplan_meier",),
    "competing.counts": ("cumulative_incidence",),
    "fine_gray.grid_summaries": ("fine_gray",),
    "fine_gray.robust": ("fine_gray",),
    "deep.train": ("deep",),
    "deep.evaluate": ("deep",),
    "vertical.prepare": ("vertical_logistic",),
    "vertical.encrypt_outcome": ("vertical_logistic",),
    "vertical.masked_products": ("vertical_logistic",),
    "vertical.decrypt": ("vertical_logistic",),
    "vertical.unmask": ("vertical_logistic",),
    "vertical.summaries": ("vertical_logistic",),
    "linkage.advertise": ("vertical_logistic",),
    "linkage.encode": ("vertical_logistic",),
    "linkage.accept": ("vertical_logistic",),
}
"""The model kinds each task about patients serves; a task not listed is outside every
protocol."""

LINKAGE_TASKS = tuple(task for task in TASK_MODELS if task.startswith("linkage."))
"""The record-linkage tasks (:mod:`fedstats.contract.tasks.record_linkage`): a protocol
admits them when it approves a vertical analysis (``vertical_logistic``), the one use of a
linkage; they name no design, so no term is matched."""

_ANALYSIS_KEYS = {
    "name",
    "model",
    "formula",
    "outcome",
    "strata",
    "groups",
    "offset",
    "time_grid",
    "max_rounds",
    "privacy",
    "networks",
    "family",
    "weights",
    "exposure",
}
_PROTOCOL_KEYS = {"title", "approved_by", "approved_on", "dp_exploration", "analysis"}


@dataclass(frozen=True)
class Analysis:
    """One approved analysis (see the module docstring for the fields)."""

    name: str
    model: str
    outcome: str
    terms: frozenset[str]
    strata: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    offset: str | None = None
    time_grid: tuple[float, ...] | None = None
    max_rounds: int | None = None
    privacy: str = "exact"
    networks: frozenset[str] = frozenset()
    family: str | None = None
    """A GLM's family (a logistic analysis is the binomial one)."""
    weights: str | None = None
    exposure: str | None = None

    @property
    def survival(self) -> tuple[str, str] | None:
        """``(time, event)`` of a survival outcome (``(stop, event)`` of
        ``Surv(start, stop, event)``, whose time grid is the stops')."""
        counting = counting_outcome(self.outcome)
        return survival_outcome(self.outcome) if counting is None else counting[1:]


@dataclass(frozen=True)
class Request:
    """What a request asks for, read from its arguments (never from the site's rows)."""

    task: str
    outcome: str
    terms: frozenset[str] | None = None
    strata: frozenset[str] = frozenset()
    offset: str | None = None
    group: str | None = None
    network: str | None = None
    family: str | None = None
    weights: str | None = None
    exposure: str | None = None

    def describe(self) -> str:
        rhs = " + ".join(sorted(self.terms)) if self.terms is not None else "curves"
        return f"{self.outcome} ~ {rhs or '1'}"


@dataclass(frozen=True)
class Protocol:
    """An approved protocol; :meth:`admit` refuses requests outside it.

    ``digest`` is the SHA-256 of the text the privacy officer approved (the
    file's bytes); it goes into every run record and the compliance report.
    """

    title: str
    analyses: tuple[Analysis, ...]
    digest: str
    dp_exploration: bool = False
    approved_by: str = ""
    approved_on: str = ""
    source: str = "<protocol>"

    # ------------------------------------------------------------ building

    @classmethod
    def from_mapping(cls, table: Mapping[str, Any], *, source: str = "<protocol>") -> Protocol:
        """A protocol from its ``[protocol]`` table (a dict, e.g. in a notebook)."""
        text = repr(sorted(table.items(), key=lambda kv: kv[0])).encode()
        return _build(table, source=source, digest=hashlib.sha256(text).hexdigest())

    @classmethod
    def from_toml(cls, text: str, *, source: str = "<protocol>") -> Protocol:
        """A protocol from TOML text holding a ``[protocol]`` table."""
        try:
            document = tomllib.loads(text)
        except tomllib.TOMLDecodeError as error:
            raise StudyConfigurationError(f"protocol {source}: not valid TOML: {error}") from None
        if not isinstance(document.get("protocol"), dict):
            raise StudyConfigurationError(
                f"protocol {source}: no [protocol] table; see fedstats.site.protocol for the format"
            )
        digest = hashlib.sha256(text.encode()).hexdigest()
        return _build(document["protocol"], source=source, digest=digest)

    # ------------------------------------------------------------ checking

    def admit(
        self, site: str, task: str, args: dict[str, Any], *, private: bool
    ) -> Analysis | None:
        """The approved analysis a request about patients belongs to.

        Returns ``None`` for a private request the protocol admits as
        exploration. Raises :class:`~fedstats.errors.ProtocolError` naming the
        analysis and the term for an exact request outside the protocol, an
        exact request of a private-only analysis, and a private request
        outside it when exploration is not allowed.
        """
        if task in LINKAGE_TASKS:
            return self._admit_linkage(site, task)
        request = read_request(site, task, args)
        kinds = TASK_MODELS.get(task, ())
        best: tuple[Analysis, str, str] | None = None
        for analysis in self.analyses:
            if analysis.model not in kinds:
                continue
            mismatch = _mismatch(analysis, request)
            if mismatch is None:
                if analysis.privacy == "dp" and not private:
                    raise ProtocolError(
                        site=site,
                        task=task,
                        analysis=analysis.name,
                        term="",
                        reason="the protocol allows this analysis only with differential privacy",
                    )
                return analysis
            if best is None or (best[1] == "outcome" and mismatch[0] != "outcome"):
                best = (analysis, *mismatch)
        if private and self.dp_exploration:
            return None
        if best is None:
            reason = f"the protocol approves no {' or '.join(kinds) or task} analysis"
            raise ProtocolError(
                site=site, task=task, analysis=request.describe(), term="", reason=reason
            )
        analysis, term, why = best
        raise ProtocolError(
            site=site,
            task=task,
            analysis=f"{request.describe()} (closest approved: {analysis.name!r})",
            term=term,
            reason=why,
        )

    def _admit_linkage(self, site: str, task: str) -> Analysis:
        """The first exact vertical analysis approved: linking serves it. A protocol with none
        (or only private ones: a linkage has no private form) refuses linking."""
        for analysis in self.analyses:
            if analysis.model == "vertical_logistic" and analysis.privacy != "dp":
                return analysis
        raise ProtocolError(
            site=site,
            task=task,
            analysis="record linkage",
            term="",
            reason="the protocol approves no exact vertical_logistic analysis, the one use of "
            "a record linkage",
        )

    def survival_grid(self, time: str, event: str) -> np.ndarray | None:
        """The time grid the protocol fixes for ``Surv(time, event)``, if any."""
        for analysis in self.analyses:
            if analysis.survival == (time, event) and analysis.time_grid is not None:
                return np.asarray(analysis.time_grid, dtype=np.float64)
        return None

    def describe(self) -> str:
        """One line for logs and run records."""
        return f"{self.title!r} ({len(self.analyses)} analyses, sha256 {self.digest[:12]}…)"


def load_protocol(
    path: Path,
    *,
    sha256: str | None = None,
    named_by: str = "the path under [disclosure] protocol in site.toml",
) -> Protocol:
    """Read and validate a protocol file; refuse it if its digest is not ``sha256``.

    ``sha256`` is the digest the privacy officer approved (``protocol_sha256``
    in ``site.toml``): a file edited after approval is refused. ``named_by`` says where
    the path came from, for the message of a file that cannot be read.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as error:
        raise StudyConfigurationError(
            f"protocol {path}: cannot be read ({error.strerror or error}); check {named_by}"
        ) from None
    digest = hashlib.sha256(raw).hexdigest()
    if sha256 is not None and sha256.lower() != digest:
        raise StudyConfigurationError(
            f"protocol {path}: its SHA-256 is {digest}, not the approved {sha256}; the file "
            "changed after approval. Have the new text approved and update protocol_sha256"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise StudyConfigurationError(f"protocol {path}: not UTF-8 text") from None
    protocol = Protocol.from_toml(text, source=str(path))
    return protocol


# ---------------------------------------------------------------- internals


def read_request(site: str, task: str, args: dict[str, Any]) -> Request:
    """The model, outcome, terms, strata and group a request asks for."""
    if task in ("survival.counts", "competing.counts"):
        time, event, group = args.get("time"), args.get("event"), args.get("group")
        strata = args.get("strata")
        return Request(
            task=task,
            outcome=f"Surv({time}, {event})",
            group=_name_or_none(group),
            strata=frozenset(str(s) for s in strata) if isinstance(strata, list) else frozenset(),
            weights=_name_or_none(args.get("weights")),
        )
    try:
        spec = DesignSpec.from_wire(args.get("design"))
        parsed = parse_formula(spec.formula)
    except (ValueError, FormulaError) as error:
        raise ProtocolError(
            site=site,
            task=task,
            analysis="?",
            term="",
            reason=f"the request's design cannot be read: {error}",
        ) from None
    return Request(
        task=task,
        outcome=parsed.outcome,
        terms=frozenset(term_name(t) for t in parsed.terms),
        strata=frozenset(spec.strata),
        offset=spec.offset,
        group=_name_or_none(args.get("cluster" if task == "cox.robust" else "group")),
        network=_name_or_none(args.get("model")),
        family=KIND_FAMILIES.get(spec.outcome_kind),
        weights=spec.weights,
        exposure=spec.exposure,
    )


def term_name(term: tuple[Any, ...]) -> str:
    """A term's canonical name: its factors' names, sorted, joined by ``:``."""
    return ":".join(sorted(f.name for f in term))


def _mismatch(analysis: Analysis, request: Request) -> tuple[str, str] | None:
    """``None`` when the request is inside ``analysis``; else (term, why)."""
    if request.outcome != analysis.outcome:
        return "outcome", f"the approved outcome is {analysis.outcome}, not {request.outcome}"
    if request.terms is not None and analysis.model not in CURVE_MODELS:
        extra = sorted(request.terms - analysis.terms)
        if extra:
            return extra[0], f"term {extra[0]!r} is not among the approved terms"
        missing = sorted(analysis.terms - request.terms)
        if missing:
            return missing[0], f"the approved model also has term {missing[0]!r}"
        if request.strata != analysis.strata:
            odd = sorted(request.strata ^ analysis.strata)[0]
            return odd, f"the approved strata are {sorted(analysis.strata) or 'none'}"
        binary = analysis.model in ("logistic", "vertical_logistic")
        approved_family = "binomial" if binary else analysis.family
        if request.family is not None and request.family != approved_family:
            return request.family, f"the approved family is {approved_family}"
        if request.offset != analysis.offset:
            return str(request.offset), f"the approved offset is {analysis.offset or 'none'}"
        if request.weights != analysis.weights:
            return str(request.weights), f"the approved weights are {analysis.weights or 'none'}"
        if request.exposure != analysis.exposure:
            approved = analysis.exposure or "none"
            return str(request.exposure), f"the approved exposure is {approved}"
    if analysis.model == "kaplan_meier":
        if request.strata != analysis.strata:
            odd = sorted(request.strata ^ analysis.strata)[0]
            return odd, f"the approved strata are {sorted(analysis.strata) or 'none'}"
        if request.weights != analysis.weights:
            return str(request.weights), f"the approved weights are {analysis.weights or 'none'}"
    if request.group is not None and request.group not in analysis.groups:
        approved = sorted(analysis.groups) or "none"
        return request.group, f"grouping by {request.group!r} is not approved (groups: {approved})"
    deep_task = request.task.startswith("deep.")
    if deep_task and analysis.networks and request.network not in analysis.networks:
        return str(request.network), f"the approved networks are {sorted(analysis.networks)}"
    return None


def _name_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _build(table: Mapping[str, Any], *, source: str, digest: str) -> Protocol:
    unknown = sorted(set(table) - _PROTOCOL_KEYS)
    if unknown:
        raise StudyConfigurationError(
            f"protocol {source}: unknown keys {unknown}; allowed: {sorted(_PROTOCOL_KEYS)}"
        )
    title = table.get("title", "")
    if not isinstance(title, str) or not title.strip():
        raise StudyConfigurationError(f"protocol {source}: 'title' must name the study")
    exploration = table.get("dp_exploration", False)
    if not isinstance(exploration, bool):
        raise StudyConfigurationError(f"protocol {source}: 'dp_exploration' must be true or false")
    entries = table.get("analysis", [])
    if not isinstance(entries, list) or not entries:
        raise StudyConfigurationError(f"protocol {source}: list at least one [[protocol.analysis]]")
    analyses = tuple(_analysis(entry, i, source) for i, entry in enumerate(entries, 1))
    names = [a.name for a in analyses]
    if len(set(names)) != len(names):
        raise StudyConfigurationError(f"protocol {source}: analysis names must differ: {names}")
    grids: dict[tuple[str, str], tuple[float, ...]] = {}
    for a in analyses:
        if a.survival is not None and a.time_grid is not None:  # noqa: SIM102
            if grids.setdefault(a.survival, a.time_grid) != a.time_grid:
                raise StudyConfigurationError(
                    f"protocol {source}: analyses on {a.outcome} fix different time grids; "
                    "a study has one grid per survival outcome"
                )
    return Protocol(
        title=title.strip(),
        analyses=analyses,
        digest=digest,
        dp_exploration=exploration,
        approved_by=str(table.get("approved_by", "")),
        approved_on=str(table.get("approved_on", "")),
        source=source,
    )


def _analysis(entry: Any, index: int, source: str) -> Analysis:
    where = f"protocol {source}, analysis {index}"
    if not isinstance(entry, dict):
        raise StudyConfigurationError(f"{where}: must be a table")
    unknown = sorted(set(entry) - _ANALYSIS_KEYS)
    if unknown:
        raise StudyConfigurationError(
            f"{where}: unknown keys {unknown}; allowed: {sorted(_ANALYSIS_KEYS)}"
        )
    name, model = entry.get("name"), entry.get("model")
    if not (isinstance(name, str) and name.strip()):
        raise StudyConfigurationError(f"{where}: 'name' must name the analysis")
    where = f"protocol {source}, analysis {name!r}"
    if model not in MODELS:
        raise StudyConfigurationError(f"{where}: 'model' must be one of {MODELS}, got {model!r}")
    formula, outcome = entry.get("formula"), entry.get("outcome")
    terms: frozenset[str] = frozenset()
    if model in CURVE_MODELS:
        if not isinstance(outcome, str) or survival_outcome(outcome) is None or formula:
            raise StudyConfigurationError(
                f'{where}: a {model} analysis names its outcome = "Surv(time, event)"'
            )
        time, event = survival_outcome(outcome)  # type: ignore[misc]
        outcome = f"Surv({time}, {event})"
    else:
        if not isinstance(formula, str) or outcome is not None:
            raise StudyConfigurationError(
                f'{where}: a {model} analysis gives its model as formula = "outcome ~ terms"'
            )
        try:
            parsed = parse_formula(formula)
        except FormulaError as error:
            raise StudyConfigurationError(f"{where}: {error}") from None
        if (model in ("cox", "fine_gray")) != (parsed.outcome_factor is None):
            raise StudyConfigurationError(
                f"{where}: a cox or fine_gray analysis, and only those, has a Surv(time, event) "
                "outcome (a cox analysis also Surv(start, stop, event))"
            )
        if model == "fine_gray" and counting_outcome(parsed.outcome) is not None:
            raise StudyConfigurationError(
                f"{where}: a fine_gray analysis has a Surv(time, status) outcome, not the "
                "counting-process form"
            )
        outcome = parsed.outcome
        terms = frozenset(term_name(t) for t in parsed.terms)
    strata = _names(entry.get("strata", []), f"{where}: 'strata'")
    groups = _names(entry.get("groups", []), f"{where}: 'groups'")
    networks = _names(entry.get("networks", []), f"{where}: 'networks'")
    offset = entry.get("offset")
    if offset is not None and not isinstance(offset, str):
        raise StudyConfigurationError(f"{where}: 'offset' must name a column")
    weights, exposure = entry.get("weights"), entry.get("exposure")
    for key, value in (("weights", weights), ("exposure", exposure)):
        if value is not None and not isinstance(value, str):
            raise StudyConfigurationError(f"{where}: {key!r} must name a column")
    family = entry.get("family")
    if (model == "glm") != (family is not None) or (family is not None and family not in FAMILIES):
        raise StudyConfigurationError(
            f"{where}: a glm analysis, and only a glm analysis, names its family: one of {FAMILIES}"
        )
    max_rounds = entry.get("max_rounds")
    if max_rounds is not None and not (type(max_rounds) is int and max_rounds >= 1):
        raise StudyConfigurationError(f"{where}: 'max_rounds' must be a positive integer")
    privacy = entry.get("privacy", "exact")
    if privacy not in PRIVACY:
        raise StudyConfigurationError(f"{where}: 'privacy' must be one of {PRIVACY}")
    grid = entry.get("time_grid")
    time_grid: tuple[float, ...] | None = None
    if grid is not None:
        ok = isinstance(grid, list) and len(grid) >= 1
        values = [float(v) for v in grid if isinstance(v, int | float) and not isinstance(v, bool)]
        ok = ok and len(values) == len(grid) and all(math.isfinite(v) for v in values)
        if not ok or any(b <= a for a, b in itertools.pairwise(values)):
            raise StudyConfigurationError(
                f"{where}: 'time_grid' must be a list of increasing finite numbers"
            )
        if model not in ("kaplan_meier", "cox", *COMPETING_MODELS):
            raise StudyConfigurationError(f"{where}: only survival analyses have a time_grid")
        time_grid = tuple(values)
    return Analysis(
        name=name.strip(),
        model=model,
        outcome=outcome,
        terms=terms,
        strata=strata,
        groups=groups,
        offset=offset,
        time_grid=time_grid,
        max_rounds=max_rounds,
        privacy=privacy,
        networks=networks,
        family=family,
        weights=weights,
        exposure=exposure,
    )


def _names(value: Any, what: str) -> frozenset[str]:
    if not (isinstance(value, list) and all(isinstance(v, str) and v for v in value)):
        raise StudyConfigurationError(f"{what} must be a list of column names")
    return frozenset(value)
