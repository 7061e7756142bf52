"""Floors and order: a small-cell threshold below 2, unsafe names, and work done before refusing.

The attacks: ``k_cell = 1`` was accepted silently and switched the cell rules
and the differencing guard off (a cell of one patient is that patient); a site
or fit named ``.`` or ``..`` (or holding a path separator) became a folder name
outside the study's own; and requests with 100,000 agreed levels, a
268M-parameter network or a 64 MB header cost seconds and a gigabyte before
the site refused them.
"""

from __future__ import annotations

import pytest

from fedstats.errors import StudyConfigurationError
from fedstats.site.disclosure import DisclosurePolicy


@pytest.mark.parametrize("k_cell", [1, 0, -3, 1.5, 2.0, True, "3"])
def test_a_cell_threshold_below_two_is_refused_with_the_reason(k_cell):
    with pytest.raises(StudyConfigurationError, match="k_cell") as info:
        DisclosurePolicy(k_cell=k_cell)
    assert "one patient" in str(info.value) or "integer" in str(info.value)


def test_min_count_one_keeps_a_cell_threshold_of_two():
    """``min_count = 1`` (the threshold rule off) does not switch the cell rules off."""
    assert DisclosurePolicy(min_count=1).k_cell == 2
    assert DisclosurePolicy().k_cell == 3
    assert DisclosurePolicy(k_cell=2).k_cell == 2


def test_site_toml_refuses_k_cell_one(tmp_path):
    from fedstats.errors import ConfigError
    from fedstats.jobs.site_config import load_site_config

    frame = tmp_path / "frame.parquet"
    frame.write_bytes(b"")
    (tmp_path / "site.toml").write_text(
        '[site]\nname = "region_1"\nworkdir = "work"\n'
        '[data]\nframe = "frame.parquet"\n'
        '[privacy]\nledger = "site.ledger"\n'
        "[disclosure]\nk_cell = 1\n"
    )
    with pytest.raises(ConfigError) as info:
        load_site_config(tmp_path / "site.toml")
    message = str(info.value)
    assert str(tmp_path / "site.toml") in message and "disclosure.k_cell" in message
    assert "one patient" in message


UNSAFE_NAMES = [
    ".", "..", "../x", "a/b", "a\\b", ".hidden", "-x", "_x", "a\nb", "C:", "", "x" * 101
]  # fmt: skip


@pytest.mark.parametrize("name", UNSAFE_NAMES)
def test_a_silo_refuses_an_unsafe_site_name(name):
    import pandas as pd

    from fedstats.site.silo import Silo

    with pytest.raises(StudyConfigurationError, match="site name"):
        Silo(name, pd.DataFrame({"x": [1.0, 2.0]}))


def _toml(text: str) -> str:
    import json

    return json.dumps(text)  # a TOML basic string


@pytest.mark.parametrize("name", [".", "..", "../up", "a/b", ".x", "-x"])
def test_site_toml_refuses_an_unsafe_site_name_naming_the_file_and_field(tmp_path, name):
    from fedstats.errors import ConfigError
    from fedstats.jobs.site_config import load_site_config

    path = tmp_path / "site.toml"
    path.write_text(
        f'[site]\nname = {_toml(name)}\nworkdir = "work"\n'
        '[data]\nframe = "frame.parquet"\n[privacy]\nledger = "site.ledger"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_site_config(path)
    assert str(path) in str(info.value) and "site.name" in str(info.value)
    assert "starting with a letter or digit" in str(info.value)


STUDY = """[study]
name = {study}
sites = [{site}]
out = "out"

[coordinator]
superlink = "127.0.0.1:8000"
insecure = true

[[fits]]
kind = "logistic"
name = {fit}
formula = "y ~ x"
"""


@pytest.mark.parametrize(
    ("where", "field"),
    [("study", "study.name"), ("site", "study.sites"), ("fit", "fits.0")],
)
@pytest.mark.parametrize("name", [".", "..", "../up", "a/b"])
def test_study_toml_refuses_unsafe_study_site_and_fit_names(tmp_path, where, field, name):
    from fedstats.errors import ConfigError
    from fedstats.jobs.study_config import load_study_config

    names = {"study": _toml("s1"), "site": _toml("region_0"), "fit": _toml("fit_1")}
    path = tmp_path / "study.toml"
    path.write_text(STUDY.format(**names))
    load_study_config(path)  # the honest file reads
    path.write_text(STUDY.format(**{**names, where: _toml(name)}))
    with pytest.raises(ConfigError) as info:
        load_study_config(path)
    assert str(path) in str(info.value) and field in str(info.value)


@pytest.mark.parametrize("name", [".", "..", "../up", ".x"])
def test_the_recorder_refuses_unsafe_fit_and_site_names(tmp_path, name):
    from reports.errors import RecordingError
    from reports.layout import checked_name

    with pytest.raises(RecordingError, match="starting with a letter or digit"):
        checked_name("fit", name)
    assert checked_name("fit", "fit_1.v2") == "fit_1.v2"


LOOK_ALIKES = [
    "regi\u043en_1",  # Cyrillic o
    "r\u0435gion_1",  # Cyrillic e
    "region_\uff11",  # fullwidth digit one
    "\u0130stanbul",  # dotted capital I
    "region_1\u200b",  # zero-width space
    "site\u00a0a",  # no-break space
    "a\u202eb",  # right-to-left override
    "\ufb01t_1",  # the ligature fi
    "\u212a",  # Kelvin sign, which case-folds to K
]


@pytest.mark.parametrize("name", [*LOOK_ALIKES, "region_1.", "fit_1.v2."])
def test_a_name_with_a_unicode_look_alike_or_a_trailing_dot_is_refused_everywhere(tmp_path, name):
    """A site named with a Cyrillic letter or an invisible character would read as an
    enrolled site's name in a log or a report, and Windows drops a trailing dot from a file
    or folder name (``region_1.`` is ``region_1``); every layer refuses both for the same
    reason."""
    import pandas as pd

    from fedstats.errors import ConfigError
    from fedstats.jobs.site_config import load_site_config
    from fedstats.site.silo import Silo
    from reports.errors import RecordingError
    from reports.layout import checked_name

    with pytest.raises(StudyConfigurationError, match="site name"):
        Silo(name, pd.DataFrame({"x": [1.0, 2.0]}))
    with pytest.raises(RecordingError, match="starting with a letter or digit"):
        checked_name("site", name)
    path = tmp_path / "site.toml"
    path.write_text(
        f'[site]\nname = {_toml(name)}\nworkdir = "work"\n'
        '[data]\nframe = "frame.parquet"\n[privacy]\nledger = "site.ledger"\n'
    )
    with pytest.raises(ConfigError) as info:
        load_site_config(path)
    assert "site.name" in str(info.value)


# ----------------------------------------------------------------- order: limits before work
class SpyRegistry:
    """The site's registry, with every handler, data check and cost of a task counted."""

    def __init__(self) -> None:
        from fedstats.site.registry import REGISTRY

        self.calls: list[str] = []
        self._registry = REGISTRY

    def get(self, name: str):
        import dataclasses

        task = self._registry.get(name)
        if task is None:
            return None

        def spy(what, function):
            if function is None:
                return None

            def called(*args):
                self.calls.append(what)
                return function(*args)

            return called

        return dataclasses.replace(
            task,
            handler=spy("handler", task.handler),
            validate=spy("validate", task.validate),
            cost=spy("cost", task.cost),
        )


def cleveland():
    from fedstats.datasets import heart_disease

    return heart_disease().frames["cleveland"]


def ask_timed(silo, request: bytes) -> tuple[dict, float]:
    import time

    from fedstats.contract import codec

    started = time.perf_counter()
    reply = codec.decode(silo.handle(request))
    return reply, time.perf_counter() - started


def test_a_design_of_100000_agreed_levels_is_refused_before_any_work():
    """The attack cost 18.7 s and 1 GB at Cleveland's 303 rows before the site refused it."""
    from fedstats.contract import codec
    from fedstats.site.resource_limits import RequestLimits
    from fedstats.site.silo import Silo

    spy = SpyRegistry()
    silo = Silo("cleveland", cleveland(), registry=spy)
    levels = list(range(100_000))
    design = {
        "formula": "disease ~ C(cp)", "outcome": "disease", "variables": ["cp", "disease"],
        "levels": {"cp": levels}, "columns": ["Intercept", "C(cp)[T.1]"],
        "site_intercepts": False, "sites": ["cleveland"], "offset": None, "missing": "raise",
        "outcome_kind": "binary", "strata": [], "weights": None, "exposure": None,
    }  # fmt: skip
    request = codec.encode({"task": "prepare", "args": {"design": design}})
    reply, seconds = ask_timed(silo, request)  # the default limits: its header is too long
    assert reply["status"] == "error" and reply["error"]["type"] == "ResourceLimitError"
    assert reply["error"]["values"]["limit"] in ("max_header_bytes", "max_design_columns")
    assert spy.calls == [] and seconds < 1.0
    wide = Silo(
        "cleveland", cleveland(), registry=spy, limits=RequestLimits(max_header_bytes=2**22)
    )
    reply, seconds = ask_timed(wide, request)  # a site allowing long headers counts columns
    assert reply["error"]["type"] == "ResourceLimitError"
    assert reply["error"]["values"]["limit"] == "max_design_columns"
    assert spy.calls == [] and seconds < 1.0
    assert wide.log[-1].reason == "resources"


@pytest.mark.parametrize(
    "formula",
    [
        "disease ~ C(cp):C(restecg):C(exang)",
        "disease ~ C(cp)*C(restecg)*C(exang)",
        "disease ~ (C(cp) + C(restecg) + C(exang))**3",
        "disease ~ cp:restecg:exang",
    ],
)
def test_levels_that_multiply_through_an_interaction_are_refused_before_any_work(formula):
    """Three factors of 11 agreed levels each: a header of 450 bytes, a design of 1,331
    columns and more (above ``max_design_columns``), which no single factor shows."""
    from fedstats.contract import codec
    from fedstats.site.resource_limits import design_width
    from fedstats.site.silo import Silo

    spy = SpyRegistry()
    silo = Silo("cleveland", cleveland(), registry=spy)
    design = {
        "formula": formula, "outcome": "disease",
        "variables": ["cp", "restecg", "exang", "disease"],
        "levels": {v: list(range(11)) for v in ("cp", "restecg", "exang")},
        "columns": ["Intercept"], "site_intercepts": False, "sites": ["cleveland"],
        "offset": None, "missing": "raise", "outcome_kind": "binary", "strata": [],
        "weights": None, "exposure": None,
    }  # fmt: skip
    assert design_width(design) > 11**3
    request = codec.encode({"task": "prepare", "args": {"design": design}})
    assert len(request) < 1_000
    reply, seconds = ask_timed(silo, request)
    assert reply["error"]["type"] == "ResourceLimitError", reply
    assert reply["error"]["values"]["limit"] == "max_design_columns"
    assert spy.calls == [] and seconds < 1.0


@pytest.mark.deep
def test_a_network_of_268_million_parameters_is_refused_before_it_is_built():
    """The attack (16 hidden layers of 4,096, a few weights sent) cost 6.4 s and 1.44 GB."""
    import numpy as np

    from fedstats.contract import codec
    from fedstats.site.silo import Silo

    spy = SpyRegistry()
    spy.get("deep.train")  # torch and Opacus are imported on the first deep request
    silo = Silo("cleveland", cleveland(), registry=spy)
    design = {
        "formula": "disease ~ age + chol", "outcome": "disease",
        "variables": ["age", "chol", "disease"], "levels": {},
        "columns": ["Intercept", "age", "chol"], "site_intercepts": False,
        "sites": ["cleveland"], "offset": None, "missing": "raise", "outcome_kind": "binary",
        "strata": [], "weights": None, "exposure": None,
    }  # fmt: skip
    args = {
        "design": design, "scaling": np.array([[0.0, 1.0]] * 3), "model": "mlp",
        "hyper": {"hidden": [4096] * 16}, "weights": [np.zeros(3, dtype=np.float32)],
        "algorithm": "fedavg", "lr": 0.1, "batch_size": 8, "local_steps": 1, "analysis": "a",
    }  # fmt: skip
    reply, seconds = ask_timed(silo, codec.encode({"task": "deep.train", "args": args}))
    assert reply["status"] == "error", reply
    assert reply["error"]["type"] == "MalformedRequestError"
    assert "parameters" in reply["error"]["values"]["reason"]
    assert spy.calls == [] and seconds < 1.0


def deep_train_args(hidden: list[int], steps: int, *, private: bool) -> dict:
    """An honest ``deep.train`` request at Cleveland (weights that match the network)."""
    import numpy as np

    from fedstats.deep.shared.models import build_model
    from fedstats.deep.shared.wire import DP_GROUP

    design = {
        "formula": "disease ~ age + chol", "outcome": "disease",
        "variables": ["age", "chol", "disease"], "levels": {},
        "columns": ["Intercept", "age", "chol"], "site_intercepts": False,
        "sites": ["cleveland"], "offset": None, "missing": "raise", "outcome_kind": "binary",
        "strata": [], "weights": None, "exposure": None,
    }  # fmt: skip
    model = build_model("mlp", 2, {"hidden": hidden})
    args = {
        "design": design, "scaling": np.array([[0.0, 1.0], [50.0, 30.0], [250.0, 150.0]]),
        "model": "mlp", "hyper": {"hidden": hidden},
        "weights": [p.detach().numpy().copy() for p in model.parameters()],
        "algorithm": "fedavg", "lr": 0.01, "batch_size": 32, "local_steps": steps,
        "analysis": "a",
    }  # fmt: skip
    if private:
        args["dp_sgd"] = {"sample_rate": 0.1, "noise_multiplier": 1.0, "max_grad_norm": 1.0,
                          "steps": steps, "engine": "auto"}  # fmt: skip
        args["dp"] = {"noise_multipliers": {DP_GROUP: 1.0}, "study": "st", "analysis": "a",
                      "note": ""}  # fmt: skip
    return args


@pytest.mark.deep
def test_training_work_counts_every_step_and_every_example_a_step_passes(tmp_path):
    """``max_work`` counts local steps x examples per step x parameters, with at least
    ``STEP_UNITS`` per step: 501 steps of the smallest network are refused (a step's fixed
    overhead); one private step of a 700,000-parameter network is refused (per-example
    gradients of all 303 rows), while the same step without privacy (a batch of 32) is
    within the limit. Refused before any row is read and before anything is charged."""
    import accounting
    from fedstats.contract import codec
    from fedstats.deep.site.tasks import STEP_UNITS, train_cost
    from fedstats.site.resource_limits import RequestLimits
    from fedstats.site.silo import Silo

    limit = RequestLimits().max_work
    assert limit == 500 * STEP_UNITS
    spy = SpyRegistry()
    spy.get("deep.train")  # torch and Opacus are imported on the first deep request
    book = accounting.Ledger(tmp_path / "site.ledger")
    scope = accounting.Scope("patient", "cleveland", "st")
    book.set_budget(scope, 1e6, 1e-5)
    silo = Silo("cleveland", cleveland(), registry=spy, ledger=book)
    wide = [4096, 170]
    for args in (deep_train_args([1], 501, private=False), deep_train_args(wide, 1, private=True)):
        reply, seconds = ask_timed(silo, codec.encode({"task": "deep.train", "args": args}))
        assert reply["error"]["type"] == "ResourceLimitError", reply
        assert reply["error"]["values"]["limit"] == "max_work"
        assert spy.calls == ["cost"] and seconds < 1.0
        spy.calls.clear()
    assert book.entries(scope) == []
    assert train_cost(silo._context, deep_train_args([1], 500, private=False)) == limit
    assert train_cost(silo._context, deep_train_args(wide, 1, private=False)) < limit


def test_a_64_megabyte_header_is_refused_before_it_is_parsed():
    """The attack cost 17.6 s and 1.1 GB: the JSON was parsed before any limit was checked."""
    import struct

    from fedstats.site.resource_limits import RequestLimits
    from fedstats.site.silo import Silo

    spy = SpyRegistry()
    silo = Silo("cleveland", cleveland(), registry=spy, limits=RequestLimits())
    body = (
        b'{"v":{"task":"describe","args":{"variables":['
        + b'"age",' * (11 * 2**20)
        + b'"age"]}},"b":[]}'
    )
    request = b"FSC1" + struct.pack("<I", len(body)) + body
    assert len(body) > 64 * 2**20 - 2**20
    reply, seconds = ask_timed(silo, request)
    assert reply["status"] == "error" and reply["error"]["type"] == "ResourceLimitError"
    assert reply["error"]["values"]["limit"] in ("max_header_bytes", "max_request_bytes")
    assert spy.calls == [] and seconds < 1.0
    small = RequestLimits(max_request_bytes=2**30, max_header_bytes=2**20)
    silo = Silo("cleveland", cleveland(), registry=spy, limits=small)
    reply, seconds = ask_timed(silo, request)
    assert reply["error"]["values"]["limit"] == "max_header_bytes" and seconds < 1.0


def test_the_site_service_refuses_a_64_megabyte_header_before_it_is_parsed(tmp_path):
    """``fedstats site run`` answers through :class:`~fedstats.jobs.site_service.SiteService`,
    which journals each request's task before the silo runs: reading that task decoded the
    whole request first, and the header limit was passed by (the attack's seconds and
    gigabyte came back). A request the limits refuse is journalled with no task."""
    import json
    import struct
    import time

    import tomli_w

    from fedstats.contract import codec
    from fedstats.jobs.site_config import load_site_config
    from fedstats.jobs.site_journal import JOURNAL_FILE
    from fedstats.jobs.site_service import SiteService

    cleveland().to_parquet(tmp_path / "frame.parquet")
    config = {
        "site": {"name": "cleveland", "workdir": str(tmp_path / "work")},
        "data": {"frame": str(tmp_path / "frame.parquet")},
        "privacy": {"ledger": str(tmp_path / "site.ledger")},
        "disclosure": {"verified_paths": False},  # no roster: the site says it does not verify
    }
    (tmp_path / "site.toml").write_text(tomli_w.dumps(config), encoding="utf-8")
    service = SiteService(load_site_config(tmp_path / "site.toml"))
    body = b'{"v":{"task":"describe","args":{"variables":[' + b'"age",' * (10 * 2**20)
    request = b"FSC1" + struct.pack("<I", len(body) + 16) + body + b'"age"]}},"b":[]}'
    assert len(request) < service.silo.limits.max_request_bytes  # only the header is too long
    try:
        started = time.perf_counter()
        reply = codec.decode(service.answer(request))
        seconds = time.perf_counter() - started
    finally:
        service.close()
    assert reply["error"]["type"] == "ResourceLimitError", reply
    assert reply["error"]["values"]["limit"] == "max_header_bytes"
    assert seconds < 1.0
    lines = (tmp_path / "work" / JOURNAL_FILE).read_text().splitlines()
    received = [json.loads(line) for line in lines if '"received"' in line]
    assert received[-1]["task"] == "?"


@pytest.mark.parametrize("declared", [0, 16, 512 * 2**10, 512 * 2**10 + 1, 3 * 2**20, 2**32 - 1])
@pytest.mark.parametrize("body_bytes", [2, 3 * 2**20])
def test_a_header_length_that_lies_is_refused_before_any_work(declared, body_bytes):
    """The first eight bytes declare the header's length: declaring less than the header
    holds cuts the JSON (malformed); declaring more than the limit is refused from the
    declaration alone, whatever follows (also on a message of a few bytes); declaring more
    than the message holds is a truncated header. Never an internal failure, no task runs."""
    import struct

    from fedstats.site.silo import Silo

    spy = SpyRegistry()
    silo = Silo("cleveland", cleveland(), registry=spy)
    if body_bytes == 2:
        body = b"{}"
    else:
        body = b'{"v":{"task":"describe","args":{"variables":['
        body += b'"age",' * ((body_bytes - len(body)) // 6) + b'"age"]}},"b":[]}'
    reply, seconds = ask_timed(silo, b"FSC1" + struct.pack("<I", declared) + body)
    error = reply["error"]
    if declared > 512 * 2**10:  # the default max_header_bytes
        assert error["type"] == "ResourceLimitError", reply
        assert error["values"]["limit"] == "max_header_bytes"
    else:
        assert error["type"] == "MalformedRequestError", reply
    assert spy.calls == [] and seconds < 1.0


@pytest.mark.parametrize("field", ["max_header_bytes", "max_design_columns"])
@pytest.mark.parametrize("value", [0, -1, True, "10"])
def test_the_new_limits_must_be_positive_numbers(field, value):
    from fedstats.site.resource_limits import RequestLimits

    with pytest.raises(StudyConfigurationError, match=field):
        RequestLimits(**{field: value})


def test_the_worst_request_benchmark_runs_at_a_tiny_size():
    """``benchmarks/worst_request.py`` at 1% of every limit: each family answers or refuses
    with a typed error (never an internal failure) and is measured."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "worst_request.py"
    spec = importlib.util.spec_from_file_location("worst_request", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    families = ("header", "bytes", "arrays", "design")
    if importlib.util.find_spec("torch") is not None:
        families += ("deep_steps", "deep_private")
    result = module.run(families, scale=0.01)
    assert set(result["families"]) == set(families)
    for measured in result["families"].values():
        assert measured["seconds"] >= 0 and measured["peak_mb"] >= 0
        assert "InternalSiteError" not in measured["replies"]
