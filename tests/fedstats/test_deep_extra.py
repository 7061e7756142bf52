"""Deep models are an optional extra: without torch and Opacus, fedstats imports, fits and serves
every statistical task, and refuses deep tasks by name.

"Without the extra" is made true in a fresh interpreter by an import hook that finds no
``torch`` and no ``opacus``: any ``import torch`` there raises ``ModuleNotFoundError``, exactly
as on a site that never installed them.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

WITHOUT_DEEP = """
import sys

class NoDeepExtra:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "opacus"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoDeepExtra())
"""

FRAMES = """
import numpy as np
import pandas as pd

def frame(n, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    t = rng.exponential(10.0 * np.exp(-0.5 * x))
    return pd.DataFrame({
        "x": x,
        "y": (rng.random(n) < 1 / (1 + np.exp(-x))).astype(int),
        "t": np.ceil(np.minimum(t, 30.0)),
        "e": (t < 30.0).astype(int),
    })

frames = {"a": frame(300, 1), "b": frame(250, 2)}
"""


def run_python(code: str) -> dict:
    """Run ``code`` in a fresh interpreter; it prints one JSON line as its last output."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_import_fedstats_and_the_cli_load_no_torch() -> None:
    out = run_python(
        """
        import json, sys
        import fedstats
        names = [fedstats.LogisticRegression, fedstats.CoxPH, fedstats.KaplanMeier,
                 fedstats.Federation, fedstats.Silo, fedstats.RecordDP, fedstats.DPFedAvg]
        import fedstats.cli.main, reports, harmonize, accounting
        print(json.dumps({m: m in sys.modules for m in ("torch", "opacus")}))
        """
    )
    assert out == {"torch": False, "opacus": False}


def test_logistic_cox_and_kaplan_meier_fit_without_the_extra() -> None:
    out = run_python(
        WITHOUT_DEEP
        + FRAMES
        + """
import json
import fedstats
fed = fedstats.Federation.in_process(frames)
logit = fedstats.LogisticRegression("y ~ x").fit(fed)
cox = fedstats.CoxPH("Surv(t, e) ~ x").fit(fed)
km = fedstats.KaplanMeier("t", "e", grid=[5.0, 10.0, 20.0, 30.0]).fit(fed)
print(json.dumps({"logit": float(logit.params["x"]), "cox": float(cox.params["x"]),
                  "km": float(km.survival_function_.iloc[-1, 0])}))
"""
    )
    # the same fits in this interpreter (with the extra) give the same numbers
    import fedstats

    namespace: dict = {}
    exec(FRAMES, namespace)
    fed = fedstats.Federation.in_process(namespace["frames"])
    assert out["logit"] == pytest.approx(
        float(fedstats.LogisticRegression("y ~ x").fit(fed).params["x"]), rel=1e-12
    )
    assert out["cox"] == pytest.approx(
        float(fedstats.CoxPH("Surv(t, e) ~ x").fit(fed).params["x"]), rel=1e-12
    )
    assert out["logit"] > 0.5 and out["cox"] > 0.2  # the simulated effects are there
    assert 0.0 <= out["km"] < 1.0


def test_a_site_without_the_extra_refuses_deep_tasks_by_name() -> None:
    out = run_python(
        WITHOUT_DEEP
        + FRAMES
        + """
import json
import numpy as np
import fedstats
from fedstats.errors import StudyConfigurationError, from_wire
from fedstats.contract import codec
fed = fedstats.Federation.in_process(frames)
design = fedstats.LogisticRegression("y ~ x").agree(fed, "b").spec.to_wire()
args = {"design": design, "scaling": np.tile([0.0, 1.0], (2, 1)), "model": "linear",
        "hyper": {}, "weights": [np.zeros((1, 1), np.float32), np.zeros(1, np.float32)]}
silo = fedstats.Silo("north", frames["a"])
reply = codec.decode(silo.handle(codec.encode({"task": "deep.train", "args": args})))
error = from_wire(reply["error"], "north")
try:
    fed.request("deep.evaluate", args, analysis="b")
except StudyConfigurationError as refusal:
    federation = str(refusal)
try:
    fedstats.FederatedTrainer
except ModuleNotFoundError as missing:
    coordinator = str(missing)
print(json.dumps({"status": reply["status"], "type": reply["error"]["type"],
                  "values": reply["error"]["values"], "message": str(error),
                  "logged": silo.log[-1].status, "federation": federation,
                  "coordinator": coordinator, "torch": "torch" in sys.modules}))
"""
    )
    assert out["status"] == "error" and out["type"] == "ExtraNotInstalledError"
    assert out["values"] == {"site": "north", "task": "deep.train", "extra": "deep"}
    assert "site 'north' cannot answer task 'deep.train'" in out["message"]
    assert "pip install 'fedstats[deep]'" in out["message"]
    assert out["logged"] in {"refused", "error"}
    assert "'deep' extra" in out["federation"] and "deep.evaluate" in out["federation"]
    assert "'deep' extra" in out["coordinator"]
    assert "pip install 'fedstats[deep]'" in out["coordinator"]
    assert out["torch"] is False


def test_a_coordinator_with_the_extra_reads_the_refusal_as_a_typed_error() -> None:
    from fedstats.errors import ExtraNotInstalledError, UnknownTaskError, from_wire

    error = from_wire(
        {"type": "ExtraNotInstalledError", "values": {"task": "deep.train", "extra": "deep"}},
        "north",
    )
    assert isinstance(error, ExtraNotInstalledError) and isinstance(error, UnknownTaskError)
    assert (error.site, error.task, error.extra) == ("north", "deep.train", "deep")


def test_with_the_extra_the_deep_tasks_are_served() -> None:
    pytest.importorskip("torch", reason="needs the deep extra: pip install 'fedstats[deep]'")
    from fedstats.site.registry import REGISTRY

    assert {"deep.train", "deep.evaluate"} <= {task.name for task in REGISTRY}
    assert REGISTRY.get("deep.train") is not None
