"""Shared fixtures: the real heart-disease sites and a synthetic 10-site study."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest
from _pytest.nodes import coerce_node_id
from hypothesis import settings

from fedstats import datasets

# Property tests check what an input does, not how long it takes (timings belong to
# benchmarks/): Hypothesis' default 200 ms deadline per example failed a test on a loaded
# 2-core machine (an example took 250 ms once and 136 ms when replayed).
settings.register_profile("fedstats", deadline=None)
settings.load_profile("fedstats")


@pytest.fixture(scope="session")
def heart() -> datasets.SiteFrames:
    return datasets.heart_disease()


@pytest.fixture(scope="session")
def heart_exact(heart) -> datasets.SiteFrames:
    """The hospitals that answer exact heart-disease analyses (Switzerland's cells are too
    small: :data:`fedstats.datasets.HEART_EXACT_SITES`)."""
    return heart.only(datasets.HEART_EXACT_SITES)


@pytest.fixture(scope="session")
def synthetic_sites() -> dict[str, pd.DataFrame]:
    sizes = [120, 800, 350, 60, 1000, 240, 500, 90, 700, 400]
    return datasets.synthetic_logistic(n_sites=10, n_per_site=sizes, n_covariates=4, seed=7)


def pooled(frames: dict[str, pd.DataFrame], with_site: bool = False) -> pd.DataFrame:
    out = pd.concat(frames.values(), ignore_index=True)
    if with_site:
        out["site"] = np.repeat(list(frames), [len(f) for f in frames.values()])
    return out


DEEP_EXTRA = all(importlib.util.find_spec(name) is not None for name in ("torch", "opacus"))
"""Whether the ``deep`` extra (torch, Opacus) is installed; tests marked ``deep`` need it."""
DEEP_SKIP = "needs the deep extra (torch, Opacus): pip install 'fedstats[deep]'"


SERIAL_GROUPS = ("flower", "simulation", "reports", "notebooks")
"""Test folders whose tests share processes, ports or a session's study: under
``pytest -n 2 --dist loadgroup`` each folder runs on one worker, in order."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Without the deep extra, tests marked ``deep`` are skipped, saying why; the tests of
    each folder in :data:`SERIAL_GROUPS`, and of each ``xdist_group``, are kept on one
    worker."""
    for item in items:
        folder = item.path.parent.name
        if folder in SERIAL_GROUPS:
            item.add_marker(pytest.mark.xdist_group(folder))
        if not DEEP_EXTRA and item.get_closest_marker("deep") is not None:
            item.add_marker(pytest.mark.skip(reason=DEEP_SKIP))
        if getattr(config.option, "loadgroup", False):  # set on the workers by pytest-xdist
            _name_group(item)


def _name_group(item: pytest.Item) -> None:
    """End the test's id with ``@group``, which is how pytest-xdist's ``loadgroup`` finds a
    group. pytest-xdist 3.8 writes the suffix to ``item._nodeid``, which pytest 9.2 no longer
    reads (ids are ``item._id``), so without this every group is split across workers (two
    Flower studies at once, a session's study made once per worker)."""
    groups = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                     for m in item.iter_markers("xdist_group")})  # fmt: skip
    if groups and "@" not in item.nodeid.rsplit("::", 1)[-1]:
        item._id = coerce_node_id(f"{item.nodeid}@{'_'.join(groups)}")
