"""``fedstats budget set`` and ``budget show``: a privacy officer's budgets through the CLI."""

from __future__ import annotations

import json
import math
import uuid
from pathlib import Path

import dp_accounting
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

import accounting
from fedstats.cli.main import app
from reports.formatting import format_delta, format_epsilon


def budget_set(ledger: Path, *extra: str, epsilon: str = "3", delta: str = "1e-05"):
    args = ["budget", "set", "--ledger", str(ledger), "--study", "heart", "--owner", "site_a"]
    args += ["--unit", "patient", "--epsilon", epsilon, "--delta", delta, *extra]
    return CliRunner().invoke(app, args)


def test_set_then_show_round_trip(tmp_path: Path) -> None:
    ledger = tmp_path / "site_a.ledger"
    result = budget_set(ledger)
    assert result.exit_code == 0, result.output
    assert "new scope" in result.stdout and "epsilon 3.000, delta 1e-05" in result.stdout

    shown = CliRunner().invoke(app, ["budget", "show", "--ledger", str(ledger)])
    assert shown.exit_code == 0, shown.output
    assert "1e-05" in shown.stdout and "0.0000" not in shown.stdout
    (row,) = json.loads(
        CliRunner().invoke(app, ["budget", "show", "--ledger", str(ledger), "--json"]).stdout
    )["scopes"]
    assert (row["study"], row["owner"], row["unit"]) == ("heart", "site_a", "patient")
    assert (row["budget_epsilon"], row["delta"]) == (3.0, 1e-5)

    raised = budget_set(ledger, epsilon="5", delta="1e-06")
    assert raised.exit_code == 0, raised.output
    assert "was epsilon 3.000, delta 1e-05" in raised.stdout
    with accounting.Ledger(ledger) as book:  # durable and itself recorded
        scope = accounting.Scope(unit="patient", owner="site_a", study="heart")
        assert book.budget(scope) == accounting.Budget(5.0, 1e-6)
        history = book.budget_history(scope)
    assert [(h.epsilon, h.delta) for h in history] == [(3.0, 1e-5), (5.0, 1e-6)]
    assert history[0].changed_at <= history[1].changed_at


def test_lowering_a_budget_below_what_is_spent_is_refused_with_the_amount(tmp_path: Path) -> None:
    ledger = tmp_path / "site_a.ledger"
    assert budget_set(ledger).exit_code == 0
    scope = accounting.Scope(unit="patient", owner="site_a", study="heart")
    with accounting.Ledger(ledger) as book:
        book.charge(scope, dp_accounting.GaussianDpEvent(2.0), note="round 1")
        spent = book.spent(scope, pld=False).epsilon
    assert 0.5 < spent < 3

    result = budget_set(ledger, epsilon="0.5")
    assert result.exit_code == 2
    assert "--epsilon" in result.stderr and "already spent" in result.stderr
    assert f"spent epsilon {format_epsilon(spent)}" in result.stderr
    assert "Traceback" not in result.output
    with accounting.Ledger(ledger) as book:
        assert book.budget(scope) == accounting.Budget(3.0, 1e-5)  # unchanged
        assert len(book.budget_history(scope)) == 1

    with (
        accounting.Ledger(ledger) as book,
        pytest.raises(accounting.BudgetBelowSpent) as refused,
    ):
        book.set_budget(scope, epsilon=0.5, delta=1e-5)
    assert refused.value.spent == pytest.approx(spent)
    assert isinstance(refused.value, accounting.InvalidBudget)


@pytest.mark.parametrize(
    ("option", "value", "named"),
    [
        ("epsilon", "-1", "--epsilon"),
        ("epsilon", "0", "--epsilon"),
        ("epsilon", "inf", "--epsilon"),
        ("delta", "1", "--delta"),
        ("delta", "1.5", "--delta"),
        ("delta", "0", "--delta"),
    ],
)
def test_bad_values_are_refused_naming_the_option(tmp_path, option, value, named) -> None:
    ledger = tmp_path / "site_a.ledger"
    result = budget_set(ledger, **{option: value})
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {named}: {option} must")
    assert "Traceback" not in result.output


def test_bad_unit_and_missing_folder_are_refused(tmp_path: Path) -> None:
    result = budget_set(tmp_path / "site_a.ledger", "--unit", "hospital")
    assert result.exit_code == 2 and "--unit" in result.stderr and "hospital" in result.stderr
    result = budget_set(tmp_path / "absent" / "site_a.ledger")
    assert result.exit_code == 2 and "does not exist" in result.stderr


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(epsilon=st.one_of(finite, st.sampled_from([math.inf, math.nan])), delta=finite)
def test_any_numbers_are_set_exactly_or_refused_by_name(tmp_path, epsilon, delta) -> None:
    """Any epsilon and delta a user types: a valid pair is stored exactly and shown; any other
    is refused with exit code 2 naming the option, and leaves no scope behind."""
    ledger = tmp_path / f"{uuid.uuid4().hex}.ledger"
    result = budget_set(ledger, epsilon=repr(epsilon), delta=repr(delta))
    valid_epsilon = epsilon > 0 and math.isfinite(epsilon)
    valid_delta = 0 < delta < 1
    if valid_epsilon and valid_delta:
        assert result.exit_code == 0, result.output
        with accounting.Ledger(ledger) as book:
            scope = accounting.Scope(unit="patient", owner="site_a", study="heart")
            assert book.budget(scope) == accounting.Budget(epsilon, delta)
        shown = CliRunner().invoke(app, ["budget", "show", "--ledger", str(ledger)]).stdout
        assert format_delta(delta) in shown and format_epsilon(epsilon) in shown
    else:
        assert result.exit_code == 2, result.output
        assert ("--epsilon" if not valid_epsilon else "--delta") in result.stderr
        if ledger.exists():
            with accounting.Ledger(ledger) as book:
                assert book.scopes() == []


@given(delta=st.floats(min_value=1e-300, max_value=0.999, allow_nan=False))
def test_delta_is_printed_so_that_it_reads_back_close(delta: float) -> None:
    text = format_delta(delta)
    assert float(text) == pytest.approx(delta, rel=0.01)
    assert float(text) > 0  # never rounded to zero


def test_epsilon_has_sensible_digits() -> None:
    assert [format_epsilon(v) for v in (3.0, 0.81374, 1.23456e-4, None)] == [
        "3.000",
        "0.8137",
        "0.0001235",
        "not available",
    ]
