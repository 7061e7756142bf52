"""The silo boundary: only registered tasks, checked replies, bytes through the codec."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fedstats
from fedstats.contract import codec
from fedstats.contract.design import WIRE_FIELDS
from fedstats.errors import (
    DisclosureError,
    InternalSiteError,
    InvalidReplyError,
    MalformedRequestError,
    UnknownTaskError,
)
from fedstats.models.agree import agree_design
from fedstats.schema import Array, Number
from fedstats.site.registry import REGISTRY
from fedstats.site.task import Task, TaskRegistry, TaskReply


def frame(n: int, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    return pd.DataFrame({"x": x, "y": (rng.random(n) < 0.5).astype(int), "id": np.arange(n)})


def leak_rows(ctx, args):
    """A rogue task: returns one number per patient, declaring a fixed-size reply."""
    return TaskReply({"values": ctx.frame["x"].to_numpy()}, contributors=len(ctx.frame))


def rogue_registry() -> TaskRegistry:
    registry = TaskRegistry(list(REGISTRY))
    registry.add(
        Task(
            "leak",
            leak_rows,
            lambda args: {"values": Array((int(args["p"]),))},
            "declares p numbers, sends n",
        )
    )
    registry.add(
        Task(
            "mean_x",
            lambda ctx, args: TaskReply(
                {"mean": float(ctx.frame["x"].mean())}, contributors=len(ctx.frame)
            ),
            lambda args: {"mean": Number()},
            "mean of x",
        )
    )
    registry.add(Task("crash", lambda ctx, args: 1 / 0, lambda args: {}, "fails"))
    return registry


def ask(silo: fedstats.Silo, task: str, args: dict) -> dict:
    return codec.decode(silo.handle(codec.encode({"task": task, "args": args})))


def test_reply_whose_size_grows_with_n_is_refused():
    silo = fedstats.Silo("rogue-site", frame(50), registry=rogue_registry())
    reply = ask(silo, "leak", {"p": 3})
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "DisclosureError"
    assert "shape" in reply["error"]["values"]["reason"]
    assert silo.log[-1].status == "refused"
    # and through a federation, as a typed error naming site and task
    fed = fedstats.Federation.in_process({"rogue-site": frame(50)}, registry=rogue_registry())
    with pytest.raises(DisclosureError, match=r"rogue-site.*'leak'"):
        fed.request("leak", {"p": 3}, analysis="test")
    assert fed.inventory.records()[-1].status == "refused"


def test_refused_reply_carries_no_data():
    silo = fedstats.Silo("rogue-site", frame(50), registry=rogue_registry())
    raw = silo.handle(codec.encode({"task": "leak", "args": {"p": 3}}))
    assert len(raw) < 600  # an error record, not 50 floats
    assert not any(isinstance(v, np.ndarray) for v in codec.decode(raw)["error"]["values"].values())


def test_site_below_threshold_is_refused_naming_site_and_task():
    frames = {"big": frame(200, 1), "tiny": frame(8, 2)}
    fed = fedstats.Federation.in_process(frames)
    with pytest.raises(DisclosureError) as info:
        fedstats.LogisticRegression("y ~ x").fit(fed)
    error = info.value
    assert error.site == "tiny" and error.task == "describe"
    assert "fewer patients than the disclosure threshold of 10" in str(error)
    assert "8" not in str(error)  # the site's size below the threshold is not disclosed


def test_threshold_is_configurable_per_study():
    frames = {"a": frame(30, 1), "b": frame(30, 2)}
    strict = fedstats.Federation.in_process(
        frames, disclosure=fedstats.DisclosurePolicy(min_count=40)
    )
    with pytest.raises(DisclosureError, match="threshold of 40"):
        fedstats.LogisticRegression("y ~ x").fit(strict)
    relaxed = fedstats.Federation.in_process(
        # (seed 3: the 8 values of x are not dominated by two rows, see fedstats.site.cell_rules)
        {"a": frame(8, 3), "b": frame(30, 2)},
        disclosure=fedstats.DisclosurePolicy(min_count=5),
    )
    assert fedstats.LogisticRegression("y ~ x").fit(relaxed).n_obs == 38


def test_threshold_applies_to_aggregates_not_only_to_fits():
    silo = fedstats.Silo("small", frame(9), registry=rogue_registry())
    assert ask(silo, "mean_x", {})["error"]["type"] == "DisclosureError"
    assert (
        ask(fedstats.Silo("ok", frame(10), registry=rogue_registry()), "mean_x", {})["status"]
        == "ok"
    )


def test_unregistered_task_is_refused():
    silo = fedstats.Silo("site", frame(50))
    reply = ask(silo, "dump_rows", {})
    assert reply["error"]["type"] == "UnknownTaskError"
    fed = fedstats.Federation({"site": silo.handle})
    with pytest.raises(fedstats.StudyConfigurationError, match="no task 'dump_rows'"):
        fed.request("dump_rows", {}, analysis="t")


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"",
        b"not a message",
        codec.encode([1, 2]),
        codec.encode({"task": 3, "args": {}}),
        codec.encode({"task": "describe"}),
    ],
)
def test_malformed_requests_get_an_error_reply_not_a_crash(request_bytes):
    silo = fedstats.Silo("site", frame(50))
    reply = codec.decode(silo.handle(request_bytes))
    assert reply["status"] == "error"
    assert reply["error"]["type"] == "MalformedRequestError"


def test_internal_failure_reveals_only_the_error_type():
    silo = fedstats.Silo("site", frame(50), registry=rogue_registry())
    fed = fedstats.Federation({"site": silo.handle}, registry=rogue_registry())
    with pytest.raises(InternalSiteError, match="ZeroDivisionError") as info:
        fed.request("crash", {}, analysis="t")
    assert info.value.site == "site"


def test_identifier_like_column_cannot_list_its_levels():
    frames = {"a": frame(100, 1), "b": frame(100, 2)}
    fed = fedstats.Federation.in_process(frames)
    with pytest.raises(DisclosureError, match="'id' has 100 levels"):
        fedstats.LogisticRegression("y ~ C(id)").fit(fed)


def test_saturated_model_is_refused():
    frames = {"a": frame(40, 1).assign(g=lambda d: d["id"] % 20), "b": frame(40, 2).assign(g=0)}
    fed = fedstats.Federation.in_process(
        frames, disclosure=fedstats.DisclosurePolicy(max_level_density=1.0)
    )
    with pytest.raises(DisclosureError, match="design columns"):
        fedstats.LogisticRegression("y ~ x + C(g)").fit(fed)


def test_coordinator_checks_replies_against_the_declared_shape():
    honest = fedstats.Silo("site", frame(50))

    def tampering(request: bytes) -> bytes:
        message = codec.decode(honest.handle(request))
        if message["status"] == "ok" and "gradient" in message["result"]:
            message["result"]["gradient"] = np.zeros(50)
        return codec.encode(message)

    fed = fedstats.Federation({"site": tampering})
    with pytest.raises(InvalidReplyError, match=r"site 'site'.*gradient"):
        fedstats.LogisticRegression("y ~ x").fit(fed)


def test_garbage_reply_bytes_are_an_invalid_reply():
    fed = fedstats.Federation({"site": lambda request: b"garbage"})
    with pytest.raises(InvalidReplyError, match="bad magic"):
        fed.request(
            "describe",
            {"variables": ["x"], "levels_for": [], "levels_known": [], "list_levels": True},
            analysis="t",
        )


def test_a_site_cannot_report_an_error_in_another_sites_name():
    def impostor(request: bytes) -> bytes:
        wire = {
            "type": "DisclosureError",
            "values": {"site": "other", "task": "describe", "reason": "x"},
        }
        return codec.encode({"status": "error", "error": wire})

    fed = fedstats.Federation({"liar": impostor, "other": fedstats.Silo("other", frame(50)).handle})
    with pytest.raises(DisclosureError) as info:
        fed.request(
            "describe",
            {"variables": ["x"], "levels_for": [], "levels_known": [], "list_levels": True},
            analysis="t",
        )
    assert info.value.site == "liar"


def test_inventory_records_every_message_with_bytes_and_time():
    frames = {"a": frame(100, 1), "b": frame(100, 2)}
    fed = fedstats.Federation.in_process(frames)
    result = fedstats.LogisticRegression("y ~ x").fit(fed)
    records = fed.inventory.records(result.provenance.analysis)
    assert {r.site for r in records} == {"a", "b"}
    assert [r.task for r in records[:4]] == ["describe", "describe", "prepare", "prepare"]
    assert sum(r.task == "logistic.summaries" for r in records) == 2 * result.provenance.rounds
    assert all(r.request_bytes > 0 and r.reply_bytes > 0 and r.seconds >= 0 for r in records)
    assert result.provenance.messages == len(records)
    assert result.provenance.reply_bytes == sum(r.reply_bytes for r in records)
    # bytes per reply do not depend on n
    bigger = fedstats.Federation.in_process({"a": frame(5000, 1), "b": frame(5000, 2)})
    big_result = fedstats.LogisticRegression("y ~ x").fit(bigger)
    small_sizes = {r.reply_bytes for r in records if r.task == "logistic.summaries"}
    big_sizes = {
        r.reply_bytes
        for r in bigger.inventory.records(big_result.provenance.analysis)
        if r.task == "logistic.summaries"
    }
    assert max(big_sizes) - min(small_sizes) <= 4  # only the digits of counts may differ


def test_site_log_records_each_release():
    silo = fedstats.Silo("a", frame(100, 1))
    fed = fedstats.Federation({"a": silo.handle})
    fedstats.LogisticRegression("y ~ x").fit(fed)
    assert [e.status for e in silo.log] == ["released"] * len(silo.log)
    assert sum(e.reply_bytes for e in silo.log) == fed.inventory.to_frame()["reply_bytes"].sum()


def test_malformed_beta_is_refused_by_the_site():
    fed = fedstats.Federation.in_process({"a": frame(100, 1)}, verified_paths=False)
    spec = agree_design(fed, "y ~ x", analysis="t").spec
    args = {"design": spec.to_wire(), "beta": np.zeros(5)}
    with pytest.raises(MalformedRequestError, match="'beta' must be an array of 2"):
        fed.request("logistic.summaries", args, analysis="t")


def test_unknown_task_error_is_typed():
    silo = fedstats.Silo("site", frame(50))
    fed = fedstats.Federation({"site": silo.handle}, registry=rogue_registry())
    with pytest.raises(UnknownTaskError, match="site 'site' does not answer task 'leak'"):
        fed.request("leak", {"p": 1}, analysis="t")


json_like = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=10)
    | hnp.arrays(np.float64, hnp.array_shapes(max_dims=2, max_side=3)),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.text(max_size=10).filter(lambda k: not k.startswith("$")), children, max_size=4
        )
    ),
    max_leaves=12,
)


@given(
    task=st.sampled_from(REGISTRY.names()),
    args=st.dictionaries(
        st.sampled_from(
            [
                "variables",
                "levels_for",
                "levels_known",
                "list_levels",
                "design",
                "beta",
                "dp",
                "clip",
                "secagg",
                "session",
                "sites",
                "threshold",
                "fraction_bits",
                "public_keys",
                "survivors",
                "dropped",
                "construction",
                "contributor",
                "neighbours",
                "signers",
                "signatures",
                "holders",
                "scaling",
                "model",
                "hyper",
                "weights",
                "algorithm",
                "lr",
                "batch_size",
                "local_steps",
                "local_epochs",
                "mu",
                "seed",
                "analysis",
                "control",
                "scale",
                "control_scale",
                "dp_sgd",
            ]
        ),
        json_like,
        max_size=4,
    ),
)
@settings(max_examples=300, deadline=None)
def test_any_request_gets_a_well_formed_reply(task, args):
    """Whatever the arguments, the silo answers with an ok or a typed error reply."""
    silo = fedstats.Silo("site", frame(50))
    reply = codec.decode(silo.handle(codec.encode({"task": task, "args": args})))
    assert reply["status"] in ("ok", "error")
    if reply["status"] == "error":
        assert reply["error"]["type"] != "InternalSiteError", silo.log[-1].detail


@given(
    key=st.sampled_from(WIRE_FIELDS),
    value=json_like,
    task=st.sampled_from(["prepare", "logistic.summaries"]),
)
@settings(max_examples=300, deadline=None)
def test_a_corrupted_design_gets_a_typed_refusal(key, value, task):
    fed = fedstats.Federation.in_process({"site": frame(50)})
    spec = agree_design(fed, "y ~ x", analysis="t").spec
    wire = spec.to_wire()
    wire[key] = value
    silo = fed.silos["site"]
    reply = ask(silo, task, {"design": wire, "beta": np.zeros(len(spec.columns))})
    assert reply["status"] in ("ok", "error")
    if reply["status"] == "error":
        assert reply["error"]["type"] != "InternalSiteError", silo.log[-1].detail


def vertical_requests(design: dict) -> dict[str, dict]:
    """Well-formed requests of the vertical tasks (:mod:`fedstats.contract.tasks.vertical`)."""
    from fedstats.contract.tasks import vertical as wire

    key = wire.words_of([(1 << (wire.KEY_BITS - 1)) + 1], wire.MODULUS_WORDS)[0]
    p, base = len(design["columns"]), {"design": design, "linkage": "L"}
    return {
        "vertical.prepare": {**base, "role": "outcome"},
        "vertical.encrypt_outcome": {**base, "n_pairs": 20},
        "vertical.masked_products": {**base, "n_pairs": 20, "registry": "r", "encrypted": {
            "public_key": key, "ciphertexts": np.zeros((20, wire.CIPHERTEXT_WORDS), np.uint64),
            "signature": ""}},
        "vertical.decrypt": {**base, "hospital": "h", "public_key": key, "masked": {
            "masked": np.zeros((p, wire.CIPHERTEXT_WORDS), np.uint64), "signature": ""}},
        "vertical.unmask": {**base, "registry": "r", "decrypted": {
            "values": np.zeros((p, wire.MODULUS_WORDS), np.uint64), "signature": ""}},
        "vertical.summaries": {"design": design, "linkages": {"only": "L"},
                               "beta": np.zeros(p)},
    }  # fmt: skip


def linkage_requests() -> dict[str, dict]:
    """Well-formed requests of the record-linkage tasks
    (:mod:`fedstats.contract.tasks.record_linkage`)."""
    base = {"study": "study", "linkage": "L", "sites": ["only", "other"], "fingerprint": "0" * 64}
    peer = {"public_key": np.zeros(32, np.uint8), "signature": ""}
    return {
        "linkage.advertise": base,
        "linkage.encode": {**base, "records": 200, "clk_bytes": 128, "token_keys": 3,
                           "peer": peer},
        "linkage.accept": {"linkage": "L", "positions": np.arange(20),
                           "pair_ids": np.arange(20)},
    }  # fmt: skip


def test_a_site_requiring_privacy_releases_no_exact_aggregate_of_any_task():
    """Every registered task about patients is refused without a ``dp`` block; only the
    tasks that describe no patient (schema, budget, fingerprint) are answered."""
    rng = np.random.default_rng(3)
    n = 200
    data = pd.DataFrame(
        {"t": rng.exponential(10, n), "e": rng.integers(0, 2, n), "x": rng.normal(size=n),
         "y": rng.integers(0, 2, n), "g": rng.choice(["a", "b"], n)}
    )  # fmt: skip
    policy = fedstats.DisclosurePolicy(require_privacy=True)
    # raw requests at beta = 0: sites that verify paths would refuse them by that rule first
    private = fedstats.Federation.in_process(
        {"only": data}, disclosure=policy, verified_paths=False
    )
    exact = fedstats.Federation.in_process({"only": data}, verified_paths=False)
    survival = fedstats.CoxPH("Surv(t, e) ~ x").agree(exact, "a").spec.to_wire()
    binary = fedstats.LogisticRegression("y ~ x").agree(exact, "b").spec.to_wire()
    beta = np.zeros(1)
    grid = np.array([5.0, 10.0, 20.0])
    requests = {
        "cox.summaries": {"design": survival, "beta": beta, "ties": "efron"},
        "cox.grid_summaries": {"design": survival, "beta": beta, "grid": grid},
        "cox.concordance": {"design": survival, "beta": beta},
        "cox.robust": {"design": survival, "beta": beta, "cluster": None},
        "survival.counts": {"time": "t", "event": "e", "group": None, "levels": [],
                            "grid": grid},
        "competing.counts": {"time": "t", "event": "e", "cause": 1, "group": None,
                             "levels": [], "grid": grid},
        "fine_gray.grid_summaries": {"design": survival, "cause": 1, "beta": beta, "grid": grid,
                                     "censoring": np.ones(3)},
        "fine_gray.robust": {"design": survival, "cause": 1, "beta": beta, "grid": grid,
                             "censoring": np.ones(3), "hazard": np.zeros(3),
                             "means": np.zeros((3, 1))},
        "fairness.summaries": {"design": binary, "beta": np.zeros(2), "group": "g",
                               "levels": ["a", "b"], "temperature": 0.25},
        "logistic.summaries": {"design": binary, "beta": np.zeros(2)},
        "logistic.evaluate": {"design": binary, "beta": np.zeros(2)},
        "glm.summaries": {"design": binary, "beta": np.zeros(2), "family": "binomial"},
        "prepare": {"design": binary},
        "cox.piecewise_summaries": {"design": survival, "beta": beta, "alpha": np.zeros(3),
                                    "grid": grid, "clip": {"row_norm": 1.0,
                                                           "scaling": np.array([[0.0, 1.0]])},
                                    "patient_bounds": {"score": 8.0, "information": 12.0}},
        "deep.train": {"design": binary, "scaling": np.tile([0.0, 1.0], (2, 1)), "model": "linear",
                       "hyper": {}, "weights": [np.zeros((1, 1), np.float32),
                                                np.zeros(1, np.float32)],
                       "algorithm": "fedavg", "lr": 0.1, "batch_size": 10, "local_steps": 1,
                       "analysis": "x"},
        "deep.evaluate": {"design": binary, "scaling": np.tile([0.0, 1.0], (2, 1)),
                          "model": "linear", "hyper": {},
                          "weights": [np.zeros((1, 1), np.float32), np.zeros(1, np.float32)]},
        **vertical_requests(binary),
        **linkage_requests(),
    }  # fmt: skip
    extra_missing = set(REGISTRY.names()) - {t.name for t in REGISTRY}  # deep, not installed
    assert extra_missing <= {"deep.train", "deep.evaluate"}
    requests = {task: args for task, args in requests.items() if task not in extra_missing}
    assert set(requests) == {t.name for t in REGISTRY if t.about_patients}
    private_only = {"cox.piecewise_summaries"}  # no exact form: refused without 'dp' anywhere
    for task, args in requests.items():
        if task in private_only:
            for federation in (exact, private):
                with pytest.raises(fedstats.errors.MalformedRequestError, match="'dp' block"):
                    federation.request(task, args, analysis="x")
            continue
        # vertical and linkage tasks need accepted linkages, identifiers (tests/vertical)
        if not task.startswith(("vertical.", "linkage.")):
            exact.request(task, args, analysis="x")  # each request is well formed
        with pytest.raises(DisclosureError, match="only as a differentially private release"):
            private.request(task, args, analysis="x")
    private.request("harmonize.fingerprint", {}, analysis="x")
