"""Codec and request edges: whatever a coordinator puts in any field, a site answers with a
typed refusal, never an internal failure.

The attacks: a 5,000-digit JSON integer (Python refuses to convert more than 4,300 digits
with ``ValueError``) and a noise multiplier of 1e300 (whose square overflows in the RDP
accountant) ended in ``InternalSiteError``. A hypothesis test replaces one field of an honest
request of every task the site registry serves, at any depth, with a random JSON-like value.
"""

from __future__ import annotations

import contextlib
import math
import struct

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.errors import MalformedRequestError
from fedstats.models.agree import agreed_design
from fedstats.site.registry import REGISTRY
from fedstats.site.silo import Silo


def frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    age = rng.normal(60, 8, size=n).round()
    return pd.DataFrame(
        {
            "age": age,
            "sex": rng.choice(["female", "male"], size=n),
            "y": (rng.random(n) < 0.4).astype(int),
            "time": rng.exponential(5, size=n).round(2) + 0.01,
            "event": (rng.random(n) < 0.6).astype(int),
            "cause": rng.choice([0, 1, 2], size=n),
        }
    )


def raw(header: str, body: bytes = b"") -> bytes:
    data = header.encode()
    return b"FSC1" + struct.pack("<I", len(data)) + data + body


def ledger(tmp_path, site: str) -> accounting.Ledger:
    book = accounting.Ledger(tmp_path / f"{site}.db")
    book.set_budget(accounting.Scope(unit="patient", owner=site, study="st"), epsilon=5, delta=1e-5)
    return book


@pytest.fixture(scope="module")
def honest(tmp_path_factory) -> dict[str, dict]:
    """The first request of each task that a few honest fits send (their arguments)."""
    seen: dict[str, dict] = {}
    silos = {f"s{i}": Silo(f"s{i}", frame(300, i)) for i in range(2)}

    def recording(silo: Silo):
        def transport(request: bytes) -> bytes:
            message = codec.decode(request)
            seen.setdefault(message["task"], message["args"])
            return silo.handle(request)

        return transport

    fed = fedstats.Federation({name: recording(silo) for name, silo in silos.items()})
    fit = fedstats.LogisticRegression("y ~ age + C(sex)").fit(fed)
    fedstats.classification_metrics(fit, fed)  # scored with the fit's last round relayed
    fedstats.GLM("y ~ age", family="poisson").fit(fed)
    fedstats.KaplanMeier("time", "event", width=1.0, horizon=10.0).fit(fed)
    fedstats.CoxPH("Surv(time, event) ~ age").fit(fed)
    for more in (
        lambda: fedstats.CumulativeIncidence("time", "cause", cause=1, width=1.0, horizon=10.0),
        lambda: fedstats.FineGray("Surv(time, cause) ~ age", cause=1, width=1.0, horizon=10.0),
        lambda: fedstats.CoxPH("Surv(time, event) ~ age", robust=True),
    ):
        with contextlib.suppress(fedstats.FedstatsError, TypeError):  # as many tasks as fit
            more().fit(fed)
    return seen


def test_a_5000_digit_integer_is_a_malformed_request():
    silo = Silo("s", frame(50, 0))
    reply = codec.decode(
        silo.handle(raw('{"v":{"task":"describe","args":{"variables":' + "9" * 5000 + '}},"b":[]}'))
    )
    assert reply["error"]["type"] == "MalformedRequestError"
    assert "integer" in reply["error"]["values"]["reason"]


@pytest.mark.parametrize(
    "shape", [[0, 10**19], [0, 2**63 - 1], [0, 2**40, 2**40], [0, 2**31, 2**31, 2**31]]
)
def test_an_empty_array_with_a_dimension_numpy_cannot_hold_is_a_malformed_request(shape):
    """An empty array's other dimensions may be anything its buffer of 0 bytes matches; numpy
    refuses a dimension past 2**63 or a size past its address space with ``ValueError``, which
    ended in ``InternalSiteError``."""
    silo = Silo("s", frame(50, 0))
    args = '{"variables":["age"],"x":{"$a":0}}'
    header = '{"v":{"task":"describe","args":' + args + '},"b":[["<f8",' + str(shape) + ",0,0]]}"
    reply = codec.decode(silo.handle(raw(header)))
    assert reply["error"]["type"] == "MalformedRequestError", reply
    assert "shape" in reply["error"]["values"]["reason"]


@pytest.mark.parametrize("sigma", [1e300, 1e-300, 0.0, -1.0, float("nan"), float("inf"), 1e7, True])
def test_a_noise_multiplier_out_of_range_is_a_malformed_request_naming_the_field(tmp_path, sigma):
    silo = Silo("s", frame(200, 0), ledger=ledger(tmp_path, "s"))
    fed = fedstats.Federation.in_process({"s": frame(200, 0)})
    spec, _ = agreed_design(fed, "y ~ age", analysis="a")
    dp = {"noise_multipliers": {"n_obs": sigma}, "study": "st", "analysis": "a", "note": ""}
    request = codec.encode({"task": "prepare", "args": {"design": spec.to_wire(), "dp": dp}})
    reply = codec.decode(silo.handle(request))
    assert reply["error"]["type"] == "MalformedRequestError", reply
    assert "noise_multipliers" in reply["error"]["values"]["reason"]


@pytest.mark.parametrize(
    ("sigma", "answer"),
    [
        (1e6, "ok"),  # MAX_NOISE_MULTIPLIER: accepted, costs next to nothing
        (math.nextafter(1e6, math.inf), "MalformedRequestError"),
        (1e-6, "BudgetExceededError"),  # MIN_NOISE_MULTIPLIER: accepted, then over budget
        (math.nextafter(1e-6, 0.0), "MalformedRequestError"),
    ],
)
def test_noise_multipliers_at_the_exact_bounds_are_accepted_and_one_step_beyond_refused(
    tmp_path, sigma, answer
):
    from fedstats.contract.dp_request import MAX_NOISE_MULTIPLIER, MIN_NOISE_MULTIPLIER

    assert (MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER) == (1e-6, 1e6)
    book = ledger(tmp_path, "s")
    silo = Silo("s", frame(200, 0), ledger=book)
    fed = fedstats.Federation.in_process({"s": frame(200, 0)})
    spec, _ = agreed_design(fed, "y ~ age", analysis="a")
    dp = {"noise_multipliers": {"n_obs": sigma}, "study": "st", "analysis": "a", "note": ""}
    request = codec.encode({"task": "prepare", "args": {"design": spec.to_wire(), "dp": dp}})
    reply = codec.decode(silo.handle(request))
    assert (reply["status"] if reply["status"] == "ok" else reply["error"]["type"]) == answer
    if answer == "MalformedRequestError":
        assert "noise_multipliers" in reply["error"]["values"]["reason"]
    charged = book.entries(accounting.Scope(unit="patient", owner="s", study="st"))
    assert len(charged) == (1 if answer == "ok" else 0)


@pytest.mark.deep
@pytest.mark.parametrize(
    ("field", "value", "accepted"),
    [
        ("noise_multiplier", 1e6, True),
        ("noise_multiplier", 1e-6, True),
        ("noise_multiplier", math.nextafter(1e6, math.inf), False),
        ("noise_multiplier", math.nextafter(1e-6, 0.0), False),
        ("noise_multiplier", 1e300, False),
        ("max_grad_norm", 1e6, True),
        ("max_grad_norm", math.nextafter(1e6, math.inf), False),
        ("max_grad_norm", 1e300, False),
        ("max_grad_norm", 0.0, False),
        ("max_grad_norm", float("inf"), False),
    ],
)
def test_dp_sgd_noise_multiplier_and_clipping_norm_are_bounded_naming_the_block(
    field, value, accepted
):
    """The clipping norm times the noise multiplier is the noise's scale: past about 1e154 its
    square overflows in the accountant, so both are bounded where the request is read."""
    from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan
    from fedstats.errors import MalformedRequestError

    block = {"sample_rate": 0.5, "noise_multiplier": 1.0, "max_grad_norm": 1.0, "steps": 3,
             "engine": "auto", field: value}  # fmt: skip
    if accepted:
        assert getattr(DpSgdPlan.from_args({"dp_sgd": block}), field) == value
        return
    with pytest.raises(MalformedRequestError) as info:
        DpSgdPlan.from_args({"dp_sgd": block})
    assert "'dp_sgd'" in str(info.value) and field in str(info.value)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**20), max_value=10**20)
    | st.sampled_from([0, 1, -1, 2**63, 2**64, 10**19, -(2**63)])
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([1e300, -1e300, 1e-300, 0.0, -0.0, float("nan"), float("inf")])
    | st.text(max_size=20)
    | st.sampled_from(["", ".", "..", "Intercept", "age", "y", "C(sex)", "Surv(time, event)"])
    | st.builds(lambda v: np.asarray(v, dtype=float), st.lists(st.floats(), max_size=4)),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=10,
)


def paths(tree, prefix=()):
    """Every place in a request's arguments a value can be replaced (dict keys and list items)."""
    yield prefix
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(tree, list):
        for i, value in enumerate(tree[:4]):
            yield from paths(value, (*prefix, i))


def replaced(tree, path, value):
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(tree, dict):
        return {**tree, head: replaced(tree[head], rest, value)}
    out = list(tree)
    out[head] = replaced(out[head], rest, value)
    return out


TASKS = sorted({*REGISTRY._tasks, *REGISTRY._optional})


def test_the_fuzzed_tasks_are_every_task_the_registry_serves(honest):
    """A task added to the registry later is fuzzed too (below, with or without an honest
    request to start from)."""
    assert {"describe", "prepare", "logistic.summaries", "glm.summaries", "survival.counts",
            "cox.summaries"} <= set(honest)  # fmt: skip
    assert set(TASKS) >= set(honest)


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_no_field_of_any_task_makes_a_site_fail_internally(honest, data):
    task = data.draw(st.sampled_from(TASKS))
    if task.startswith("deep."):
        pytest.importorskip("torch")
    base = honest.get(task, {})
    path = data.draw(st.sampled_from([*list(paths(base)), ("dp",), ("design",)]))
    value = data.draw(JSON)
    args = (
        replaced(base, path, value)
        if (path and path[0] in base) or not path
        else {**base, path[0]: value}
    )
    if not isinstance(args, dict):
        args = {"value": args}
    silo = Silo("s0", frame(300, 0))
    try:
        request = codec.encode({"task": task, "args": args})
    except fedstats.CodecError:
        return  # the coordinator's own codec refuses it (e.g. a non-string key)
    reply = codec.decode(silo.handle(request))
    if reply["status"] == "error":
        assert reply["error"]["type"] != "InternalSiteError", (task, path, value, silo.log[-1])


@pytest.mark.parametrize("levels", [[False, False], ["male", "male"], [1, 1.0], [1, True],
                                    ["female", float("nan")], [float("inf"), "male"]])  # fmt: skip
@pytest.mark.parametrize("task", ["prepare", "logistic.summaries", "logistic.evaluate"])
def test_repeated_or_non_finite_levels_are_a_malformed_request(honest, task, levels):
    """Levels pandas cannot make categories of (a repeat, as 1, 1.0 and True are one level;
    NaN or infinity) are refused naming the variable, before any row is read (found by the
    fuzz above: ``[False, False]`` ended in ``InternalSiteError``)."""
    design = {**honest[task]["design"], "levels": {"sex": levels}}
    args = {**honest[task], "design": design}
    reply = codec.decode(Silo("s0", frame(300, 0)).handle(
        codec.encode({"task": task, "args": args})))  # fmt: skip
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "MalformedRequestError"
    assert "'sex'" in reply["error"]["values"]["reason"]


@pytest.fixture(scope="module")
def path_requests() -> tuple[dict, list[tuple[str, dict]]]:
    """Requests of honest fits at sites that verify paths (round 1 and later rounds, their
    relayed signed replies included), and the pins of those sites."""
    from fedstats.models import fairness
    from fedstats.secagg.roster import in_process_pins

    pins = in_process_pins(["s0", "s1"])
    silos = {
        name: Silo(name, frame(300, i), secure_aggregation=pins[name], verified_paths=True)
        for i, name in enumerate(pins)
    }
    seen: list[tuple[str, dict]] = []

    def recording(silo: Silo):
        def transport(request: bytes) -> bytes:
            message = codec.decode(request)
            if silo.name == "s0" and "path" in message["args"]:
                seen.append((message["task"], message["args"]))
            return silo.handle(request)

        return transport

    fed = fedstats.Federation({name: recording(silo) for name, silo in silos.items()})
    fit = fedstats.LogisticRegression("y ~ age + C(sex)").fit(fed)
    fedstats.classification_metrics(fit, fed)  # scored with the fit's last round relayed
    fedstats.GLM("y ~ age", family="poisson").fit(fed)
    fedstats.CoxPH("Surv(time, event) ~ age").fit(fed)
    fedstats.CoxPH("Surv(time, event) ~ age", strata=None, width=1.0, horizon=10.0).fit(fed)
    fedstats.FineGray("Surv(time, cause) ~ age", cause=1, width=1.0, horizon=10.0).fit(fed)
    fairness.fit_penalized(fedstats.LogisticRegression("y ~ age"), fed, groups="site", gamma=1.0)
    secure = fedstats.SecureAggregation()  # masked rounds: signed masked replies and seeds
    fedstats.LogisticRegression("y ~ age + C(sex)").fit(fed, secure_aggregation=secure)
    fedstats.CoxPH("Surv(time, event) ~ age", strata=None, width=1.0, horizon=10.0).fit(
        fed, secure_aggregation=secure
    )
    try:  # exact training paths: a named robust rule, and a self-weighted secure SCAFFOLD
        from fedstats.deep import FederatedTrainer
        from fedstats.models.aggregation import CoordinateMedian
    except ImportError:  # the deep extra is not installed: the fits above only
        return pins, seen
    settings = dict(formula="y ~ age", bounds={"age": (30.0, 90.0)}, rounds=2, local_steps=2,
                    lr=0.1, batch_size=16, seed=3, progress=False)  # fmt: skip
    FederatedTrainer("mlp", {"hidden": [4]}, aggregator=CoordinateMedian(), **settings).fit(
        fed  # evaluated with its training's last round relayed
    )
    FederatedTrainer("mlp", {"hidden": [4]}, algorithm="scaffold", **settings).fit(
        fed, evaluation=False, secure_aggregation=secure
    )
    return pins, seen


@settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data())
def test_no_field_of_a_path_request_makes_a_verifying_site_fail_internally(path_requests, data):
    """Any field of an honest path request (its point, base, round, sites, relayed replies,
    signatures, the fit's arguments; inside secure aggregation the relayed masked replies,
    their session facts and seeds), replaced by any value: refused with a typed error or
    answered, never an internal failure."""
    pins, seen = path_requests
    assert {task for task, _ in seen} >= {
        "logistic.summaries",
        "glm.summaries",
        "cox.summaries",
        "cox.grid_summaries",
        "fine_gray.grid_summaries",
        "fairness.summaries",
        "logistic.evaluate",
    }
    assert any("seeds" in args["path"].get("previous", {}) for _, args in seen)
    task, base = data.draw(st.sampled_from(seen))
    path = data.draw(st.sampled_from(list(paths(base))))
    args = replaced(base, path, data.draw(JSON))
    if not isinstance(args, dict):
        args = {"value": args}
    silo = Silo("s0", frame(300, 0), secure_aggregation=pins["s0"], verified_paths=True)
    try:
        request = codec.encode({"task": task, "args": args})
    except fedstats.CodecError:
        return
    reply = codec.decode(silo.handle(request))
    if reply["status"] == "error":
        assert reply["error"]["type"] != "InternalSiteError", (task, path, silo.log[-1])


@pytest.mark.parametrize("value", [2**63, 2**64, -(2**63) - 1, [2**64, 1.0], {"x": 2**64}])
@pytest.mark.parametrize("field", ["gradient", "loglik", "all_extreme"])
def test_a_relayed_reply_holding_an_integer_beyond_int64_is_refused_not_failed(
    path_requests, field, value
):
    """A relayed reply's field replaced by an integer no float64 or int64 holds (the codec
    carries any JSON integer): the site hashes it like any other value, the signature no longer
    matches, and the request is refused on its path."""
    pins, seen = path_requests
    task, base = next(
        (t, a) for t, a in seen if t == "logistic.summaries" and "previous" in a["path"]
    )
    args = replaced(base, ("path", "previous", "replies", "s0", "reply", field), value)
    silo = Silo("s0", frame(300, 0), secure_aggregation=pins["s0"], verified_paths=True)
    reply = codec.decode(silo.handle(codec.encode({"task": task, "args": args})))
    assert reply["status"] == "error"
    assert reply["error"]["type"] != "InternalSiteError", silo.log[-1]
    assert silo.log[-1].reason == "path", silo.log[-1]


@pytest.mark.parametrize("value", [np.array([]), np.array([1.0, 2.0]), np.array([[0.5]])])
@pytest.mark.parametrize("field", ["algorithm", "scale", "engine"])
def test_an_array_where_a_training_names_its_method_is_refused_not_failed(
    path_requests, field, value
):
    """Found by the path-request fuzzer: an array as a training round's ``algorithm`` made
    the name check's ``in`` ambiguous (an internal error). Such arrays, in the algorithm,
    the secure-aggregation ``scale`` or DP-SGD's ``engine``, are refused as malformed."""
    pins, seen = path_requests
    trainings = [args for task, args in seen if task == "deep.train"]
    if not trainings:
        pytest.skip("the deep extra is not installed")
    if field == "engine":
        from fedstats.deep.shared.dp_sgd_plan import DpSgdPlan

        block = {"sample_rate": 0.1, "noise_multiplier": 1.0, "max_grad_norm": 1.0,
                 "steps": 4, "engine": value}  # fmt: skip
        with pytest.raises(MalformedRequestError, match="engine"):
            DpSgdPlan.from_args({"dp_sgd": block})
        return
    args = {**trainings[0], field: value}
    silo = Silo("s0", frame(300, 0), secure_aggregation=pins["s0"], verified_paths=True)
    reply = codec.decode(silo.handle(codec.encode({"task": "deep.train", "args": args})))
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "MalformedRequestError", silo.log[-1]
