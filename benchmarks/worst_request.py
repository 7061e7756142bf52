"""The worst request the default resource limits allow, per task family, at the heart-disease
site Cleveland (303 patients): its wall time and peak memory at the site.

For each family the script builds, from :class:`fedstats.site.resource_limits.RequestLimits`
(the defaults, or ``--scale`` times them), the request that asks the most work each limit
allows, and has a fresh :class:`~fedstats.site.silo.Silo` answer it in a child process:

* ``header``: ``describe`` with a JSON header of ``max_header_bytes``;
* ``bytes``: ``describe`` carrying an array of ``max_array_items`` values (capped by
  ``max_request_bytes``), which the site decodes before it refuses the unknown argument;
* ``arrays``: ``survival.counts`` with a time grid of ``max_array_items`` points (capped by
  ``max_request_bytes`` and the task's own 5,000 grid points);
* ``design``: ``prepare`` and ``logistic.summaries`` of a design of ``max_design_columns``
  columns (``C(age)`` with that many agreed levels);
* ``deep_steps``, ``deep_width``, ``deep_private``: ``deep.train`` at ``max_work`` -- the
  most local steps of the smallest network, one step of the widest one, and a DP-SGD round
  with per-example gradients (``engine = "hooks"``) -- each the largest the limit allows.

Memory is measured in a child process (a fresh interpreter, so no parent's memory counts):
``peak_mb`` is the larger of the rise of the process's high-water resident set
(``ru_maxrss``) while the site answers and tracemalloc's peak over the same call (numpy
and Python allocations; torch's own allocations show only in the resident set); the set-up
(imports, frame, building the request, and for deep families one tiny warm-up round that
starts torch's thread pools) is not counted. The reply's status and error type are
printed too: a refusal after the work costs as much as an answer. ``seconds`` is the
slowest request of the family (the target is per request). Prints one JSON line.

    .venv/bin/python benchmarks/worst_request.py [--scale 1.0] [--families header,design]

Target: every family within 2 s and 300 MB.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py shares its name with the ``harmonize`` package: keep this folder
# off the path (also in the spawned children, which inherit it).
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from dataclasses import fields, replace  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

TARGET_SECONDS = 2.0
TARGET_MB = 300.0
FAMILIES = ("header", "bytes", "arrays", "design", "deep_steps", "deep_width", "deep_private")


def limits(scale: float) -> Any:
    """The default limits, each multiplied by ``scale`` (integers stay integers)."""
    from fedstats.site.resource_limits import RequestLimits

    default = RequestLimits()
    scaled = {
        f.name: type(getattr(default, f.name))(max(1, getattr(default, f.name) * scale))
        for f in fields(default)
        if f.name != "max_seconds"
    }
    return replace(default, **scaled)


def design(formula: str, variables: list[str], columns: list[str], levels: dict) -> dict:
    return {
        "formula": formula, "outcome": "disease", "variables": variables, "levels": levels,
        "columns": columns, "site_intercepts": False, "sites": ["cleveland"], "offset": None,
        "missing": "raise", "outcome_kind": "binary", "strata": [], "weights": None,
        "exposure": None,
    }  # fmt: skip


def deep_args(hidden: list[int], steps: int, batch: int, private: bool) -> dict:
    from fedstats.deep.shared.models import build_model
    from fedstats.deep.shared.wire import DP_GROUP

    spec = design("disease ~ age + chol", ["age", "chol", "disease"],
                  ["Intercept", "age", "chol"], {})  # fmt: skip
    model = build_model("mlp", 2, {"hidden": hidden})
    args = {
        "design": spec, "scaling": np.array([[0.0, 1.0], [50.0, 30.0], [250.0, 150.0]]),
        "model": "mlp", "hyper": {"hidden": hidden},
        "weights": [p.detach().numpy().copy() for p in model.parameters()],
        "algorithm": "fedavg", "lr": 0.01, "batch_size": batch, "local_steps": steps,
        "analysis": "worst",
    }  # fmt: skip
    if private:
        args["dp_sgd"] = {"sample_rate": 1.0, "noise_multiplier": 1.0, "max_grad_norm": 1.0,
                          "steps": steps, "engine": "hooks"}  # fmt: skip
        args["dp"] = {"noise_multipliers": {DP_GROUP: 1.0}, "study": "worst",
                      "analysis": "worst", "note": ""}  # fmt: skip
    return args


def params_of(hidden: list[int]) -> int:
    from fedstats.deep.shared.models import count_parameters

    return count_parameters("mlp", 2, {"hidden": hidden})


def widest(budget: float) -> list[int]:
    """The widest one-layer network whose parameters stay within ``budget``."""
    low, high = 1, 4096
    while low < high:
        mid = (low + high + 1) // 2
        low, high = (mid, high) if params_of([mid]) <= budget else (low, mid - 1)
    return [low]


def requests(family: str, lim: Any, rows: int) -> list[dict]:
    """The requests of one family, largest the limits allow (only a deep family imports the
    deep extra)."""
    if family == "header":
        count = (lim.max_header_bytes - 200) // len('"age",')
        return [{"task": "describe", "args": {"variables": ["age"] * count}}]
    if family == "bytes":
        items = min(lim.max_array_items, (lim.max_request_bytes - 4096) // 8)
        return [{"task": "describe", "args": {"variables": ["age"], "padding": np.ones(items)}}]
    if family == "arrays":
        from fedstats.contract.tasks.survival import MAX_GRID

        items = min(lim.max_array_items, (lim.max_request_bytes - 4096) // 8, MAX_GRID)
        grid = np.linspace(0.0, 100.0, items)
        args = {"grid": grid, "time": "age", "event": "disease", "group": None}
        return [{"task": "survival.counts", "args": args}]
    if family == "design":
        levels = list(range(lim.max_design_columns - 1))  # with the intercept: the limit
        columns = ["Intercept", *[f"C(age)[T.{v}]" for v in levels[1:]]]
        spec = design("disease ~ C(age)", ["age", "disease"], columns, {"age": levels})
        return [{"task": "prepare", "args": {"design": spec}},
                {"task": "logistic.summaries",
                 "args": {"design": spec, "beta": np.zeros(len(columns))}}]  # fmt: skip
    if family == "deep_steps":
        from fedstats.deep.shared.wire import MAX_STEPS
        from fedstats.deep.site.tasks import STEP_UNITS

        steps = int(min(MAX_STEPS, lim.max_work // STEP_UNITS))
        return [{"task": "deep.train", "args": deep_args([1], steps, 1, private=False)}]
    if family == "deep_width":
        batch = min(32, rows)
        hidden = widest(lim.max_work / batch)
        return [{"task": "deep.train", "args": deep_args(hidden, 1, batch, private=False)}]
    if family == "deep_private":
        hidden = widest(lim.max_work / rows)
        return [{"task": "deep.train", "args": deep_args(hidden, 1, rows, private=True)}]
    raise ValueError(family)


def measure(family: str, scale: float) -> dict[str, Any]:
    """In the child: build the family's requests, then time one fresh silo answering them."""
    import accounting
    import fedstats
    from fedstats.contract import codec
    from fedstats.site.silo import Silo

    frame = fedstats.datasets.heart_disease().frames["cleveland"]
    lim = limits(scale)
    folder = Path(tempfile.mkdtemp(prefix="worst-request-"))
    ledger = accounting.Ledger(folder / "site.ledger") if family == "deep_private" else None
    if ledger is not None:
        ledger.set_budget(accounting.Scope("patient", "cleveland", "worst"), 1e6, 1e-5)
    silo = Silo("cleveland", frame, limits=lim, ledger=ledger, noise_seed=0)
    encoded = [codec.encode(r) for r in requests(family, lim, len(frame))]
    if family.startswith("deep"):  # torch's first step (thread pools, kernels) is not timed
        warm = Silo("cleveland", frame, noise_seed=0)
        warm.handle(codec.encode({"task": "deep.train",
                                  "args": deep_args([1], 1, 1, private=False)}))  # fmt: skip
    replies, seconds = [], []
    tracemalloc.start()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for request in encoded:
        started = time.perf_counter()
        replies.append(codec.decode(silo.handle(request)))
        seconds.append(time.perf_counter() - started)
    rss = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    traced = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return {
        "seconds": round(max(seconds), 3),
        "peak_mb": round(max(rss, traced), 1),
        "request_mb": round(sum(len(r) for r in encoded) / 2**20, 2),
        "replies": [r["status"] if r["status"] == "ok" else r["error"]["type"] for r in replies],
    }  # fmt: skip


def run(families: tuple[str, ...] = FAMILIES, scale: float = 1.0) -> dict[str, Any]:
    """Each family in a fresh Python process; the result of each and whether all met the
    target (at ``scale`` 1.0)."""
    out: dict[str, Any] = {"scale": scale, "families": {}}
    for family in families:
        command = [sys.executable, str(Path(__file__).resolve()), "--child", family,
                   "--scale", repr(scale)]  # fmt: skip
        done = subprocess.run(command, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise SystemExit(f"family {family!r} failed:\n{done.stderr[-2000:]}")
        out["families"][family] = json.loads(done.stdout.strip().splitlines()[-1])
    worst_s = max(r["seconds"] for r in out["families"].values())
    worst_mb = max(r["peak_mb"] for r in out["families"].values())
    out["worst_seconds"], out["worst_peak_mb"] = worst_s, worst_mb
    out["target"] = {"seconds": TARGET_SECONDS, "peak_mb": TARGET_MB}
    out["within_target"] = worst_s <= TARGET_SECONDS and worst_mb <= TARGET_MB
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every limit by this")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--child", choices=FAMILIES, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child is not None:
        result = measure(options.child, options.scale)
    else:
        result = run(tuple(options.families.split(",")), options.scale)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
