"""A site's own configuration (``site.toml``): its data, privacy ledger, policy and coordinator.

Everything a site applies to its data is set here, by the site: the
coordinator never sends a frame path, a disclosure threshold or a budget.
Relative paths are read relative to the file. Example in
``fedstats/examples/flower/site.toml``.
"""

from __future__ import annotations

from datetime import date
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from fedstats.site.disclosure import MIN_K_CELL, DisclosurePolicy
from fedstats.toml_config import STRICT, Name, load_toml_model, resolve_path


class SiteSection(BaseModel):
    """``[site]``: the site's name in the study and its working folder."""

    model_config = STRICT
    name: Name
    workdir: Path = Field(description="frames, run records, journal and lock live here")

    _paths = field_validator("workdir", mode="before")(resolve_path)


class DataSection(BaseModel):
    """``[data]``: a ready analysis frame, or sources harmonised under the study specification.

    A site of a vertical study (a specification with a ``[linkage]`` table) links on its
    identifier table: harmonised sources keep it beside the frame
    (``workdir/current/identifiers.parquet``); a ready ``frame`` names it in ``identifiers``
    (Parquet, indexed as the frame) with the ``spec`` whose ``[linkage]`` table it is encoded
    under.
    """

    model_config = STRICT
    frame: Path | None = None
    identifiers: Path | None = None
    spec: Path | None = None
    fhir: list[Path] | None = None
    omop: Path | None = None
    latest_date: date | None = None
    max_rejected_share: Annotated[float, Field(ge=0, le=1)] = 0.10

    @field_validator("frame", "identifiers", "spec", "omop", mode="before")
    @classmethod
    def _relative(cls, value: object, info: ValidationInfo) -> object:
        return resolve_path(value, info) if isinstance(value, str) else value

    @field_validator("fhir", mode="before")
    @classmethod
    def _relative_list(cls, value: object, info: ValidationInfo) -> object:
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return [resolve_path(v, info) for v in value]
        return value

    @model_validator(mode="after")
    def _one_source(self) -> DataSection:
        sources = [self.frame is not None, self.fhir is not None, self.omop is not None]
        if sum(sources) != 1:
            raise ValueError("give exactly one of frame, fhir or omop")
        if self.frame is None and self.spec is None:
            raise ValueError(
                "harmonising fhir or omop sources needs spec (the study specification)"
            )
        if self.identifiers is not None and (self.frame is None or self.spec is None):
            raise ValueError(
                "identifiers goes with a ready frame and the spec whose [linkage] table it is "
                "encoded under; harmonised sources keep their identifier table themselves"
            )
        return self


class DisclosureSection(BaseModel):
    """``[disclosure]``: the site's disclosure control."""

    model_config = STRICT
    min_count: Annotated[int, Field(ge=1)] = 10
    k_cell: int | None = None
    """The small-cell threshold, at least 2 (a cell of one patient is that patient)."""

    @field_validator("k_cell")
    @classmethod
    def _k_cell_floor(cls, value: int | None) -> int | None:
        if value is not None and value < MIN_K_CELL:
            raise ValueError(
                f"k_cell must be at least {MIN_K_CELL}: a cell of one patient is that "
                "patient's values, and k_cell = 1 would switch the cell rules and the "
                "differencing guard off"
            )
        return value

    require_privacy: bool = False
    max_guard_entries: Annotated[int, Field(ge=1)] = DisclosurePolicy.max_guard_entries
    """The most row sets and columns the differencing guard remembers; once full, exact
    requests that need a new entry are refused (nothing is forgotten)."""
    protocol: Path | None = None
    """The protocol the site's privacy officer approved (TOML); exact requests outside it
    are refused."""
    protocol_sha256: Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")] | None = None
    """The SHA-256 of the protocol text the privacy officer approved; a protocol file with
    another digest is refused (``fedstats site protocol`` prints it)."""
    verified_paths: bool = True
    """Answer an exact iterative fit only at points the site re-derives from the signed
    replies of every site (:mod:`fedstats.site.verified_paths`; on by default); needs
    ``[secure_aggregation]``'s roster and signing key, which sign and check the replies.
    ``false`` lets the coordinator choose the coefficients of the site's exact answers: the
    compliance report warns of it on page 1."""

    _paths = field_validator("protocol", mode="before")(resolve_path)

    def policy(self) -> DisclosurePolicy:
        """The :class:`~fedstats.site.disclosure.DisclosurePolicy` these settings give."""
        return DisclosurePolicy(
            min_count=self.min_count,
            k_cell=self.k_cell,
            require_privacy=self.require_privacy,
            max_guard_entries=self.max_guard_entries,
        )


class SecureAggregationSection(BaseModel):
    """``[secure_aggregation]``: the roster this site pins and its own signing key.

    ``roster`` lists the study's sites and their signing public keys (issued by
    the study PKI); a session whose roster or keys differ is refused.
    ``require``: answer patient-level tasks only inside secure aggregation.
    """

    model_config = STRICT
    roster: Path
    signing_key: Path
    require: bool = False

    _paths = field_validator("roster", "signing_key", mode="before")(resolve_path)


class PrivacySection(BaseModel):
    """``[privacy]``: the site's own ledger (budgets are set in it by the privacy officer)."""

    model_config = STRICT
    ledger: Path

    _paths = field_validator("ledger", mode="before")(resolve_path)


class CoordinatorSection(BaseModel):
    """``[coordinator]``: where the study's SuperLink is and how to reach it safely."""

    model_config = STRICT
    superlink: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$")]
    insecure: bool = False
    root_certificates: Path | None = None
    auth_private_key: Path | None = None
    enrolment: Path | None = None
    """The study's enrolment list (signed by the study CA, ``root_certificates``): the site
    serves only if it binds this site's name to the key of ``auth_private_key``."""
    node_port: Annotated[int, Field(ge=1024, le=65535)] = 9094
    connect_timeout: Annotated[float, Field(gt=0, le=86400)] = 60.0
    serve_timeout: Annotated[float, Field(gt=0, le=7 * 86400)] = 3600.0
    idle_timeout: Annotated[float, Field(gt=0, le=86400)] = 300.0
    """``fedstats site run`` stops serving this long after the last request it answered."""

    _paths = field_validator("root_certificates", "auth_private_key", "enrolment", mode="before")(
        resolve_path
    )

    @model_validator(mode="after")
    def _tls(self) -> CoordinatorSection:
        if not self.insecure and self.root_certificates is None:
            raise ValueError(
                "give root_certificates (the study CA) for TLS, or insecure = true on a test bench"
            )
        if self.insecure and self.auth_private_key is not None:
            raise ValueError("node authentication (auth_private_key) needs TLS: drop insecure")
        if self.enrolment is not None and self.auth_private_key is None:
            raise ValueError(
                "enrolment binds the site to its node key: give auth_private_key (node.key)"
            )
        return self


class SiteConfig(BaseModel):
    """The whole ``site.toml``."""

    model_config = STRICT
    site: SiteSection
    data: DataSection
    privacy: PrivacySection
    disclosure: DisclosureSection = DisclosureSection()
    secure_aggregation: SecureAggregationSection | None = None
    coordinator: CoordinatorSection | None = None

    @model_validator(mode="after")
    def _paths_need_keys(self) -> SiteConfig:
        if self.disclosure.verified_paths and self.secure_aggregation is None:
            raise ValueError(
                "disclosure.verified_paths (on by default) needs [secure_aggregation] roster "
                "and signing_key: the replies a site checks are signed with the study's keys "
                "(python -m fedstats.flower.study_pki roster writes the roster; the node key "
                "signs). A site that lets the coordinator choose its exact answers' "
                "coefficients says verified_paths = false, and the compliance report warns "
                "of it on page 1"
            )
        return self

    @property
    def name(self) -> str:
        return self.site.name

    @property
    def workdir(self) -> Path:
        return self.site.workdir


def load_site_config(path: str | Path) -> SiteConfig:
    """Read and validate ``site.toml``; a ``ConfigError`` names the field."""
    return load_toml_model(path, SiteConfig, what="site configuration")
