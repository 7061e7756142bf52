"""A site keeps the linkages it accepted in its working folder and reads them back.

Oracle: the store's own in-memory behaviour (what a store that never restarted accepts or
refuses); each case restarts the store on the same folder and checks it behaves the same,
that the files hold no more than pair ids and the site's own patient ids, are the site
user's only, and cannot be steered outside the folder by a linkage id.
"""

from __future__ import annotations

import json
import logging
import stat

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedstats.errors import DisclosureError
from fedstats.site.disclosure import DisclosurePolicy
from fedstats.site.linked_rows import LinkageStore, LinkedRows, linkage_file

POLICY = DisclosurePolicy()
FRAME = pd.DataFrame({"x": np.arange(60.0)}, index=[f"P{i}" for i in range(60)])


def rows(linkage_id: str, patients: list[int], seed: int = 0) -> LinkedRows:
    pair_ids = np.sort(np.random.default_rng(seed).choice(10_000, len(patients), replace=False))
    return LinkedRows(linkage_id, pair_ids, FRAME.index[patients].to_numpy())


def test_a_linkage_accepted_before_a_restart_is_held_after_it(tmp_path):
    first = LinkageStore("hospital", FRAME, POLICY, folder=tmp_path)
    accepted = rows("L1", list(range(40)))
    first.accept(accepted)
    path = linkage_file(tmp_path, "L1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert set(json.loads(path.read_text())) == {"linkage_id", "pair_ids", "patients"}
    again = LinkageStore("hospital", FRAME, POLICY, folder=tmp_path)
    held, positions = again.rows("L1")
    np.testing.assert_array_equal(held.pair_ids, accepted.pair_ids)
    np.testing.assert_array_equal(held.patients, accepted.patients)
    np.testing.assert_array_equal(positions, np.arange(40))


def test_the_differencing_rule_sees_every_linkage_accepted_in_earlier_runs(tmp_path):
    LinkageStore("hospital", FRAME, POLICY, folder=tmp_path).accept(rows("L1", list(range(40))))
    restarted = LinkageStore("hospital", FRAME, POLICY, folder=tmp_path)
    with pytest.raises(DisclosureError) as caught:
        restarted.accept(rows("L2", list(range(39)), seed=1))  # one patient away
    assert caught.value.rule == "differencing"
    assert not linkage_file(tmp_path, "L2").exists()  # a refused linkage is never kept


@settings(max_examples=30, deadline=None)
@given(linkage_id=st.text(min_size=1, max_size=64))
def test_no_linkage_id_names_a_file_outside_the_folder(tmp_path_factory, linkage_id):
    folder = tmp_path_factory.mktemp("kept")
    LinkageStore("hospital", FRAME, POLICY, folder=folder).accept(rows(linkage_id, list(range(30))))
    assert [p.parent for p in folder.rglob("*") if p.is_file()] == [folder]
    assert LinkageStore("hospital", FRAME, POLICY, folder=folder).rows(linkage_id)[0].n_pairs == 30


def test_a_kept_linkage_no_longer_fitting_the_frame_is_not_loaded_and_named(tmp_path, caplog):
    LinkageStore("hospital", FRAME, POLICY, folder=tmp_path).accept(rows("L1", list(range(40))))
    smaller = FRAME.drop(index=["P3"])  # the sources changed: a linked patient left
    with caplog.at_level(logging.WARNING):
        restarted = LinkageStore("hospital", smaller, POLICY, folder=tmp_path)
    assert "L1" not in restarted
    assert linkage_file(tmp_path, "L1").name in caplog.text and "link again" in caplog.text


def test_a_kept_file_under_another_linkages_name_is_not_loaded(tmp_path, caplog):
    LinkageStore("hospital", FRAME, POLICY, folder=tmp_path).accept(rows("L1", list(range(40))))
    linkage_file(tmp_path, "L1").rename(linkage_file(tmp_path, "L9"))
    with caplog.at_level(logging.WARNING):
        restarted = LinkageStore("hospital", FRAME, POLICY, folder=tmp_path)
    assert "L1" not in restarted and "L9" not in restarted
    assert "not its linkage id" in caplog.text
