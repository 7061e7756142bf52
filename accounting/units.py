"""The unit of privacy and the neighbouring relation, explicit on every budget.

* ``PrivacyUnit.PATIENT``: record-level privacy at one site; the analysis
  frame holds one row per patient, so one record is one patient (group
  privacy would otherwise scale epsilon with records per patient, Vadhan
  2017, Lemma 2.2).
* ``PrivacyUnit.SITE``: client-level privacy across a federation (McMahan et
  al., ICLR 2018): neighbouring federations differ in one site's data.
* ``Neighbouring.ADD_OR_REMOVE_ONE`` (the default) and ``REPLACE_ONE`` are
  ``dp_accounting.NeighboringRelation``'s relations of the same names.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import dp_accounting


class PrivacyUnit(enum.Enum):
    PATIENT = "patient"
    SITE = "site"

    @property
    def level(self) -> str:
        return "record-level" if self is PrivacyUnit.PATIENT else "client-level"


class Neighbouring(enum.Enum):
    ADD_OR_REMOVE_ONE = "add or remove one"
    REPLACE_ONE = "replace one"

    @classmethod
    def parse(cls, value: Neighbouring | str) -> Neighbouring:
        """The relation named by ``value``: a member, its key or its value.

        Accepts ``"add_or_remove_one"``, ``"add or remove one"``, ``"replace_one"``,
        ``"replace one"`` (any case) and members; anything else raises ``ValueError``.
        """
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            name = value.strip().upper().replace(" ", "_").replace("-", "_")
            if name in cls.__members__:
                return cls[name]
        choices = ", ".join(repr(member.key) for member in cls)
        raise ValueError(f"unknown neighbouring relation {value!r}; choose one of {choices}")

    @property
    def key(self) -> str:
        """The relation's identifier, e.g. ``"add_or_remove_one"``, as stored in ledgers."""
        return self.name.lower()

    def to_dp_accounting(self) -> dp_accounting.NeighboringRelation:
        from dp_accounting import NeighboringRelation

        return NeighboringRelation[self.name]

    def describe(self, unit: PrivacyUnit) -> str:
        """E.g. 'datasets differing by adding or removing one patient'."""
        verb = "adding or removing" if self is Neighbouring.ADD_OR_REMOVE_ONE else "replacing"
        return f"datasets differing by {verb} one {unit.value}"
