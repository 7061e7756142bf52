"""No coordinator text is evaluated: formulas pass the project's grammar, at a site and at the
coordinator.

The attack: formula text reached formulaic's ``eval``; an attribute chain from a
column (``age.__class__.__init__.__globals__['__builtins__']``) reaches builtins,
so a term inside ``I(...)`` could open files, import ``os`` and send the result
back inside a gradient. Every payload here would write a marker file; none may.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import statsmodels.api as sm
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.contract import codec
from fedstats.contract.design import DesignSpec, parse_formula
from fedstats.errors import FormulaError, UnsafeTermError
from fedstats.site.silo import Silo


def frame(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.integers(30, 80, n).astype(float)
    chol = rng.normal(240, 40, n).round()
    return pd.DataFrame(
        {
            "age": age,
            "chol": chol,
            "sex": rng.choice(["female", "male"], n),
            "time": rng.exponential(10, n).round(1) + 0.1,
            "event": (rng.random(n) < 0.5).astype(int),
            "y": (rng.random(n) < 1 / (1 + np.exp(-(age - 55) / 10))).astype(int),
        }
    )


def payloads(marker) -> list[str]:
    write = f"open({str(marker)!r}, 'w')"
    system = f"__import__('os').system('touch {marker}')"
    chain = "age.__class__.__init__.__globals__['__builtins__']"
    return [
        f"y ~ I({write})",
        f"y ~ I({system})",
        f"y ~ I({chain}['open']({str(marker)!r}, 'w'))",
        f"y ~ C(sex, levels={system})",
        f"y ~ {{{system}}}",
        f"I({system}) ~ age",
        f"Surv({system}, event) ~ age",
        f"y ~ age + log({system})",
        f"y ~ age + I((lambda: {system})())",
        f"y ~ age + I([{system} for _ in age])",
        "y ~ age + I(age.index == 3)",
        "y ~ age + I(age[0])",
        f"y ~ age + I(f'{{{system}}}')",
        f"y ~ age + I((x := {system}))",
        "y ~ age + np.log(age)",
        "y ~ age + I(age.__class__)",
        "y ~ age + I(print(age))",
        "y ~ age + I(exp(age, out=age))",
    ]


@pytest.mark.parametrize("index", range(18))
def test_payloads_are_refused_through_the_public_api(tmp_path, index):
    marker = tmp_path / "marker"
    formula = payloads(marker)[index]
    fed = fedstats.Federation.in_process({"a": frame(seed=1), "b": frame(seed=2)})
    model = (
        fedstats.CoxPH(formula)
        if formula.startswith("Surv")
        else fedstats.LogisticRegression(formula)
    )
    with pytest.raises(FormulaError):
        model.fit(fed)
    assert not marker.exists()
    assert not [e for s in fed.silos.values() for e in s.log if e.status == "released"
                and e.task != "describe"]  # fmt: skip


def raw_request(formula: str, variables: list[str], columns: list[str]) -> bytes:
    """A request a coordinator writes by hand, skipping every check of the public API."""
    design = DesignSpec(
        formula=formula,
        outcome="y",
        variables=tuple(variables),
        levels={},
        columns=tuple(columns),
        site_intercepts=False,
        sites=("a",),
    ).to_wire()
    return codec.encode({"task": "prepare", "args": {"design": design}})


@pytest.mark.parametrize("index", [0, 1, 2, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17])
def test_payloads_in_raw_requests_are_refused_at_the_site_naming_the_term(tmp_path, index):
    marker = tmp_path / "marker"
    formula = payloads(marker)[index]
    silo = Silo("a", frame())
    reply = codec.decode(silo.handle(raw_request(formula, ["age", "y"], ["Intercept", "age"])))
    assert reply["status"] == "error"
    error = reply["error"]
    assert error["type"] in ("FormulaRefusedError", "MalformedRequestError"), error
    assert error["values"]["site"] == "a" and error["values"]["task"] == "prepare"
    if error["type"] == "FormulaRefusedError":
        assert error["values"]["term"]
    assert not marker.exists()
    assert silo.log[-1].status in ("refused", "error")


def test_a_refused_term_is_named():
    with pytest.raises(UnsafeTermError) as info:
        parse_formula("y ~ age + I(age.__class__.__init__)")
    assert "age.__class__" in info.value.token and "attribute" in str(info.value)
    silo = Silo("a", frame())
    reply = codec.decode(
        silo.handle(raw_request("y ~ I(age.index == 3)", ["age", "y"], ["Intercept", "x"]))
    )
    assert reply["error"]["type"] == "FormulaRefusedError"
    assert reply["error"]["values"]["term"] == "age.index"
    assert "attribute" in reply["error"]["values"]["reason"]


def test_a_column_name_with_code_in_it_is_only_ever_a_name(tmp_path):
    marker = tmp_path / "marker"
    name = f"__import__('os').system('touch {marker}')"
    formula = f"y ~ `{name}`"
    with pytest.raises(FormulaError):
        parse_formula(formula)
    silo = Silo("a", frame())
    reply = codec.decode(silo.handle(raw_request(formula, [name, "y"], ["Intercept", name])))
    assert reply["status"] == "error" and not marker.exists()


def test_allowed_functions_and_arithmetic_equal_numpy_on_the_pooled_rows():
    """Oracle: statsmodels' GLM Binomial on columns computed with numpy."""
    data = frame(400, 3)
    formula = "y ~ log(chol) + I(age ** 2 / 100) + I((age >= 60) & (sex == 'male')) + sqrt(age)"
    fed = fedstats.Federation.in_process({"a": data})
    result = fedstats.LogisticRegression(formula).fit(fed)
    X = pd.DataFrame(
        {
            "Intercept": 1.0,
            "log(chol)": np.log(data.chol),
            "I(age ** 2 / 100)": data.age**2 / 100,
            "I((age >= 60) & (sex == 'male'))": ((data.age >= 60) & (data.sex == "male")) * 1.0,
            "sqrt(age)": np.sqrt(data.age),
        }
    )
    oracle = sm.GLM(data.y, X, family=sm.families.Binomial()).fit(tol=1e-12)
    assert list(result.params.index) == list(X.columns)
    np.testing.assert_allclose(result.params.to_numpy(), oracle.params.to_numpy(), atol=1e-7)


def test_values_outside_a_function_domain_are_refused_not_dropped():
    data = frame()
    data.loc[3, "chol"] = 0.0
    fed = fedstats.Federation.in_process({"a": data})
    with pytest.raises(fedstats.errors.InconsistentColumnError) as info:
        fedstats.LogisticRegression("y ~ log(chol)", missing="drop").fit(fed)
    assert info.value.column == "log(chol)" and "domain" in str(info.value)


TOKENS = ["I(", "C(", "log(", "__", "age", "chol", "sex", "lambda", "import", "os", "open", "**"]
ALPHABET = st.sampled_from([*"yagexc ~+-*/:()[]{}.,'\"`=<>&|!^%@_0123456789", *TOKENS])


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ALPHABET, min_size=1, max_size=25).map("".join))
def test_any_text_parses_under_the_grammar_or_is_refused_as_a_formula_error(text):
    try:
        parsed = parse_formula(text)
    except FormulaError:
        return
    for factor in parsed.factors:
        assert factor.kind in ("column", "categorical", "expression")
        assert "." not in factor.name.replace("I(", "").split("'")[0] or factor.kind == "column"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ALPHABET, min_size=1, max_size=25).map("".join))
def test_any_text_in_a_raw_request_gets_a_typed_reply_never_an_internal_error(text):
    silo = Silo("a", frame(60))
    reply = codec.decode(
        silo.handle(raw_request(f"y ~ {text}", ["age", "y"], ["Intercept", "age"]))
    )
    if reply["status"] == "error":
        assert reply["error"]["type"] != "InternalSiteError", (text, silo.log[-1].detail)
