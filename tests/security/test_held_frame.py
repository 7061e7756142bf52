"""A site holds its own read-only copy of its frame, and the guard remembers its columns by
reference (:mod:`fedstats.site.frame_layout`).

The attack: the differencing guard remembers a column the site answered about by
reference to the frame's array, to save a copy per design. If that array could change
after the answer, the remembered column would change with it: an owner's edit of one
patient's value (or any writer holding the array) would leave the guard comparing the
new column with itself, and the coordinator's next request for the column would be
answered as a copy, giving the one patient's change by subtraction. So the site copies
the frame it is given, marks the arrays read-only, and keeps by reference only what no
array can write; a column a formula computes is remembered as the guard's own copy.
The oracle for "unchanged" is a site built from the frame as it was when answered.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.datasets import heart_disease
from fedstats.errors import DisclosureError
from fedstats.site.differencing import frame_digest
from fedstats.site.frame_layout import held_frame, immutable
from fedstats.site.silo import Silo

ROW = 7


def cleveland() -> pd.DataFrame:
    data = heart_disease().frames["cleveland"].reset_index(drop=True)
    return data.assign(chol=data.chol.astype(float))


def test_the_site_answers_about_its_copy_whatever_the_caller_changes_after():
    data = cleveland()
    before = data.copy()
    silo = Silo("cleveland", data)
    federation = fedstats.Federation({"cleveland": silo.handle})
    data.loc[ROW, "chol"] += 13.0  # the caller's frame, written in place
    data["age"] = data["age"] * 2.0
    fit = fedstats.LogisticRegression("disease ~ chol + age").fit(federation)
    oracle = fedstats.LogisticRegression("disease ~ chol + age").fit(
        fedstats.Federation.in_process({"cleveland": before})
    )
    assert np.array_equal(fit.params, oracle.params) and np.array_equal(fit.bse, oracle.bse)


def test_a_column_edited_in_place_after_an_answer_is_still_refused_as_a_near_copy():
    """The owner changes one patient's cholesterol in place, then asks the site again (a new
    site over the edited frame is another record, :func:`frame_digest`): the guard of the
    site that answered still holds the values it answered about, so the first patient's
    change is refused when the coordinator asks for it as a separate column."""
    data = cleveland()
    silo = Silo("cleveland", data)
    federation = fedstats.Federation({"cleveland": silo.handle})
    fedstats.LogisticRegression("disease ~ chol").fit(federation)
    held = silo._context.frame
    with pytest.raises(ValueError, match="read-only"):
        held["chol"].to_numpy()[ROW] = 0.0  # nothing at the site can write its columns
    data.loc[ROW, "chol"] += 13.0
    remembered = [c for group in silo._context.guard._answered.values() for c in group]
    assert any(np.array_equal(c, held["chol"].to_numpy()) for c in remembered)
    assert not any(np.array_equal(c, data["chol"].to_numpy()) for c in remembered)
    edited = held.assign(chol_edit=data["chol"])  # the edit, put to the same site's guard
    silo._context.frame = held_frame(edited)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("disease ~ chol_edit").fit(federation)
    assert info.value.rule == "differencing"


def test_the_held_frame_is_contiguous_read_only_and_hashes_as_given():
    rng = np.random.default_rng(0)
    given = pd.DataFrame(rng.normal(size=(500, 6)), columns=list("abcdef"))  # strided columns
    given["sex"] = rng.choice(["f", "m"], 500)
    given["n"] = rng.integers(0, 9, 500)
    assert not given["a"].to_numpy().flags.c_contiguous
    held = held_frame(given)
    for name in "abcdefn":
        values = held[name].to_numpy()
        assert values.flags.c_contiguous and immutable(values)
        assert not np.shares_memory(values, given[name].to_numpy())
    given.attrs["fingerprint"] = {"columns": {"a": "mm[Hg]"}}  # what harmonize declares
    held = held_frame(given)
    pd.testing.assert_frame_equal(held, given)
    assert frame_digest(held) == frame_digest(given)
    assert held.attrs == given.attrs and held.attrs is not given.attrs
    given.loc[0, "a"] = 99.0  # the caller's frame stays writable
    assert held.loc[0, "a"] != 99.0


def test_the_guard_keeps_frame_columns_by_reference_and_computed_ones_as_copies():
    """No copy per design of a column the site holds; a formula's column (its own fresh
    array, which the design could still reach) is copied, as before."""
    silo = Silo("cleveland", cleveland())
    federation = fedstats.Federation({"cleveland": silo.handle})
    fedstats.LogisticRegression("disease ~ chol + I(chol ** 2)").fit(federation)
    held = silo._context.frame["chol"].to_numpy()
    remembered = [c for group in silo._context.guard._answered.values() for c in group]
    assert len(remembered) == 2
    by_reference = [np.shares_memory(c, held) for c in remembered]
    assert sorted(by_reference) == [False, True]
    assert all(not c.flags.writeable and immutable(c) for c in remembered)
