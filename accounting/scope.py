"""A scope: whose privacy a budget protects, held by whom, for which study.

A scope is the key of a budget in a ledger. Its identity is ``(unit, owner,
study)``; the neighbouring relation is part of its definition, fixed when the
budget is first set, and checked on every charge (two budgets for the same
people under two relations would double their privacy loss).

* ``unit="patient"``: record-level privacy, enforced by a site's own ledger
  (``owner`` is the site).
* ``unit="site"``: client-level privacy, enforced by the coordinator's ledger
  (``owner`` is the coordinator or federation).
"""

from __future__ import annotations

import dataclasses
import unicodedata

from accounting.errors import InvalidScope
from accounting.units import Neighbouring, PrivacyUnit

_MAX_NAME = 200


def _check_name(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise InvalidScope(f"scope {field} must be a string, got {type(value).__name__}")
    if not value.strip() or value != value.strip():
        raise InvalidScope(
            f"scope {field} must be non-empty without surrounding spaces, got {value!r}"
        )
    if len(value) > _MAX_NAME:
        raise InvalidScope(f"scope {field} is longer than {_MAX_NAME} characters: {value[:40]!r}")
    if any(unicodedata.category(ch).startswith("C") for ch in value):
        raise InvalidScope(f"scope {field} contains control characters: {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Scope:
    """The unit of privacy, the budget holder and the study of one budget.

    Parameters
    ----------
    unit:
        ``"patient"`` (record-level) or ``"site"`` (client-level); a
        :class:`~accounting.units.PrivacyUnit` is accepted and stored as its value.
    owner:
        Who holds and enforces the budget: the site's name, or the coordinator's.
    study:
        The study the budget is approved for.
    neighbouring:
        ``"add_or_remove_one"`` (default) or ``"replace_one"``; a
        :class:`~accounting.units.Neighbouring` is accepted and stored as its key.

    Raises
    ------
    InvalidScope
        For an unknown unit or relation, or an empty / non-string owner or study.
    """

    unit: str
    owner: str
    study: str
    neighbouring: str = Neighbouring.ADD_OR_REMOVE_ONE.key

    def __post_init__(self) -> None:
        try:
            unit = PrivacyUnit(self.unit.value if isinstance(self.unit, PrivacyUnit) else self.unit)
        except ValueError:
            choices = ", ".join(repr(u.value) for u in PrivacyUnit)
            raise InvalidScope(
                f"unknown unit of privacy {self.unit!r}; choose one of {choices}"
            ) from None
        try:
            relation = Neighbouring.parse(self.neighbouring)
        except ValueError as error:
            raise InvalidScope(str(error)) from None
        object.__setattr__(self, "unit", unit.value)
        object.__setattr__(self, "neighbouring", relation.key)
        _check_name("owner", self.owner)
        _check_name("study", self.study)

    @property
    def privacy_unit(self) -> PrivacyUnit:
        return PrivacyUnit(self.unit)

    @property
    def relation(self) -> Neighbouring:
        return Neighbouring.parse(self.neighbouring)

    @property
    def level(self) -> str:
        """``"record-level"`` or ``"client-level"``."""
        return self.privacy_unit.level

    def describe(self) -> str:
        """Plain English, e.g. for a report.

        E.g. "record-level privacy of each patient, budget held by site_a for study s1;
        neighbouring datasets differing by adding or removing one patient".
        """
        return (
            f"{self.level} privacy of each {self.unit}, budget held by {self.owner} "
            f"for study {self.study}; neighbouring {self.relation.describe(self.privacy_unit)}"
        )

    def __str__(self) -> str:
        return (
            f"scope (unit={self.unit}, owner={self.owner}, study={self.study}, "
            f"neighbouring={self.neighbouring})"
        )
