"""Messages a new user meets: each says what is wrong and what to do, in plain text."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import typer.main
from typer.testing import CliRunner

import accounting
import fedstats
from fedstats.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
MARKUP = ("``", ":func:", ":mod:", ":class:", ":meth:", "\x1b[")


def frames_with_dates(n: int = 120) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(7)
    return {
        site: pd.DataFrame(
            {
                "time": pd.date_range("2020-01-01", periods=n).astype(str),  # dates, not days
                "event": rng.integers(0, 2, n),
                "age": rng.normal(60, 10, n),
                "y": rng.integers(0, 2, n),
            }
        )
        for site in ("a", "b")
    }


def test_dates_as_a_cox_time_say_the_time_must_be_numeric_follow_up() -> None:
    federation = fedstats.Federation.in_process(frames_with_dates())
    with pytest.raises(fedstats.FormulaError) as error:
        fedstats.CoxPH("Surv(time, event) ~ age").fit(federation)
    message = str(error.value)
    assert "follow-up time 'time'" in message and "not numeric" in message
    assert "e.g. in days" in message and "pd.to_datetime" in message
    assert "levels" not in message  # not the disclosure rule on categorical levels


def _commands(command, path=()):
    yield list(path)
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


def test_every_help_text_is_plain() -> None:
    paths = list(_commands(typer.main.get_command(app)))
    assert ["demo"] in paths and ["budget", "set"] in paths and ["study", "run"] in paths
    for path in paths:
        result = CliRunner().invoke(app, [*path, "--help"])
        assert result.exit_code == 0, (path, result.output)
        found = [mark for mark in MARKUP if mark in result.output]
        assert not found, (path, found)


def test_a_formula_typo_is_reported_in_plain_text(tmp_path: Path) -> None:
    protocol = (ROOT / "fedstats" / "examples" / "demo" / "protocol.toml").read_text(
        encoding="utf-8"
    )
    typo = protocol.replace("died ~ age + C(sex) +", "died ~ age + C(sex +")
    assert typo != protocol
    path = tmp_path / "protocol.toml"
    path.write_text(typo, encoding="utf-8")
    result = CliRunner().invoke(app, ["site", "protocol", str(path)], color=True)
    assert result.exit_code == 2
    assert "cannot parse formula" in result.stderr and "C(sex +" in result.stderr
    assert "\x1b[" not in result.output and "⧛" not in result.output

    federation = fedstats.Federation.in_process(frames_with_dates())
    with pytest.raises(fedstats.FormulaError) as error:
        fedstats.LogisticRegression("y ~ age + C(").fit(federation)
    assert "\x1b[" not in str(error.value) and "cannot parse formula" in str(error.value)


def test_no_budget_names_the_default_study_and_says_to_pass_ledgers() -> None:
    private = fedstats.RecordDP(epsilon=1.0, delta=1e-5, bounds={"age": (0.0, 120.0)})
    federation = fedstats.Federation.in_process(frames_with_dates())
    with pytest.raises(fedstats.NoBudgetError) as error:
        fedstats.LogisticRegression("y ~ age").fit(federation, privacy=private)
    message = str(error.value)
    assert "study 'study' (the default: no study name was set)" in message
    assert "ledgers=" in message and "study=" in message


def test_no_budget_names_the_study_that_was_set(tmp_path: Path) -> None:
    frames = frames_with_dates()
    ledgers = {site: accounting.Ledger(tmp_path / f"{site}.ledger") for site in frames}
    federation = fedstats.Federation.in_process(frames, study="heart", ledgers=ledgers)
    private = fedstats.RecordDP(epsilon=1.0, delta=1e-5, bounds={"age": (0.0, 120.0)})
    with pytest.raises(fedstats.NoBudgetError) as error:
        fedstats.LogisticRegression("y ~ age").fit(federation, privacy=private)
    message = str(error.value)
    assert "for study 'heart'" in message and "no privacy budget is set" in message
    assert "(the default" not in message and "fedstats budget set" in message
