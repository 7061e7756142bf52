"""The ledger's API and semantics: persistence, refusals, scopes, verification."""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import sqlite3
from pathlib import Path

import dp_accounting
import numpy as np
import pytest
from dp_accounting.rdp import RdpAccountant

import accounting
from accounting import PrivacyUnit, Scope

Gaussian = dp_accounting.GaussianDpEvent
Poisson = dp_accounting.PoissonSampledDpEvent
SelfComposed = dp_accounting.SelfComposedDpEvent

SITE_A = Scope(unit="patient", owner="site_a", study="s1")
STEP = Poisson(0.01, Gaussian(1.1))
ROUND = Gaussian(5.0)


def rdp_reference(events, delta, relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
    accountant = RdpAccountant(neighboring_relation=relation)
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(delta)


def raw(path: Path) -> sqlite3.Connection:
    return sqlite3.connect(path, isolation_level=None)


def file_state(path: Path) -> tuple[str, ...]:
    """sha256 of the database file and its write-ahead log."""
    return tuple(
        hashlib.sha256(p.read_bytes()).hexdigest() if p.exists() else "-"
        for p in (path, Path(f"{path}-wal"))
    )


@pytest.fixture
def path(tmp_path) -> Path:
    return tmp_path / "site_a.ledger"


@pytest.fixture
def ledger(path):
    with accounting.Ledger(path) as opened:
        opened.set_budget(SITE_A, epsilon=3.0, delta=1e-6)
        yield opened


def test_create_and_reopen_persists_budgets_and_entries(path):
    start = datetime.datetime.now(datetime.UTC)
    with accounting.Ledger(path) as ledger:
        assert ledger.path == path
        assert ledger.set_budget(SITE_A, epsilon=3.0, delta=1e-6) == accounting.Budget(3.0, 1e-6)
        charged = [
            ledger.charge(
                SITE_A,
                ROUND,
                note=f"logistic round {i}",
                analysis="logistic-1",
                task="logistic.dp_summaries",
                parameters={"noise_multiplier": 5.0, "clip": 1.0, "round": i},
            )
            for i in range(1, 4)
        ]
        spent = ledger.spent(SITE_A)
    end = datetime.datetime.now(datetime.UTC)

    with accounting.Ledger(path) as reopened:
        assert reopened.budget(SITE_A) == accounting.Budget(3.0, 1e-6)
        assert reopened.scopes() == [SITE_A]
        entries = reopened.entries(SITE_A)
        assert reopened.spent(SITE_A) == spent
        assert reopened.verify().ok

    assert entries == charged
    assert [e.seq for e in entries] == [1, 2, 3]
    assert entries[0].id < entries[1].id < entries[2].id
    version = importlib.metadata.version("fedstats")
    previous = None
    for i, entry in enumerate(entries, start=1):
        assert entry.scope == SITE_A
        assert entry.event == ROUND
        assert accounting.event_from_json(entry.event_json) == ROUND
        assert entry.epsilon_after == pytest.approx(rdp_reference([ROUND] * i, 1e-6), rel=1e-9)
        assert entry.epsilon == pytest.approx(rdp_reference([ROUND], 1e-6), rel=1e-9)
        assert entry.delta == 1e-6
        assert entry.note == f"logistic round {i}"
        assert entry.analysis == "logistic-1"
        assert entry.task == "logistic.dp_summaries"
        assert entry.parameters == {"noise_multiplier": 5.0, "clip": 1.0, "round": i}
        assert entry.created_at.tzinfo is not None
        assert entry.created_at.utcoffset() == datetime.timedelta(0)
        assert start <= entry.created_at <= end
        assert entry.package_version == version
        assert len(entry.entry_hash) == 64
        if previous is not None:
            assert entry.prev_hash == previous.entry_hash
            assert entry.created_at >= previous.created_at
            assert entry.epsilon_after > previous.epsilon_after
        previous = entry
    assert spent.epsilon == entries[-1].epsilon_after
    assert spent.entries == 3
    assert spent.remaining == pytest.approx(3.0 - spent.epsilon)
    assert spent.budget_epsilon == 3.0
    assert spent.delta == 1e-6


def test_keyword_arguments_are_optional(ledger):
    entry = ledger.charge(SITE_A, ROUND)
    assert (entry.note, entry.analysis, entry.task, entry.parameters) == (None, None, None, {})


def test_budget_exceeded_states_the_figures_and_records_nothing(ledger, path):
    while ledger.preview(SITE_A, ROUND).fits:
        ledger.charge(SITE_A, ROUND)
    history = ledger.entries(SITE_A)
    spent = ledger.spent(SITE_A)
    state = file_state(path)
    big = SelfComposed(ROUND, 10)

    with pytest.raises(accounting.BudgetExceeded) as caught:
        ledger.charge(SITE_A, big, note="one round too many")
    error = caught.value

    assert error.scope == SITE_A
    assert error.budget_epsilon == 3.0
    assert error.spent == pytest.approx(spent.epsilon)
    assert error.requested == pytest.approx(rdp_reference([big], 1e-6), rel=1e-9)
    assert error.would_total == pytest.approx(rdp_reference([*[ROUND] * len(history), big], 1e-6))
    assert error.remaining == pytest.approx(3.0 - spent.epsilon)
    message = str(error)
    for figure in (error.spent, error.requested, error.would_total, error.remaining, 3.0):
        assert f"{figure:.6g}" in message
    assert "site_a" in message and "s1" in message
    assert "Nothing was recorded" in message

    assert ledger.entries(SITE_A) == history
    assert ledger.spent(SITE_A) == spent
    assert file_state(path) == state
    with raw(path) as conn:
        assert conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == len(history)
    assert ledger.verify().ok


def test_preview_writes_nothing(ledger, path):
    ledger.charge(SITE_A, ROUND)
    state, entries, spent = file_state(path), ledger.entries(SITE_A), ledger.spent(SITE_A)

    small = ledger.preview(SITE_A, ROUND)
    large = ledger.preview(SITE_A, SelfComposed(ROUND, 1000))

    assert small.epsilon_before == spent.epsilon
    assert small.epsilon_after == pytest.approx(rdp_reference([ROUND, ROUND], 1e-6), rel=1e-9)
    assert small.epsilon_event == pytest.approx(rdp_reference([ROUND], 1e-6), rel=1e-9)
    assert small.budget_epsilon == 3.0
    assert small.fits
    assert not large.fits
    assert large.epsilon_after > 3.0
    assert (file_state(path), ledger.entries(SITE_A), ledger.spent(SITE_A)) == (
        state,
        entries,
        spent,
    )


def test_spent_without_pld_gives_the_same_enforced_figures(ledger):
    for _ in range(3):
        ledger.charge(SITE_A, STEP)
    ledger.charge(SITE_A, ROUND)
    full, quick = ledger.spent(SITE_A), ledger.spent(SITE_A, pld=False)
    assert (
        quick.epsilon
        == full.epsilon
        == pytest.approx(rdp_reference([STEP, STEP, STEP, ROUND], 1e-6), abs=1e-9)
    )
    assert (quick.remaining, quick.entries, quick.budget_epsilon, quick.delta) == (
        full.remaining,
        full.entries,
        full.budget_epsilon,
        full.delta,
    )
    assert full.epsilon_pld is not None and quick.epsilon_pld is None
    assert "not computed" in quick.pld_note


def test_two_scopes_are_independent(ledger):
    s2 = Scope(unit="patient", owner="site_a", study="s2")
    ledger.set_budget(s2, epsilon=1.0, delta=1e-5)
    ledger.charge(SITE_A, ROUND)
    ledger.charge(SITE_A, ROUND)
    assert ledger.spent(s2).epsilon == 0.0
    assert ledger.spent(s2).epsilon_pld == 0.0
    assert ledger.entries(s2) == []
    entry = ledger.charge(s2, ROUND)
    assert entry.seq == 1
    assert entry.epsilon_after == pytest.approx(rdp_reference([ROUND], 1e-5), rel=1e-9)
    assert ledger.spent(SITE_A).entries == 2
    assert ledger.budget(s2) == accounting.Budget(1.0, 1e-5)
    assert ledger.scopes() == [SITE_A, s2]


def test_record_level_and_client_level_scopes(tmp_path):
    record = Scope(unit="patient", owner="coordinator", study="s1")
    client = Scope(unit=PrivacyUnit.SITE, owner="coordinator", study="s1")
    assert client.unit == "site"
    assert record.level == "record-level"
    assert client.level == "client-level"
    assert client.privacy_unit is PrivacyUnit.SITE
    assert "client-level privacy of each site" in client.describe()
    assert "adding or removing one site" in client.describe()
    with accounting.Ledger(tmp_path / "coordinator.ledger") as ledger:
        ledger.set_budget(client, epsilon=8.0, delta=1e-3)
        ledger.set_budget(record, epsilon=2.0, delta=1e-6)
        ledger.charge(client, SelfComposed(Gaussian(3.0), 10))
        assert ledger.spent(record).entries == 0
        assert ledger.spent(client).epsilon == pytest.approx(
            rdp_reference([SelfComposed(Gaussian(3.0), 10)], 1e-3), rel=1e-9
        )
        assert ledger.scopes() == [client, record]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"unit": "record", "owner": "a", "study": "s"},
        {"unit": "patient", "owner": "", "study": "s"},
        {"unit": "patient", "owner": " a", "study": "s"},
        {"unit": "patient", "owner": "a", "study": 3},
        {"unit": "patient", "owner": "a\nb", "study": "s"},
        {"unit": "patient", "owner": "a", "study": "s", "neighbouring": "swap_one"},
    ],
)
def test_invalid_scopes_are_refused(kwargs):
    with pytest.raises(accounting.InvalidScope):
        Scope(**kwargs)


def test_scope_normalises_relation_names():
    assert Scope("patient", "a", "s", "replace one").neighbouring == "replace_one"
    assert Scope("patient", "a", "s", accounting.Neighbouring.REPLACE_ONE) == Scope(
        "patient", "a", "s", "replace_one"
    )
    assert Scope("patient", "a", "s").relation is accounting.Neighbouring.ADD_OR_REMOVE_ONE


def test_unknown_scope(ledger):
    other = Scope(unit="patient", owner="site_a", study="never-approved")
    calls = [
        lambda: ledger.budget(other),
        lambda: ledger.charge(other, ROUND),
        lambda: ledger.preview(other, ROUND),
        lambda: ledger.spent(other),
        lambda: ledger.entries(other),
    ]
    for call in calls:
        with pytest.raises(accounting.UnknownScope) as caught:
            call()
        assert caught.value.scope == other
        assert "never-approved" in str(caught.value)
        assert "set_budget" in str(caught.value)
        assert isinstance(caught.value, accounting.LedgerError)


def test_unsupported_mechanism_is_refused_before_anything_is_written(ledger, path):
    ledger.charge(SITE_A, ROUND)
    state = file_state(path)
    fixed_size = dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, Gaussian(1.0))
    with pytest.raises(accounting.UnsupportedMechanism, match="SampledWithoutReplacementDpEvent"):
        ledger.charge(SITE_A, fixed_size)
    with pytest.raises(accounting.UnsupportedMechanism):
        ledger.preview(SITE_A, fixed_size)
    assert file_state(path) == state
    assert ledger.spent(SITE_A).entries == 1


def test_replace_one_relation_is_recorded_and_used(tmp_path):
    scope = Scope(unit="patient", owner="site_b", study="s1", neighbouring="replace_one")
    fixed_size = SelfComposed(dp_accounting.SampledWithoutReplacementDpEvent(1000, 10, ROUND), 20)
    path = tmp_path / "site_b.ledger"
    with accounting.Ledger(path) as ledger:
        ledger.set_budget(scope, epsilon=5.0, delta=1e-6)
        entry = ledger.charge(scope, fixed_size)
        with pytest.raises(accounting.UnsupportedMechanism, match="replace-one"):
            ledger.charge(scope, STEP)  # Poisson sampling needs add-or-remove
        spent = ledger.spent(scope)
        assert ledger.scopes() == [scope]
        # the same people under another relation would be a second, uncounted budget
        add_remove = Scope(unit="patient", owner="site_b", study="s1")
        with pytest.raises(accounting.ScopeConflict):
            ledger.charge(add_remove, ROUND)
        with pytest.raises(accounting.ScopeConflict):
            ledger.set_budget(add_remove, epsilon=5.0, delta=1e-6)
        assert ledger.verify().ok
    reference = rdp_reference([fixed_size], 1e-6, dp_accounting.NeighboringRelation.REPLACE_ONE)
    assert entry.epsilon_after == pytest.approx(reference, rel=1e-9)
    assert spent.epsilon == pytest.approx(reference, rel=1e-9)
    assert spent.epsilon_pld is None  # dp_accounting's PLD has no fixed-size batches
    assert "PLD" in spent.pld_note and "fixed-size" in spent.pld_note
    with raw(path) as conn:
        assert conn.execute("SELECT neighbouring FROM scopes").fetchone()[0] == "replace_one"


def test_budget_changes_are_recorded(ledger, path):
    ledger.charge(SITE_A, ROUND)
    ledger.set_budget(SITE_A, epsilon=4.0, delta=1e-6)
    ledger.set_budget(SITE_A, epsilon=4.0, delta=1e-6)  # no change, not recorded
    ledger.set_budget(SITE_A, epsilon=4.0, delta=1e-5)
    spent = ledger.spent(SITE_A)
    assert spent.epsilon == pytest.approx(rdp_reference([ROUND], 1e-5), rel=1e-9)
    assert spent.budget_epsilon == 4.0
    with raw(path) as conn:
        history = conn.execute("SELECT epsilon, delta, changed_at FROM budget_history").fetchall()
    assert [(e, d) for e, d, _ in history] == [(3.0, 1e-6), (4.0, 1e-6), (4.0, 1e-5)]
    assert all(datetime.datetime.fromisoformat(at).tzinfo for _, _, at in history)
    with pytest.raises(accounting.InvalidBudget, match="already spent"):
        ledger.set_budget(SITE_A, epsilon=spent.epsilon / 2, delta=1e-5)
    for epsilon, delta in [(0.0, 1e-6), (-1.0, 1e-6), (float("inf"), 1e-6), (1.0, 0.0), (1.0, 1)]:
        with pytest.raises(accounting.InvalidBudget):
            ledger.set_budget(SITE_A, epsilon=epsilon, delta=delta)
    assert ledger.verify().ok


def test_bad_entry_fields_are_refused(ledger):
    with pytest.raises(accounting.InvalidEntry):
        ledger.charge(SITE_A, ROUND, parameters={"x": object()})
    with pytest.raises(accounting.InvalidEntry):
        ledger.charge(SITE_A, ROUND, parameters={"x": float("nan")})
    with pytest.raises(accounting.InvalidEntry):
        ledger.charge(SITE_A, ROUND, note=3)
    entry = ledger.charge(SITE_A, ROUND, parameters={"sigma": np.float32(2.5), "n": np.int64(3)})
    assert entry.parameters == {"sigma": 2.5, "n": 3}
    assert ledger.spent(SITE_A).entries == 1


def test_closed_ledger(path):
    ledger = accounting.Ledger(path)
    ledger.close()
    ledger.close()
    with pytest.raises(accounting.LedgerError, match="closed"):
        ledger.scopes()


# -- verification --------------------------------------------------------------


def _edit_event(conn):
    conn.execute(
        "UPDATE entries SET event_json = ? WHERE seq = 2",
        ('{"noise_multiplier":50.0,"type":"GaussianDpEvent"}',),
    )


def _garble_event(conn):
    conn.execute("UPDATE entries SET event_json = 'not json' WHERE seq = 2")


def _edit_note(conn):
    conn.execute("UPDATE entries SET note = 'nothing to see' WHERE seq = 2")


def _delete_middle(conn):
    conn.execute("DELETE FROM entries WHERE seq = 2")


def _delete_last(conn):
    conn.execute("DELETE FROM entries WHERE seq = 4")


def _alter_curve(conn):
    (blob,) = conn.execute("SELECT rdp FROM scopes").fetchone()
    curve = np.frombuffer(blob, dtype="<f8") * 0.5
    conn.execute("UPDATE scopes SET rdp = ?", (curve.tobytes(),))


def _raise_budget(conn):
    conn.execute("UPDATE scopes SET budget_epsilon = 100.0")


def _understate_epsilon(conn):
    conn.execute("UPDATE scopes SET epsilon = epsilon / 2")


def _edit_epsilon_after(conn):
    conn.execute("UPDATE entries SET epsilon_after = epsilon_after / 2 WHERE seq = 3")


@pytest.mark.parametrize(
    ("tamper", "symptom"),
    [
        (_edit_event, "entry 2 was changed"),
        (_garble_event, "entry 2: its event cannot be accounted"),
        (_edit_note, "entry 2 was changed"),
        (_delete_middle, "without gaps"),
        (_delete_last, "chain head"),
        (_alter_curve, "cumulative RDP curve"),
        (_raise_budget, "budget history"),
        (_understate_epsilon, "stored epsilon"),
        (_edit_epsilon_after, "entry 3 records epsilon_after"),
    ],
)
def test_verify_detects_tampering(ledger, path, tamper, symptom):
    for i in range(4):
        ledger.charge(SITE_A, ROUND, note=f"round {i}")
    report = ledger.verify()
    assert report.ok, report.problems
    assert (report.scopes, report.entries) == (1, 4)

    with raw(path) as conn:
        tamper(conn)

    report = ledger.verify()
    assert not report.ok
    assert any(symptom in problem for problem in report.problems), report.problems
    assert all("site_a" in p for p in report.problems)
    assert "NOT ok" in str(report)


def test_verify_reports_an_event_edit_by_its_effect_too(ledger, path):
    for _ in range(3):
        ledger.charge(SITE_A, ROUND)
    with raw(path) as conn:
        _edit_event(conn)
    problems = ledger.verify().problems
    assert any("compose to" in p for p in problems)
    assert any("not the sum of its entries' curves" in p for p in problems)


# -- files that are not ledgers ----------------------------------------------------


def test_a_text_file_is_not_a_ledger(tmp_path):
    path = tmp_path / "notes.ledger"
    path.write_text("site A budget: lots\n" * 50)
    with pytest.raises(accounting.LedgerError, match=str(path)) as caught:
        accounting.Ledger(path)
    assert isinstance(caught.value, accounting.LedgerCorrupted)
    assert path.read_text() == "site A budget: lots\n" * 50


def test_another_database_is_not_a_ledger(tmp_path):
    path = tmp_path / "other.db"
    with raw(path) as conn:
        conn.execute("CREATE TABLE patients (id INTEGER)")
    with pytest.raises(accounting.LedgerError, match="not a fedstats privacy ledger") as caught:
        accounting.Ledger(path)
    assert str(path) in str(caught.value)


def test_another_schema_version_is_refused(path):
    accounting.Ledger(path).close()
    with raw(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(accounting.LedgerError, match="schema version '99'") as caught:
        accounting.Ledger(path)
    assert str(path) in str(caught.value)


def test_missing_directory(tmp_path):
    path = tmp_path / "missing" / "x.ledger"
    with pytest.raises(accounting.LedgerError, match=str(path)):
        accounting.Ledger(path)


def test_durability_setting(path):
    with accounting.Ledger(path) as ledger:
        assert ledger.durability == accounting.DEFAULT_DURABILITY == "full"
        assert ledger._db().execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
        assert ledger._db().execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with accounting.Ledger(path, durability="normal") as ledger:
        assert ledger._db().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    with pytest.raises(accounting.LedgerError):
        accounting.Ledger(path, durability="none")


def test_budget_exceeded_can_be_raised_from_a_preview():
    """Callers that refuse on a preview raise the same error with the same six figures."""
    error = accounting.BudgetExceeded(
        scope=SITE_A, budget_epsilon=3.0, spent=2.5, requested=0.75, would_total=3.1, remaining=0.5
    )
    assert (error.spent, error.requested, error.would_total, error.remaining) == (
        2.5,
        0.75,
        3.1,
        0.5,
    )
    assert error.delta is None and error.mechanism is None
    for figure in ("2.5", "0.75", "3.1", "0.5", "epsilon=3"):
        assert figure in str(error)
