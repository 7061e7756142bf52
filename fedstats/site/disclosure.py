"""Statistical disclosure control applied to every reply before it leaves a site.

The rules follow the output checks of DataSHIELD (Gaye et al., Int J
Epidemiol 2014; its ``nfilter`` settings) and the threshold rule of the
ESSnet/SDC handbook (Hundepool et al., 2012):

* threshold rule: an aggregate computed over fewer than ``min_count``
  patients is refused;
* reply shape: a reply must match the schema the task declares from the
  request alone, so its size cannot grow with the number of patients;
* levels: a categorical column may report its levels only if it has at most
  ``max_levels`` of them and at most ``max_level_density`` levels per patient
  (an identifier-like column would otherwise list patients' values);
* saturation: a model may not have more than ``max_parameter_ratio`` design
  columns per patient at a site (a saturated model reproduces rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fedstats.errors import DisclosureError, StudyConfigurationError
from fedstats.schema import ReplySchema, schema_mismatch

DEFAULT_K_CELL = 3
"""The default small-cell threshold (capped by ``min_count``): DataSHIELD's default
``nfilter.tab`` and ``nfilter.subset`` (Gaye et al. 2014), the rule consortia already approve
for exact federated analysis. At 5, the reference heart-disease model could not be fitted at
Cleveland (4 patients with an ST-T abnormality): a site that wants more sets ``k_cell``."""

MIN_K_CELL = 2
"""The floor of ``k_cell``: a cell of one patient is that patient (a count of 1 is a row, and a
difference of designs that isolates one row gives its values), so ``k_cell = 1`` would turn the
cell rules and the differencing guard off. ``min_count = 1`` therefore keeps ``k_cell = 2``."""


@dataclass(frozen=True)
class DisclosurePolicy:
    """A site's disclosure-control settings (defaults suit most clinical studies).

    ``require_privacy``: the site answers aggregate tasks only as charged,
    differentially private releases, and lists no categorical levels; exact
    requests are refused (a privacy officer's "private only" switch).

    ``k_cell``: the small-cell threshold of :mod:`fedstats.site.cell_rules` and
    :mod:`fedstats.site.differencing` (default: 3, or ``min_count`` if smaller, never below
    :data:`MIN_K_CELL` = 2, which is also the least a site may set).
    ``max_rounds_per_analysis`` and ``max_analyses_per_study`` cap the exact
    requests one agreed design may take (a TPR-fairness penalty search takes
    about 750) and how many designs a study may ask a site for.

    ``max_guard_entries``: the most row sets and columns the differencing guard
    (:mod:`fedstats.site.differencing`) remembers for one frame. The guard fails
    closed: once the record is full, an exact request that needs a new entry is
    refused (rule ``guard-full``) and nothing is forgotten. The record takes about
    ``n / 8`` bytes per row set and ``8 n`` bytes per column for a frame of ``n``
    rows (20,000 entries: under 50 MB at 300 rows).
    """

    min_count: int = 10
    k_cell: int | None = None
    max_levels: int = 50
    max_level_density: float = 0.33
    max_parameter_ratio: float = 0.33
    require_privacy: bool = False
    max_rounds_per_analysis: int = 2_000
    max_analyses_per_study: int = 1_000
    max_guard_entries: int = 20_000

    def __post_init__(self) -> None:
        if type(self.min_count) is not int or self.min_count < 1:
            raise StudyConfigurationError(
                f"min_count must be a positive integer, got {self.min_count!r}"
            )
        if self.k_cell is None:
            object.__setattr__(self, "k_cell", max(MIN_K_CELL, min(DEFAULT_K_CELL, self.min_count)))
        if type(self.k_cell) is not int or self.k_cell < MIN_K_CELL:
            raise StudyConfigurationError(
                f"k_cell must be an integer >= {MIN_K_CELL}, got {self.k_cell!r}: a cell of one "
                "patient is that patient's values, and k_cell = 1 would switch the cell rules "
                "and the differencing guard off; set k_cell to 2 or more"
            )
        for name in ("max_rounds_per_analysis", "max_analyses_per_study"):
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise StudyConfigurationError(f"{name} must be a positive integer, got {value!r}")
        if type(self.max_guard_entries) is not int or self.max_guard_entries < 1:
            raise StudyConfigurationError(
                "max_guard_entries (the differencing guard's cap) must be a positive integer, "
                f"got {self.max_guard_entries!r}"
            )
        if type(self.max_levels) is not int or self.max_levels < 2:
            raise StudyConfigurationError(
                f"max_levels must be an integer >= 2, got {self.max_levels!r}"
            )
        for name in ("max_level_density", "max_parameter_ratio"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise StudyConfigurationError(f"{name} must be in (0, 1], got {value!r}")

    def as_record(self) -> dict[str, float | int | bool]:
        """The settings as plain values, for reports and run records."""
        return {
            "min_count": self.min_count,
            "k_cell": self.k_cell,
            "max_levels": self.max_levels,
            "max_level_density": self.max_level_density,
            "max_parameter_ratio": self.max_parameter_ratio,
            "require_privacy": self.require_privacy,
            "max_rounds_per_analysis": self.max_rounds_per_analysis,
            "max_analyses_per_study": self.max_analyses_per_study,
            "max_guard_entries": self.max_guard_entries,
        }


def check_reply(
    policy: DisclosurePolicy,
    *,
    site: str,
    task: str,
    schema: ReplySchema,
    payload: dict,
    contributors: int | None,
    paillier_keys: Any = None,
    identifiers: Any = None,
) -> None:
    """Refuse a reply that breaks the shape or threshold rule (raises :class:`DisclosureError`).

    ``contributors`` is the number of patients behind an aggregate reply, or
    ``None`` for replies that aggregate nothing (e.g. the list of categorical
    levels, which is governed by :func:`check_levels`). ``paillier_keys``: the site's own
    Paillier keys (:class:`fedstats.site.ciphertext_replies.PaillierKeys`), the only keys
    the one reply whose size is the number of patients, a registry's encrypted outcomes,
    may be under (:func:`fedstats.site.ciphertext_replies.check_ciphertexts`).
    ``identifiers``: the site's identifier table and linkage schema
    (:class:`fedstats.site.identifiers.SiteIdentifiers`), the only widths and count the other
    reply whose size is the number of patients, a site's record-linkage encodings, may have
    (:func:`fedstats.site.encoding_replies.check_record_codes`).
    """
    problem = schema_mismatch(payload, schema)
    if problem:
        raise DisclosureError(
            site=site,
            task=task,
            reason=f"the reply does not match the shape declared for the task ({problem})",
            rule="shape",
        )
    from fedstats.site.ciphertext_replies import check_ciphertexts
    from fedstats.site.encoding_replies import check_record_codes

    check_ciphertexts(schema, payload, paillier_keys, site=site, task=task)
    check_record_codes(schema, identifiers, site=site, task=task)
    if contributors is not None and contributors < policy.min_count:
        raise DisclosureError(
            site=site,
            task=task,
            reason=(
                f"the aggregate covers fewer patients than the disclosure threshold of "
                f"{policy.min_count}"
            ),
            rule="threshold",
        )


def check_levels(
    policy: DisclosurePolicy, *, site: str, task: str, column: str, n_levels: int, n_patients: int
) -> None:
    """Refuse to list the levels of an identifier-like or very fine categorical column."""
    if n_levels > policy.max_levels:
        raise DisclosureError(
            site=site,
            task=task,
            reason=(
                f"column {column!r} has {n_levels} levels, more than the limit of "
                f"{policy.max_levels}; group its levels during harmonisation"
            ),
            rule="levels",
        )
    if n_levels > policy.max_level_density * n_patients:
        raise DisclosureError(
            site=site,
            task=task,
            reason=(
                f"column {column!r} has {n_levels} levels for {n_patients} patients (more than "
                f"{policy.max_level_density:g} per patient), so its levels could identify patients"
            ),
            rule="levels",
        )


def check_saturation(
    policy: DisclosurePolicy, *, site: str, task: str, n_parameters: int, n_patients: int
) -> None:
    """Refuse a model with too many parameters for the site's number of patients."""
    if n_parameters > policy.max_parameter_ratio * n_patients:
        raise DisclosureError(
            site=site,
            task=task,
            reason=(
                f"the model has {n_parameters} design columns that vary at this site for "
                f"{n_patients} patients (more than {policy.max_parameter_ratio:g} per patient), "
                "so its aggregates could reproduce individual rows"
            ),
            rule="saturation",
        )
