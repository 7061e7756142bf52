"""The models a study.toml may name give, through the study runner, the numbers of the API.

A site data engineer runs a study from its file (``fedstats study run``,
:func:`fedstats.jobs.study_fits.run_fits`): a Poisson rate model with an
exposure, a weighted Cox model, a weighted Kaplan–Meier curve and a
Fine–Gray model are each made from their ``[[fits]]`` entry and recorded; each
record equals the fit made through the Python API on the same sites.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import fedstats
from fedstats.errors import ConfigError
from fedstats.jobs.study_config import load_study_config
from fedstats.jobs.study_fits import run_fits

STUDY = """
[study]
name = "models"
sites = ["north", "south", "east"]
out = "{out}"

[[fits]]
kind = "glm"
name = "infection_rate"
formula = "infections ~ age + smoker"
family = "poisson"
exposure = "years"

[[fits]]
kind = "cox"
name = "weighted_cox"
formula = "Surv(months, died) ~ age + smoker"
ties = "breslow"
weights = "n"

[[fits]]
kind = "kaplan_meier"
name = "weighted_curve"
time = "months"
event = "died"
width = 6
horizon = 36
weights = "n"

[[fits]]
kind = "fine_gray"
name = "relapse"
formula = "Surv(months, status) ~ age + smoker"
cause = 1
width = 6
horizon = 36
"""


def frames() -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(11)
    out = {}
    for site in ("north", "south", "east"):
        n = 400
        age = rng.normal(60, 8, n).round(1)
        smoker = rng.integers(0, 2, n)
        hazard = np.exp(0.03 * (age - 60) + 0.5 * smoker) / 20
        relapse, other = rng.exponential(1 / hazard), rng.exponential(40.0, n)
        censor = rng.uniform(6, 48, n)
        months = np.ceil(np.minimum.reduce([relapse, other, censor]))
        status = np.select([relapse <= np.minimum(other, censor), other <= censor], [1, 2], 0)
        years = rng.uniform(0.5, 5.0, n).round(2)
        out[site] = pd.DataFrame(
            {
                "age": age,
                "smoker": smoker,
                "months": months,
                "status": status,
                "died": (status > 0).astype(int),
                "n": rng.integers(1, 4, n),
                "years": years,
                "infections": rng.poisson(0.3 * years * np.exp(0.4 * smoker)),
            }
        )
    return out


def test_each_model_of_the_study_file_equals_the_api(tmp_path: Path):
    study = tmp_path / "study.toml"
    study.write_text(STUDY.format(out=tmp_path / "out"), encoding="utf-8")
    sites = frames()
    recorded = run_fits(load_study_config(study), fedstats.Federation.in_process(sites))
    assert (tmp_path / "out" / "results" / "relapse.json").is_file()

    def fed() -> fedstats.Federation:
        return fedstats.Federation.in_process(sites)

    direct = {
        "infection_rate": fedstats.GLM(
            "infections ~ age + smoker", family="poisson", exposure="years"
        ).fit(fed()),
        "weighted_cox": fedstats.CoxPH(
            "Surv(months, died) ~ age + smoker", ties="breslow", weights="n"
        ).fit(fed()),
        "relapse": fedstats.FineGray(
            "Surv(months, status) ~ age + smoker", cause=1, width=6, horizon=36
        ).fit(fed()),
    }
    for name, result in direct.items():
        record = recorded[name]
        assert list(record["params"]) == list(result.params.index)
        assert np.allclose(list(record["params"].values()), result.params, rtol=0, atol=1e-12)
        assert np.allclose(list(record["bse"].values()), result.bse, rtol=0, atol=1e-12)
    curve = fedstats.KaplanMeier("months", "died", width=6, horizon=36, weights="n").fit(fed())
    assert recorded["weighted_curve"]["kind"] == "kaplan_meier"
    analyses = recorded["weighted_curve"].pop("analyses")  # what the report ties to the curve
    assert len(analyses) == 1 and analyses[0].startswith("kaplan_meier-")
    assert recorded["weighted_curve"] == {"kind": "kaplan_meier", **curve.to_record()}


def test_a_fine_gray_entry_without_its_cause_names_the_field(tmp_path: Path):
    study = tmp_path / "study.toml"
    text = STUDY.format(out=tmp_path / "out").replace("cause = 1\n", "")
    study.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match="cause"):
        load_study_config(study)


def test_a_fine_gray_entry_names_its_convention(tmp_path: Path):
    """``convention = "finegray"`` fits R's coxph on finegray() rows (Efron's ties by default),
    as the API does; the default is cmprsk::crr's; crr with Efron's ties is refused."""
    study = tmp_path / "study.toml"
    text = STUDY.format(out=tmp_path / "out").replace(
        "cause = 1\n", 'cause = 1\nconvention = "finegray"\n'
    )
    study.write_text(text, encoding="utf-8")
    sites = frames()
    recorded = run_fits(load_study_config(study), fedstats.Federation.in_process(sites))
    direct = fedstats.FineGray(
        "Surv(months, status) ~ age + smoker", cause=1, width=6, horizon=36, convention="finegray"
    ).fit(fedstats.Federation.in_process(sites))
    record = recorded["relapse"]
    assert record["convention"] == "finegray" and record["ties"] == "efron"
    assert np.allclose(list(record["params"].values()), direct.params, rtol=0, atol=1e-12)
    assert np.allclose(list(record["bse"].values()), direct.bse, rtol=0, atol=1e-12)
    crr = fedstats.FineGray(
        "Surv(months, status) ~ age + smoker", cause=1, width=6, horizon=36
    ).fit(fedstats.Federation.in_process(sites))
    assert not np.allclose(crr.bse, direct.bse, rtol=1e-6)
    with pytest.raises(ConfigError, match="convention"):
        study.write_text(text.replace('"finegray"', '"stata"'), encoding="utf-8")
        load_study_config(study)


SECURE = """
[study]
name = "models"
sites = ["north", "south", "east"]
out = "{out}"

[[fits]]
kind = "glm"
name = "infection_rate"
formula = "infections ~ age + smoker"
family = "poisson"
exposure = "years"
secure_aggregation = {{ {options} }}

[[fits]]
kind = "cox"
name = "weighted_cox"
formula = "Surv(months, died) ~ age + smoker"
secure_aggregation = {{}}
"""


def test_a_fit_with_a_secure_aggregation_table_is_the_apis_secure_fit(tmp_path: Path):
    """``secure_aggregation = {...}`` takes fedstats.SecureAggregation's options: the record
    equals the API's secure fit (sums of masked replies: fixed-point precision), and the
    message inventory shows each round's secure-aggregation session."""
    study = tmp_path / "study.toml"
    options = 'construction = "secagg", threshold = 2'
    study.write_text(SECURE.format(out=tmp_path / "out", options=options), encoding="utf-8")
    sites = frames()
    fed = fedstats.Federation.in_process(sites)
    recorded = run_fits(load_study_config(study), fed)
    assert {"secagg.advertise", "secagg.unmask"} <= {m.task for m in fed.inventory}
    secure = fedstats.SecureAggregation(construction="secagg", threshold=2)
    direct = {
        "infection_rate": fedstats.GLM(
            "infections ~ age + smoker", family="poisson", exposure="years"
        ).fit(fedstats.Federation.in_process(sites), secure_aggregation=secure),
        "weighted_cox": fedstats.CoxPH("Surv(months, died) ~ age + smoker").fit(
            fedstats.Federation.in_process(sites), secure_aggregation=fedstats.SecureAggregation()
        ),
    }
    for name, result in direct.items():
        record = recorded[name]
        assert np.allclose(list(record["params"].values()), result.params, rtol=0, atol=1e-12)
        assert np.allclose(list(record["bse"].values()), result.bse, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "options",
    ['construction = "plain"', "threshold = 1", "fraction_bits = 70", "rounds = 3"],
)
def test_a_secure_aggregation_table_with_a_wrong_option_names_it(tmp_path: Path, options):
    study = tmp_path / "study.toml"
    study.write_text(SECURE.format(out=tmp_path / "out", options=options), encoding="utf-8")
    with pytest.raises(ConfigError, match=options.split(" ")[0]):
        load_study_config(study)
