"""Units of privacy and neighbouring relations map onto dp_accounting's."""

from __future__ import annotations

import dp_accounting
import pytest

from accounting import Neighbouring, PrivacyUnit


@pytest.mark.parametrize("relation", list(Neighbouring))
def test_relations_are_dp_accountings(relation):
    theirs = relation.to_dp_accounting()
    assert isinstance(theirs, dp_accounting.NeighboringRelation)
    assert theirs.name == relation.name
    # the RDP accountant accepts the relation it will be given
    accountant = dp_accounting.rdp.RdpAccountant(neighboring_relation=theirs)
    accountant.compose(dp_accounting.GaussianDpEvent(1.0))
    assert accountant.get_epsilon(1e-6) > 0


def test_levels_and_descriptions():
    assert PrivacyUnit.PATIENT.level == "record-level"
    assert PrivacyUnit.SITE.level == "client-level"
    assert (
        Neighbouring.ADD_OR_REMOVE_ONE.describe(PrivacyUnit.PATIENT)
        == "datasets differing by adding or removing one patient"
    )
    assert (
        Neighbouring.REPLACE_ONE.describe(PrivacyUnit.SITE)
        == "datasets differing by replacing one site"
    )


@pytest.mark.parametrize(
    ("text", "relation"),
    [
        ("add_or_remove_one", Neighbouring.ADD_OR_REMOVE_ONE),
        ("add or remove one", Neighbouring.ADD_OR_REMOVE_ONE),
        ("add-or-remove-one", Neighbouring.ADD_OR_REMOVE_ONE),
        ("REPLACE_ONE", Neighbouring.REPLACE_ONE),
        ("replace one", Neighbouring.REPLACE_ONE),
        (Neighbouring.REPLACE_ONE, Neighbouring.REPLACE_ONE),
    ],
)
def test_relations_parse_from_their_names(text, relation):
    assert Neighbouring.parse(text) is relation
    assert Neighbouring.parse(relation.key) is relation


@pytest.mark.parametrize("text", ["replace_special", "swap", "", None, 1])
def test_unknown_relations_are_refused(text):
    with pytest.raises(ValueError, match="add_or_remove_one"):
        Neighbouring.parse(text)
