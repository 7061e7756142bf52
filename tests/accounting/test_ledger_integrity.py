"""A ledger recomputes its scopes from their hash-chained entries and refuses to charge a
scope whose stored state (curve, epsilon, count, head, budget) disagrees with them.

The attacks are those of a site administrator with write access to the SQLite file:
resetting the scope's cached curve to buy a second budget, deleting every entry and
resetting the scope row to the genesis head, and arbitrary edits of any row.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accounting
from accounting import Scope
from accounting.chain import genesis_hash

SITE = Scope(unit="patient", owner="site_a", study="s1")
OTHER = Scope(unit="patient", owner="site_a", study="s2")
ROUND = dp_accounting.GaussianDpEvent(5.0)
CHARGES = 24


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def budget_for(charges: int, delta: float = 1e-6) -> float:
    """An epsilon budget that ``charges`` rounds fit and one more does not."""
    fits = accounting.rdp_epsilon([ROUND] * charges, delta)
    more = accounting.rdp_epsilon([ROUND] * (charges + 1), delta)
    return (fits + more) / 2


def fill(path: Path, charges: int = CHARGES) -> None:
    """A ledger whose scope SITE spent its whole budget on ``charges`` rounds."""
    with accounting.Ledger(path) as ledger:
        ledger.set_budget(SITE, epsilon=budget_for(charges), delta=1e-6)
        ledger.set_budget(OTHER, epsilon=10.0, delta=1e-6)
        for i in range(charges):
            ledger.charge(SITE, ROUND, note=f"round {i}", task="t")
        ledger.charge(OTHER, ROUND, note="other study")
        with pytest.raises(accounting.BudgetExceeded):
            ledger.charge(SITE, ROUND)


def reset_curve(conn: sqlite3.Connection) -> None:
    """The first attack: the scope's cached curve and spent epsilon set back to zero."""
    (blob,) = conn.execute("SELECT rdp FROM scopes WHERE study = 's1'").fetchone()
    zeros = np.zeros(len(np.frombuffer(blob, dtype="<f8")), dtype="<f8").tobytes()
    conn.execute("UPDATE scopes SET rdp = ?, epsilon = 0.0 WHERE study = 's1'", (zeros,))


def rewrite_to_genesis(conn: sqlite3.Connection) -> None:
    """The second attack: every entry of the scope deleted, its row reset to genesis."""
    reset_curve(conn)
    (sid,) = conn.execute("SELECT id FROM scopes WHERE study = 's1'").fetchone()
    conn.execute("DELETE FROM entries WHERE scope_id = ?", (sid,))
    conn.execute(
        "UPDATE scopes SET entries = 0, last_hash = ? WHERE id = ?", (genesis_hash(SITE), sid)
    )


def charges_through(ledger: accounting.Ledger, limit: int = 2 * CHARGES) -> int:
    """How many more rounds the ledger lets through (stops at the first refusal)."""
    for done in range(limit):
        try:
            ledger.charge(SITE, ROUND)
        except accounting.BudgetExceeded:
            return done
    return limit


@pytest.fixture
def path(tmp_path):
    path = tmp_path / "site_a.ledger"
    fill(path)
    return path


def test_a_hand_reset_curve_is_refused_before_the_next_charge(path):
    """The attack on main let 24 more rounds through (48 against a budget for 24)."""
    with accounting.Ledger(path) as ledger:  # open before the edit: caught at the charge
        with raw(path) as conn:
            reset_curve(conn)
        with pytest.raises(accounting.LedgerIntegrityError, match="RDP curve") as refused:
            charges_through(ledger)
        assert refused.value.scope == SITE
        assert ledger.spent(SITE).entries == CHARGES  # nothing was charged
    with accounting.Ledger(path) as ledger:  # opened after the edit: caught at open
        assert ledger.integrity_problems()[SITE]
        assert ledger.integrity_problems()[OTHER] == ()
        with pytest.raises(accounting.LedgerIntegrityError, match="site_a"):
            ledger.charge(SITE, ROUND)
        ledger.charge(OTHER, ROUND)  # a scope that verifies is still served
        assert not ledger.verify().ok


def test_a_rewrite_to_the_genesis_head_is_detected_at_open(path):
    """Deleting every entry and resetting the row to genesis passed verify() on main, and
    the budget started again."""
    with raw(path) as conn:
        rewrite_to_genesis(conn)
    with accounting.Ledger(path) as ledger:
        assert any("id counter" in p for p in ledger.integrity_problems()[SITE])
        with pytest.raises(accounting.LedgerIntegrityError, match="deleted"):
            ledger.charge(SITE, ROUND)
        report = ledger.verify()
        assert not report.ok
        assert any("entries were deleted" in p for p in report.problems)


def test_a_rewrite_that_also_resets_the_id_counter_is_caught_by_a_recorded_head(path):
    """The limit of what a file can say about itself: an editor who also rewrites SQLite's
    id counter leaves a ledger consistent with itself. Only a head recorded outside the
    file shows the rewrite (the site's run records, its replies, the study record)."""
    with accounting.Ledger(path) as ledger:
        recorded = ledger.heads()
    assert {h.scope: h.entries for h in recorded} == {SITE: CHARGES, OTHER: 1}
    with raw(path) as conn:
        rewrite_to_genesis(conn)
        (count,) = conn.execute("SELECT COUNT(*) FROM entries").fetchone()
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'entries'", (count,))
        # renumber what is left, so the ids are 1..count again
        ids = [r[0] for r in conn.execute("SELECT id FROM entries ORDER BY id").fetchall()]
        for new, old in enumerate(ids, start=1):
            conn.execute("UPDATE entries SET id = ? WHERE id = ?", (new, old))
    with accounting.Ledger(path) as ledger:
        assert ledger.verify().ok  # consistent with itself
        assert ledger.rewritten_since(recorded[1]) is None  # the other scope is intact
        problem = ledger.rewritten_since(recorded[0])
        assert problem is not None and "fewer than the 24 recorded" in problem
        with pytest.raises(accounting.LedgerRewritten, match="run record 7"):
            ledger.check_extends(recorded, where="run record 7")


def test_a_consistent_history_extends_every_head_recorded_before(tmp_path):
    path = tmp_path / "l.ledger"
    with accounting.Ledger(path) as ledger:
        ledger.set_budget(SITE, epsilon=50.0, delta=1e-6)
        heads = [ledger.heads()[0]]
        for _ in range(3):
            ledger.charge(SITE, ROUND)
            heads.append(ledger.heads()[0])
        assert [h.entries for h in heads] == [0, 1, 2, 3]
        assert heads[0].head == genesis_hash(SITE)
        ledger.check_extends(heads, where="test")
        record = heads[2].to_record()
        assert accounting.ChainHead.from_record(record) == heads[2]
        forged = accounting.ChainHead(SITE, 2, heads[1].head)
        assert "does not have the recorded hash" in ledger.rewritten_since(forged)


def test_charges_from_another_process_are_walked_not_refused(tmp_path):
    """Two ledger objects on one file (two processes): each verifies what the other added."""
    path = tmp_path / "l.ledger"
    with accounting.Ledger(path) as first, accounting.Ledger(path) as second:
        first.set_budget(SITE, epsilon=50.0, delta=1e-6)
        for _ in range(3):
            first.charge(SITE, ROUND)
            second.charge(SITE, ROUND)
        second.set_budget(SITE, epsilon=60.0, delta=1e-5)
        first.charge(SITE, ROUND)
        assert first.spent(SITE).entries == 7
        with raw(path) as conn:
            conn.execute("DELETE FROM entries WHERE seq = 7")
            conn.execute("UPDATE scopes SET entries = 6")
        with pytest.raises(accounting.LedgerIntegrityError):
            second.charge(SITE, ROUND)


# -- any edit of any row -------------------------------------------------------------

FLOATS = st.floats(min_value=0.0, max_value=1e3, allow_nan=False)


SCOPE_EDITS = st.one_of(
    st.tuples(st.just("scope"), st.just("rdp"), st.lists(FLOATS, min_size=1, max_size=4)),
    st.tuples(st.just("scope"), st.just("epsilon"), FLOATS),
    st.tuples(st.just("scope"), st.just("entries"), st.integers(0, 30)),
    st.tuples(st.just("scope"), st.just("last_hash"), st.sampled_from(["genesis", "0" * 64])),
    st.tuples(st.just("scope"), st.just("budget_epsilon"), st.floats(1e-3, 1e3)),
)
EDITS = st.one_of(
    SCOPE_EDITS,
    st.tuples(
        st.just("entry"),
        st.sampled_from(["epsilon", "epsilon_after", "delta"]),
        st.tuples(st.integers(1, CHARGES), FLOATS),
    ),
    st.tuples(
        st.just("entry"),
        st.sampled_from(["note", "task", "event_json", "entry_hash", "prev_hash", "created_at"]),
        st.tuples(st.integers(1, CHARGES), st.text(max_size=20)),
    ),
    st.tuples(
        st.just("entry"),
        st.just("seq"),
        st.tuples(st.integers(1, CHARGES), st.integers(-(2**63), 2**63 - 1)),  # SQLite INTEGER
    ),
    st.tuples(st.just("delete"), st.just(""), st.integers(1, CHARGES)),
)


def apply_edit(conn: sqlite3.Connection, edit) -> bool:
    """Apply one edit to scope SITE or one of its entries; False if it changed nothing."""
    table, column, value = edit
    (sid,) = conn.execute("SELECT id FROM scopes WHERE study = 's1'").fetchone()
    if table == "delete":
        return (
            conn.execute(
                "DELETE FROM entries WHERE scope_id = ? AND seq = ?", (sid, value)
            ).rowcount
            > 0
        )
    if table == "scope":
        (old,) = conn.execute(f"SELECT {column} FROM scopes WHERE id = ?", (sid,)).fetchone()
        if column == "rdp":
            stored = np.frombuffer(old, dtype="<f8")
            new = stored.copy()
            new[: len(value)] = value
            value = new.astype("<f8").tobytes()
        elif column == "last_hash" and value == "genesis":
            value = genesis_hash(SITE)
        if value == old:
            return False
        conn.execute(f"UPDATE scopes SET {column} = ? WHERE id = ?", (value, sid))
        return True
    seq, new = value
    (old,) = conn.execute(
        f"SELECT {column} FROM entries WHERE scope_id = ? AND seq = ?", (sid, seq)
    ).fetchone()
    if new == old:
        return False
    try:
        conn.execute(
            f"UPDATE entries SET {column} = ? WHERE scope_id = ? AND seq = ?", (new, sid, seq)
        )
    except sqlite3.IntegrityError:  # a duplicate sequence number: the file refuses it
        return False
    return True


@pytest.fixture(scope="module")
def filled(tmp_path_factory):
    path = tmp_path_factory.mktemp("base") / "base.ledger"
    fill(path)
    return path


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edit=EDITS)
def test_any_edit_of_a_scope_or_its_entries_is_refused_at_open(filled, edit):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "edited.ledger"
        shutil.copy(filled, path)
        with raw(path) as conn:
            changed = apply_edit(conn, edit)
        with accounting.Ledger(path) as ledger:
            if not changed:
                assert ledger.integrity_problems()[SITE] == ()
                return
            assert ledger.integrity_problems()[SITE], edit
            with pytest.raises(accounting.LedgerIntegrityError):
                ledger.charge(SITE, ROUND)
            if edit[0] == "delete":  # the file's id counter shows a deletion: every scope
                with pytest.raises(accounting.LedgerIntegrityError, match="id counter"):
                    ledger.charge(OTHER, ROUND)
            else:  # a scope that verifies is still served
                ledger.charge(OTHER, ROUND)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(edit=SCOPE_EDITS)
def test_an_edit_of_the_scope_row_under_an_open_ledger_is_refused_at_the_next_charge(filled, edit):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "edited.ledger"
        shutil.copy(filled, path)
        with accounting.Ledger(path) as ledger:
            with raw(path) as conn:
                changed = apply_edit(conn, edit)
            if not changed:
                return
            with pytest.raises(accounting.LedgerIntegrityError):
                ledger.charge(SITE, ROUND)


@pytest.mark.parametrize("seq", [10**9, 2**62])
def test_a_huge_sequence_number_is_refused_at_open_without_exhausting_memory(filled, seq):
    """An entry renumbered far beyond the others is listed as a gap in O(entries), not by
    enumerating every number up to it (which took the process down: a denial of service by
    one edited integer)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "edited.ledger"
        shutil.copy(filled, path)
        with raw(path) as conn:
            assert apply_edit(conn, ("entry", "seq", (3, seq)))
        with accounting.Ledger(path) as ledger:
            assert any("missing 3" in p for p in ledger.integrity_problems()[SITE])
            with pytest.raises(accounting.LedgerIntegrityError):
                ledger.charge(SITE, ROUND)
