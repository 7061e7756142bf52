"""The coordinator's study configuration (``study.toml`` for ``fedstats study run``).

It names the study, the sites expected, the fits to make, where the SuperLink
is and what to do when a site is lost. Relative paths are read relative to
the file. Example in ``examples/flower/study.toml``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from fedstats.toml_config import load_toml_model

_STRICT = ConfigDict(extra="forbid", strict=True, frozen=True)
Name = Annotated[str, Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9_.-]+$")]


def _resolve(value: object, info: ValidationInfo) -> object:
    if not isinstance(value, str):
        return value
    path = Path(value)
    base = (info.context or {}).get("base")
    return path if path.is_absolute() or base is None else Path(base) / path


class StudySection(BaseModel):
    """``[study]``: name, expected sites and the output folder."""

    model_config = _STRICT
    name: Name
    sites: Annotated[list[Name], Field(min_length=1)]
    out: Path

    _paths = field_validator("out", mode="before")(_resolve)

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

    model_config = _STRICT
    round_timeout: Annotated[float, Field(gt=0, le=86400)] = 120.0
    on_site_lost: Literal["retry", "abort"] = "abort"
    retries: Annotated[int, Field(ge=0, le=100)] = 2
    discovery_timeout: Annotated[float, Field(gt=0, le=86400)] = 300.0
    poll_interval: Annotated[float, Field(ge=0.001, le=10)] = 0.01


class CoordinatorSection(BaseModel):
    """``[coordinator]``: how ``fedstats study run`` reaches the SuperLink's control API."""

    model_config = _STRICT
    superlink: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.:\[\]-]+:[0-9]{1,5}$")]
    insecure: bool = False
    root_certificates: Path | None = None
    run_timeout: Annotated[float, Field(gt=0, le=7 * 86400)] = 3600.0

    _paths = field_validator("root_certificates", mode="before")(_resolve)

    @model_validator(mode="after")
    def _tls(self) -> CoordinatorSection:
        if not self.insecure and self.root_certificates is None:
            raise ValueError("give root_certificates (the study CA), or insecure = true")
        return self


class LogisticFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``logistic``."""

    model_config = _STRICT
    kind: Literal["logistic"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    site_intercepts: bool = False


class CoxFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``cox`` (stratified by site unless ``strata = "none"``)."""

    model_config = _STRICT
    kind: Literal["cox"]
    name: Name
    formula: Annotated[str, Field(min_length=3)]
    strata: Literal["site"] = "site"
    ties: Literal["efron", "breslow"] = "efron"


class KaplanMeierFit(BaseModel):
    """A ``[[fits]]`` entry of kind ``kaplan_meier`` (grid of ``width`` up to ``horizon``)."""

    model_config = _STRICT
    kind: Literal["kaplan_meier"]
    name: Name
    time: str
    event: str
    width: Annotated[float, Field(gt=0)]
    horizon: Annotated[float, Field(gt=0)]


Fit = Annotated[LogisticFit | CoxFit | KaplanMeierFit, Field(discriminator="kind")]


class StudyConfig(BaseModel):
    """The whole ``study.toml``."""

    model_config = _STRICT
    study: StudySection
    coordinator: CoordinatorSection | None = None
    policy: PolicySection = PolicySection()
    fits: Annotated[list[Fit], Field(min_length=1)]

    @field_validator("fits")
    @classmethod
    def _unique_names(cls, fits: list[Fit]) -> list[Fit]:
        names = [fit.name for fit in fits]
        if len(set(names)) != len(names):
            raise ValueError("fit names must be unique")
        return fits


def load_study_config(path: str | Path) -> StudyConfig:
    """Read and validate ``study.toml``; a ``ConfigError`` names the field."""
    return load_toml_model(path, StudyConfig, what="study configuration")
