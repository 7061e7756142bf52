"""The README's "Use your own data" snippet runs as printed, on a CSV coded by its rules,
and gives the pooled answers: statsmodels' GLM Binomial for the logistic regression and
lifelines' Cox model stratified by site (Efron ties) for the survival model."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels.api as sm
import statsmodels.formula.api as smf
from lifelines import CoxPHFitter

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_snippet() -> str:
    """The first ``python`` block of the README section "Use your own data"."""
    text = README.read_text(encoding="utf-8")
    section = text.split("\n## Use your own data\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert blocks, "the section has no python block"
    return blocks[0]


def write_study_csv(path: Path, seed: int) -> pd.DataFrame:
    """Three hospitals, one row per patient: ``site``, 0/1 ``died``, whole ``days`` of
    follow-up (censored at ten years), numeric ``age``, text ``sex``, 0/1 ``smoker``."""
    rng = np.random.default_rng(seed)
    parts = []
    for site, n, shift in (("north", 400, 0.0), ("south", 350, 3.0), ("east", 300, -2.0)):
        age = rng.normal(62.0 + shift, 9.0, n).round(1)
        sex = rng.choice(["female", "male"], n)
        smoker = rng.binomial(1, 0.3, n)
        hazard = np.exp(-10.0 + 0.04 * age + 0.3 * (sex == "male") + 0.6 * smoker)
        event_day = np.ceil(rng.exponential(1.0 / hazard))
        end_day = rng.integers(365, 3650, n)
        died = (event_day <= end_day).astype(int)
        days = np.where(died == 1, event_day, end_day).astype(int)
        parts.append(
            pd.DataFrame(
                {"site": site, "age": age, "sex": sex, "smoker": smoker, "days": days, "died": died}
            )
        )
    data = pd.concat(parts, ignore_index=True)
    data.to_csv(path, index=False)
    return data


def test_snippet_reads_the_csv_and_matches_the_pooled_fits(tmp_path, monkeypatch, capsys):
    data = write_study_csv(tmp_path / "my_study.csv", seed=2024)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(readme_snippet(), f"{README}:Use your own data", "exec"), namespace)

    printed = capsys.readouterr().out
    assert "Federated logistic regression" in printed
    assert set(namespace["frames"]) == {"north", "south", "east"}

    logit = namespace["logit"]
    glm = smf.glm("died ~ age + C(sex) + smoker", data, family=sm.families.Binomial())
    reference = glm.fit(tol=1e-12)
    assert set(logit.params.index) == set(reference.params.index)
    names = logit.params.index
    np.testing.assert_allclose(logit.params, reference.params[names], rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(logit.bse, reference.bse[names], rtol=1e-5)

    cox = namespace["cox"]
    coded = data.assign(male=(data["sex"] == "male").astype(int)).drop(columns="sex")
    lifelines_cox = CoxPHFitter().fit(
        coded, "days", "died", strata=["site"], fit_options={"precision": 1e-10}
    )
    assert set(cox.params.index) == {"age", "C(sex)[T.male]", "smoker"}
    expected = lifelines_cox.params_.rename({"male": "C(sex)[T.male]"})[cox.params.index]
    np.testing.assert_allclose(cox.params, expected, rtol=1e-6, atol=1e-8)
