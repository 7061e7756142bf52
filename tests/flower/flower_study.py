"""The study shared by the Flower equality tests: its sites and its fits, one of each kind."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager

from fedstats.flower.local_study import LocalStudy

DEEP_EXTRA = all(importlib.util.find_spec(name) is not None for name in ("torch", "opacus"))
"""Without the deep extra the study has no deep fit (its tests are marked ``deep``)."""

SITES = ["region_0", "region_1", "region_2"]
COVARIATES = ["age_at_index", "ajcc_pathologic_n_n1", "prior_malignancy_yes"]
TERMS = " + ".join(COVARIATES)
FITS = f"""
[[fits]]
kind = "logistic"
name = "event_logistic"
formula = "event ~ {TERMS}"

[[fits]]
kind = "glm"
name = "death_rate"
formula = "event ~ {TERMS}"
family = "poisson"
exposure = "time"

[[fits]]
kind = "cox"
name = "survival_cox"
formula = "Surv(time, event) ~ {TERMS}"
strata = "site"

[[fits]]
kind = "kaplan_meier"
name = "survival_by_nodes"
time = "time"
event = "event"
group = "ajcc_pathologic_n_n0_i"
width = 365
horizon = 3650
sparse_events = "defer"
"""

DEEP_FIT = f"""
[[fits]]
kind = "deep"
name = "event_mlp"
model = "mlp"
formula = "event ~ {TERMS}"
algorithm = "fedavg"
rounds = 3
local_steps = 5
lr = 0.1
batch_size = 32
seed = 20240611

[fits.hyper]
hidden = [8]

[fits.bounds]
age_at_index = [20, 95]
ajcc_pathologic_n_n1 = [0, 1]
prior_malignancy_yes = [0, 1]
"""
if DEEP_EXTRA:
    FITS += DEEP_FIT


@contextmanager
def stopped_after(local: LocalStudy) -> Iterator[LocalStudy]:
    """``local`` while the block runs; then it is closed and every process it started has exited."""
    try:
        yield local
    finally:
        local.close()
        for process in local.all_processes() + local.stopped:
            assert process.poll() is not None, f"process {process.args} still runs"
