"""The coordinator's study configuration (``study.toml`` for ``fedstats study run``).

It names the study, the sites expected, the fits to make, where the SuperLink
is and what to do when a site is lost. Relative paths are read relative to
the file. Example in ``fedstats/examples/flower/study.toml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from fedstats.toml_config import STRICT, Name, load_toml_model, resolve_path


class StudySection(BaseModel):
    """``[study]``: name, expected sites, the output folder and, for a study that links
    records (``[[links]]``), ``spec``: the study specification whose ``[linkage]`` table the
    sites encode under (the file the sites harmonise with)."""

    model_config = STRICT
    name: Name
    sites: Annotated[list[Name], Field(min_length=1)]
    out: Path
    spec: Path | None = None

    _paths = field_validator("out", "spec", mode="before")(resolve_path)

    @field_validator("sites")
    @classmethod
    def _unique(cls, sites: list[str]) -> list[str]:
        if len(set(sites)) != len(sites):
            raise ValueError("site names must be unique")
        return sites


class PolicySection(BaseModel):
    """``[policy]``: per-round timeout and what to do with a site lost mid-round.

    ``on_site_lost = "retry"`` re-sends the round's request to the site (after
    finding its node again, e.g. after a restart) up to ``retries`` times;
    ``"abort"`` stops the fit at once. Either way the error names the site.
    """

    model_config = STRICT
    round_timeout: Annotated[float, Field(gt=0, le=86400)] = 120.0
    on_site_lost: Literal["retry", "abort"] = "abort"
    retries: Annotated[int, Field(ge=0, le=100)] = 2
    discovery_timeout: Annotated[float, Field(gt=0, le=86400)] = 300.0
    poll_interval: Annotated[float, Field(ge=0.001, le=10)] = 0.01
    identify_grace: Annotated[float, Field(ge=0, le=3600)] = 2.0
    """Seconds discovery still waits, once every site was found, for the other online nodes'
    answers, so a second node claiming a site's name is seen (and refused), not missed."""


class IdentitySection(BaseModel):
    """``[identity]``: the study's enrolment list and the study CA that signed it.

    With it, a site is served only through the node whose SuperLink-authenticated
    key the list binds to the site's name (:mod:`fedstats.flower.enrolment`).
    """

    model_config = STRICT
    enrolment: Path
    study_ca: Path

    _paths = field_validator("enrolment", "study_ca", mode="before")(resolve_path)


class CoordinatorSection(BaseModel):
    """``[coordinator]``: how ``fedstats study run`` reaches the SuperLink's control API."""

    model_config = STRICT
    superlink: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$")]
    insecure: bool = False
    root_certificates: Path | None = None
    run_timeout: Annotated[float, Field(gt=0, le=7 * 86400)] = 3600.0

    _paths = field_validator("root_certificates", mode="before")(resolve_path)

    @model_validator(mode="after")
    def _tls(self) -> CoordinatorSection:
        if not self.insecure and self.root_certificates is None:
            raise ValueError("give root_certificates (the study CA), or insecure = true")
        return self


class SecureAggregationOptions(BaseModel):
    """A fit's ``secure_aggregation`` table: :class:`fedstats.SecureAggregation`'s options
    (the coordinator sees only the sums of the sites' replies)."""

    model_config = STRICT
    threshold: Annotated[int, Field(ge=2)] | None = None
    fraction_bits: Annotated[int, Field(ge=1, le=62)] | None = None
    construction: Literal["secagg+", "secagg"] | None = None
    """``"secagg+"`` (the default: O(log n) neighbours) or ``"secagg"`` (every pair)."""


class LogisticFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``logistic``."""

    model_config = STRICT
    kind: Literal["logistic"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    site_intercepts: bool = False
    secure_aggregation: SecureAggregationOptions | None = None


class GlmFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``glm``: :class:`fedstats.GLM`'s options."""

    model_config = STRICT
    kind: Literal["glm"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    family: Literal["binomial", "poisson", "gaussian"]
    offset: str | None = None
    exposure: str | None = None
    weights: str | None = None
    scale: Literal["X2"] | None = None
    site_intercepts: bool = False
    secure_aggregation: SecureAggregationOptions | None = None


class CoxFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``cox`` (stratified by site unless ``strata = "none"``)."""

    model_config = STRICT
    kind: Literal["cox"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    strata: Literal["site"] = "site"
    ties: Literal["efron", "breslow"] = "efron"
    weights: str | None = None
    secure_aggregation: SecureAggregationOptions | None = None


class FineGrayFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``fine_gray``: :class:`fedstats.FineGray` of one ``cause``
    on a grid of ``width`` up to ``horizon``; ``convention`` ``"crr"`` (``cmprsk::crr``, the
    default) or ``"finegray"`` (``coxph`` on ``survival::finegray()`` rows), ``ties`` the
    convention's default unless given."""

    model_config = STRICT
    kind: Literal["fine_gray"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    cause: Annotated[int, Field(ge=1)]
    width: Annotated[float, Field(gt=0)]
    horizon: Annotated[float, Field(gt=0)]
    convention: Literal["crr", "finegray"] = "crr"
    ties: Literal["efron", "breslow"] | None = None


class KaplanMeierFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``kaplan_meier`` (grid of ``width`` up to ``horizon``).

    ``group`` (optional) names a column whose levels, agreed across sites,
    get a curve each. ``sparse_events``: what a site does at an interval
    with fewer deaths than its disclosure threshold — ``"end"`` the curve
    there, or ``"defer"`` the deaths to the next grid point
    (:class:`fedstats.KaplanMeier`).
    """

    model_config = STRICT
    kind: Literal["kaplan_meier"]
    name: Name
    time: str
    event: str
    width: Annotated[float, Field(gt=0)]
    horizon: Annotated[float, Field(gt=0)]
    group: str | None = None
    sparse_events: Literal["end", "defer"] = "end"
    weights: str | None = None

    @model_validator(mode="after")
    def _grid(self) -> KaplanMeierFit:
        if self.width > self.horizon:
            raise ValueError(f"width ({self.width:g}) must not exceed horizon ({self.horizon:g})")
        return self


HyperValue = bool | int | float | str | list[int] | list[float]
Bound = Annotated[list[float], Field(min_length=2, max_length=2)]


class DeepFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``deep``: a registered network trained by federated rounds.

    The fields are :class:`fedstats.deep.FederatedTrainer`'s: ``model`` (a
    registered architecture) with its ``hyper`` table; the design
    (``formula``, and ``bounds``: ``column = [low, high]``, public limits of
    every numeric design column); ``algorithm`` (``mu`` for FedProx);
    ``rounds`` and the local work per round (exactly one of ``local_steps``
    and ``local_epochs``); ``lr`` and ``batch_size``; ``seed`` (initial
    weights, site sampling and batch order; without it, OS entropy).
    """

    model_config = STRICT
    kind: Literal["deep"]
    name: Name
    model: Annotated[str, Field(min_length=1)] = "mlp"
    hyper: dict[str, HyperValue] = Field(default_factory=dict)
    formula: Annotated[str, Field(min_length=3)]
    bounds: dict[str, Bound]
    algorithm: Literal["fedavg", "fedprox", "scaffold"] = "fedavg"
    mu: Annotated[float, Field(ge=0)] = 0.0
    rounds: Annotated[int, Field(ge=1, le=100_000)]
    local_steps: Annotated[int, Field(ge=1)] | None = None
    local_epochs: Annotated[int, Field(ge=1)] | None = None
    lr: Annotated[float, Field(gt=0)] = 0.05
    batch_size: Annotated[int, Field(ge=1)] = 32
    seed: Annotated[int, Field(ge=0)] | None = None

    @field_validator("bounds")
    @classmethod
    def _ordered(cls, bounds: dict[str, list[float]]) -> dict[str, list[float]]:
        for column, (low, high) in bounds.items():
            if not low < high:
                raise ValueError(f"bounds of {column!r}: low ({low:g}) must be below high")
        return bounds

    @model_validator(mode="after")
    def _local_work(self) -> DeepFit:
        if (self.local_steps is None) == (self.local_epochs is None):
            raise ValueError("give exactly one of local_steps and local_epochs")
        if self.algorithm == "fedprox" and self.mu <= 0:
            raise ValueError("fedprox needs mu > 0 (mu = 0 is fedavg)")
        return self


class LinkEntry(BaseModel):
    """A ``[[links]]`` entry: link the patients of sites ``first`` and ``second`` under the
    study specification's ``[linkage]`` table (:func:`fedstats.link`), recorded as
    ``linkages/<id>.json``; a vertical fit names it by ``id``."""

    model_config = STRICT
    id: Name
    first: Name
    second: Name

    @model_validator(mode="after")
    def _two_sites(self) -> LinkEntry:
        if self.first == self.second:
            raise ValueError(f"first and second must be two different sites, got {self.first!r}")
        return self


class VerticalLogisticFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``vertical_logistic``
    (:class:`fedstats.VerticalLogisticRegression`): the outcome at ``outcome_site`` (the
    registry), the covariates at each of ``covariate_sites`` (the hospitals), each hospital
    linked to the registry by the ``[[links]]`` entry ``linkage`` names at its position."""

    model_config = STRICT
    kind: Literal["vertical_logistic"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    outcome_site: Name
    covariate_sites: Annotated[list[Name], Field(min_length=1)]
    linkage: Annotated[list[Name], Field(min_length=1)]
    maxiter: Annotated[int, Field(ge=1, le=1000)] = 50

    @model_validator(mode="after")
    def _one_linkage_per_hospital(self) -> VerticalLogisticFit:
        hospitals = self.covariate_sites
        if len(set(hospitals)) != len(hospitals) or self.outcome_site in hospitals:
            raise ValueError(
                "covariate_sites must list distinct sites, not the outcome site "
                f"{self.outcome_site!r}"
            )
        if len(self.linkage) != len(hospitals):
            raise ValueError(
                f"linkage must name one [[links]] id per covariate site, in their order "
                f"({len(hospitals)} site(s), {len(self.linkage)} id(s))"
            )
        return self


Fit = Annotated[
    LogisticFit | GlmFit | CoxFit | FineGrayFit | KaplanMeierFit | DeepFit | VerticalLogisticFit,
    Field(discriminator="kind"),
]


class StudyConfig(BaseModel):
    """The whole ``study.toml``."""

    model_config = STRICT
    study: StudySection
    coordinator: CoordinatorSection | None = None
    policy: PolicySection = PolicySection()
    identity: IdentitySection | None = None
    links: list[LinkEntry] = Field(default_factory=list)
    fits: Annotated[list[Fit], Field(min_length=1)]

    @field_validator("links")
    @classmethod
    def _links_of_study_sites(cls, links: list[LinkEntry], info: ValidationInfo) -> list[LinkEntry]:
        ids = [entry.id for entry in links]
        if len(set(ids)) != len(ids):
            raise ValueError("link ids must be unique")
        study = info.data.get("study")
        if links and study is not None:
            if study.spec is None:
                raise ValueError(
                    "[[links]] needs [study] spec: the study specification whose [linkage] "
                    "table the sites encode under"
                )
            for number, entry in enumerate(links):
                strangers = [s for s in (entry.first, entry.second) if s not in study.sites]
                if strangers:
                    raise ValueError(
                        f"links[{number}] ({entry.id!r}): {strangers} not among the study's "
                        f"sites {study.sites}"
                    )
        return links

    @field_validator("fits")
    @classmethod
    def _unique_names(cls, fits: list[Fit], info: ValidationInfo) -> list[Fit]:
        names = [fit.name for fit in fits]
        if len(set(names)) != len(names):
            raise ValueError("fit names must be unique")
        links = {entry.id: entry for entry in info.data.get("links") or []}
        study = info.data.get("study")
        for number, fit in enumerate(fits):
            if isinstance(fit, VerticalLogisticFit):
                _check_vertical(number, fit, links, study)
        return fits


def _check_vertical(
    number: int,
    fit: VerticalLogisticFit,
    links: dict[str, LinkEntry],
    study: StudySection | None,
) -> None:
    """Each hospital of a vertical fit is linked to its registry by the link it names."""
    where = f"fits[{number}] ({fit.name!r})"
    sites = [fit.outcome_site, *fit.covariate_sites]
    if study is not None and any(site not in study.sites for site in sites):
        strangers = [site for site in sites if site not in study.sites]
        raise ValueError(f"{where}: {strangers} not among the study's sites {study.sites}")
    for hospital, link_id in zip(fit.covariate_sites, fit.linkage, strict=True):
        entry = links.get(link_id)
        if entry is None:
            raise ValueError(
                f"{where}: linkage {link_id!r} is not a [[links]] id (have {sorted(links)})"
            )
        if {entry.first, entry.second} != {fit.outcome_site, hospital}:
            raise ValueError(
                f"{where}: link {link_id!r} joins {entry.first!r} and {entry.second!r}, not "
                f"the outcome site {fit.outcome_site!r} and covariate site {hospital!r}"
            )


def load_study_config(path: str | Path) -> StudyConfig:
    """Read and validate ``study.toml``; a ``ConfigError`` names the field."""
    return load_toml_model(path, StudyConfig, what="study configuration")
