"""Every private release bounds one *patient's* contribution, whatever rows the patient has.

A site's frame may hold several rows per patient (its index names each row's
patient, :func:`fedstats.site.patient_rows.patients_of`). The Gaussian
mechanism's guarantee is per unit whose removal the sensitivity bounds: a
sensitivity computed for one row protects a patient of ``m`` rows only at
``m`` times the charged epsilon's scale. So for every task the site registry
serves with ``private_release`` or ``private_training``, on frames of 1 to 5
rows per patient, removing one patient must move each noisy group of the
reply (before noise; the group's fields flattened and stacked, the upper
triangle of a symmetric one, as :mod:`fedstats.site.private_release` adds
the noise) by at most the L2 sensitivity the group is charged — or the task
refuses the frame with a typed error before any charge.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from lifelines.datasets import load_stanford_heart_transplants

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.contract.dp_request import NoisyGroup
from fedstats.site.private_release import noisy_groups
from fedstats.site.registry import REGISTRY
from fedstats.site.silo import Silo
from fedstats.site.task import Task, TaskRegistry, TaskReply

SITE = "only"
STUDY = "st"
GRID = np.array([1.0, 2.0, 4.0])
POLICY = fedstats.DisclosurePolicy(min_count=2)
TOLERANCE = 1e-9


def _agreed(formula: str) -> dict:
    """An agreed design's wire form, from a one-row-per-patient frame of the same columns."""
    rng = np.random.default_rng(0)
    n = 60
    frame = pd.DataFrame(
        {"x": rng.uniform(-3, 3, n), "w": rng.uniform(-3, 3, n), "y": np.tile([0, 1], n // 2),
         "t": rng.uniform(0.1, 5, n), "e": np.tile([1, 0, 1], n // 3)}
    )  # fmt: skip
    fed = fedstats.Federation.in_process({SITE: frame})
    if formula.startswith("Surv("):
        model = fedstats.CoxPH(formula, missing="drop")
    else:
        model = fedstats.LogisticRegression(formula, missing="drop")
    return model.agree(fed, "agree").spec.to_wire()


BINARY = _agreed("y ~ x + w")
SURVIVAL = _agreed("Surv(t, e) ~ x + w")
SCALING = np.array([[0.0, 1.0], [0.0, 3.0], [0.0, 3.0]])
CLIP = {"row_norm": 1.5, "scaling": SCALING}


def _dp(*groups: str) -> dict:
    return {"noise_multipliers": dict.fromkeys(groups, 2.0), "study": STUDY, "analysis": "a",
            "note": ""}  # fmt: skip


def _beta(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(0, 1, 3)


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "prepare": lambda seed: {"design": BINARY, "dp": _dp("n_obs")},
    "logistic.summaries": lambda seed: {
        "design": BINARY, "beta": _beta(seed), "clip": CLIP, "dp": _dp("gradient", "hessian")
    },
    "cox.piecewise_summaries": lambda seed: {
        "design": SURVIVAL, "beta": _beta(seed)[1:], "alpha": _beta(seed + 1), "grid": GRID,
        "clip": {"row_norm": 1.5, "scaling": SCALING[1:]},
        "patient_bounds": {"score": 2.0, "information": 3.0}, "dp": _dp("gradient", "hessian"),
    },
    "survival.counts": lambda seed: {
        "time": "t", "event": "e", "group": None, "levels": [], "grid": GRID, "dp": _dp("events")
    },
}  # fmt: skip
"""One private request per Gaussian-release task of the registry (``seed`` varies its point)."""

TRAINING_CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "deep.train": lambda seed: {
        "design": BINARY, "scaling": SCALING, "model": "linear", "hyper": {},
        "weights": [np.zeros((1, 2), np.float32), np.zeros(1, np.float32)],
        "algorithm": "fedavg", "lr": 0.1, "batch_size": 4, "local_steps": 2, "analysis": "a",
        "dp_sgd": {"sample_rate": 0.2, "noise_multiplier": 1.0, "max_grad_norm": 1.0,
                   "steps": 2, "engine": "auto"},
        "dp": {"noise_multipliers": {"dp_sgd": 1.0}, "study": STUDY, "analysis": "a", "note": ""},
    },
}  # fmt: skip
"""One private request per DP-SGD task of the registry (served when torch is installed)."""


def private_tasks() -> list[Task]:
    """Every task the registry serves under privacy, optional extras that are installed
    included."""
    return [t for t in REGISTRY if t.private_release or t.private_training]


def test_every_private_task_of_the_registry_has_a_case():
    """A private task added later fails here until it has a case below."""
    for task in private_tasks():
        cases = TRAINING_CASES if task.private_training is not None else CASES
        assert task.name in cases, f"{task.name} releases privately and has no case in this test"


@st.composite
def patient_frames(draw) -> pd.DataFrame:
    """12 to 30 patients of 1 to 5 rows each (at least one patient with several rows), the
    index naming each row's patient; ``x`` sometimes missing (designs drop such rows)."""
    sizes = draw(st.lists(st.integers(1, 5), min_size=12, max_size=30))
    if max(sizes) == 1:
        sizes[draw(st.integers(0, len(sizes) - 1))] = draw(st.integers(2, 5))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    n = sum(sizes)
    x = rng.uniform(-4, 4, n)
    x[rng.random(n) < 0.05] = np.nan
    frame = pd.DataFrame(
        {"x": x, "w": rng.uniform(-4, 4, n), "y": rng.integers(0, 2, n),
         "t": rng.uniform(0.1, 5, n), "e": rng.integers(0, 2, n)},
        index=pd.Index(np.repeat(np.arange(len(sizes)), sizes), name="patient"),
    )  # fmt: skip
    return frame


_LEDGER_NUMBERS = itertools.count()
"""Each silo its own ledger file: hypothesis reuses ``tmp_path`` across examples, and a name
built from ``id(frame)`` can repeat once a frame is collected."""


class Recording:
    """A silo over ``frame`` whose tasks record their reply before the silo adds noise."""

    def __init__(self, frame: pd.DataFrame, tmp_path) -> None:
        self.replies: list[dict[str, Any]] = []
        registry = TaskRegistry([dataclasses.replace(t, handler=self._wrap(t.handler))
                                 for t in private_tasks()])  # fmt: skip
        self.ledger = accounting.Ledger(tmp_path / f"silo-{next(_LEDGER_NUMBERS)}.ledger")
        self.scope = accounting.Scope(unit="patient", owner=SITE, study=STUDY)
        self.ledger.set_budget(self.scope, epsilon=1e9, delta=1e-5)
        self.silo = Silo(SITE, frame, policy=POLICY, registry=registry, ledger=self.ledger)

    def _wrap(self, handler):
        def recorded(ctx, args) -> TaskReply:
            reply = handler(ctx, args)
            self.replies.append(dict(reply.payload))
            return reply

        return recorded

    def ask(self, task: str, args: dict[str, Any]) -> tuple[dict, dict[str, Any] | None]:
        """The decoded reply and the handler's payload before noise (``None`` if refused)."""
        before = len(self.replies)
        reply = codec.decode(self.silo.handle(codec.encode({"task": task, "args": args})))
        if reply["status"] != "ok":
            return reply, None
        assert len(self.replies) == before + 1
        return reply, self.replies[-1]

    def charges(self) -> int:
        return len(self.ledger.entries(self.scope))


def group_vector(payload: dict[str, Any], group: NoisyGroup) -> np.ndarray:
    """A group's fields flattened and stacked, a symmetric matrix by its upper triangle: the
    vector the Gaussian mechanism adds noise of scale ``sigma * l2_sensitivity`` to."""
    parts = []
    for name in group.fields:
        value = np.asarray(payload[name], dtype=np.float64)
        parts.append(value[np.triu_indices(value.shape[0])] if group.symmetric else value.ravel())
    return np.concatenate(parts)


def assert_refused_before_charge(silo: Recording, reply: dict, charged_before: int) -> None:
    assert reply["status"] == "error"
    assert reply["error"]["type"] != "InternalSiteError", silo.silo.log[-1].detail
    assert silo.charges() == charged_before, "a refused request was charged"


def check_patient_sensitivity(task: Task, frame: pd.DataFrame, gone: int, seed: int, tmp_path):
    """The task's reply on ``frame`` and on ``frame`` without patient ``gone``: each noisy group
    moves by at most its charged L2 sensitivity, or the task refuses before any charge."""
    args = CASES[task.name](seed)
    groups = noisy_groups(task, args, SITE)
    neighbour = frame[frame.index != gone]
    payloads = []
    for data in (frame, neighbour):
        silo = Recording(data, tmp_path)
        reply, payload = silo.ask(task.name, args)
        if payload is None:  # the one refusal allowed: the per-patient one, from the layout
            assert_refused_before_charge(silo, reply, 0)
            assert reply["error"]["type"] == "DisclosureError", reply["error"]
            assert "several rows per patient" in reply["error"]["values"]["reason"]
            return reply["error"]["type"]
        assert silo.charges() == 1
        payloads.append(payload)
    for group in groups:
        moved = np.linalg.norm(group_vector(payloads[0], group) - group_vector(payloads[1], group))
        assert moved <= group.l2_sensitivity * (1 + TOLERANCE), (
            f"{task.name}: removing patient {gone} moved {group.fields} by {moved:.6g}, more than "
            f"the charged sensitivity {group.l2_sensitivity:.6g}"
        )
    return None


RELEASE_TASKS = [t for t in private_tasks() if t.private_release is not None]


@pytest.mark.parametrize("task", RELEASE_TASKS, ids=lambda t: t.name)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=patient_frames(), pick=st.integers(0, 10**6), seed=st.integers(0, 1000))
def test_removing_one_patient_moves_each_release_by_at_most_its_charged_sensitivity(
    task, frame, pick, seed, tmp_path
):
    patients = np.unique(frame.index)
    check_patient_sensitivity(task, frame, int(patients[pick % len(patients)]), seed, tmp_path)


@pytest.mark.parametrize("task", RELEASE_TASKS, ids=lambda t: t.name)
def test_the_patient_with_the_most_rows_moves_each_release_by_at_most_its_sensitivity(
    task, tmp_path
):
    """A fixed worst case beside the drawn ones: one patient of 5 rows with identical, extreme
    covariates and the outcome, among 20 patients of one row."""
    rng = np.random.default_rng(5)
    heavy = pd.DataFrame(
        {"x": [4.0] * 5, "w": [4.0] * 5, "y": [1] * 5, "t": [0.5] * 5, "e": [1] * 5},
        index=pd.Index([99] * 5, name="patient"),
    )
    light = pd.DataFrame(
        {"x": rng.uniform(-1, 1, 20), "w": rng.uniform(-1, 1, 20), "y": np.tile([0, 1], 10),
         "t": rng.uniform(0.1, 5, 20), "e": np.tile([0, 1], 10)},
        index=pd.Index(np.arange(20), name="patient"),
    )  # fmt: skip
    check_patient_sensitivity(task, pd.concat([light, heavy]), 99, 0, tmp_path)


TRAINING_TASKS = [t for t in private_tasks() if t.private_training is not None]


@pytest.mark.parametrize("task", TRAINING_TASKS, ids=lambda t: t.name)
@settings(
    max_examples=4,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(frame=patient_frames())
def test_training_whose_clipping_is_per_row_refuses_several_rows_per_patient_before_charging(
    task, frame, tmp_path
):
    """DP-SGD clips each sampled row's gradient (Abadi et al., CCS 2016; Opacus): on a frame with
    several rows per patient it would bound a row, not a patient, so it is refused, typed,
    before the charge; the same patients with one row each train and are charged."""
    args = TRAINING_CASES[task.name](0)
    silo = Recording(frame, tmp_path)
    reply, _ = silo.ask(task.name, args)
    assert_refused_before_charge(silo, reply, 0)
    assert reply["error"]["type"] == "DisclosureError"
    assert "several rows" in reply["error"]["values"]["reason"]
    single = frame[~frame.index.duplicated()]
    silo = Recording(single, tmp_path)
    reply, _ = silo.ask(task.name, args)
    assert reply["status"] == "ok", reply
    assert silo.charges() == 1


# ----------------------------------------------------------- the attack of the issue


@pytest.fixture(scope="module")
def stanford() -> pd.DataFrame:
    """Stanford heart transplant data (Crowley & Hu, JASA 1977), counting-process form indexed by
    patient: 103 patients, 172 intervals, 69 patients with 2 rows."""
    return load_stanford_heart_transplants().set_index("id")


STANFORD = ["age", "year", "surgery", "transplant"]


def test_stanford_removing_one_patient_moves_the_private_logistic_release_within_its_charge(
    stanford, tmp_path
):
    """The issue's attack: private logistic regression of the event on the Stanford intervals
    (at beta = (3, 0, ...), where a censored patient's two rows push the score the same way);
    removing any one patient must move the released score and information by at most the
    sensitivities charged (the score moved by 1.65 times its charge when rows were clipped one
    by one)."""
    exact = fedstats.Federation.in_process({SITE: stanford.reset_index(drop=True)})
    formula = "event ~ " + " + ".join(STANFORD)
    design = fedstats.LogisticRegression(formula).agree(exact, "a").spec.to_wire()
    data = stanford[STANFORD]
    centre = ((data.max() + data.min()) / 2).to_numpy()
    half = ((data.max() - data.min()) / 2).to_numpy()
    scaling = np.vstack([[0.0, 1.0], np.column_stack([centre, half])])
    clip = {"row_norm": 2.0, "scaling": scaling}
    args = {"design": design, "beta": np.array([3.0, 0, 0, 0, 0]), "clip": clip,
            "dp": _dp("gradient", "hessian")}  # fmt: skip
    task = REGISTRY.get("logistic.summaries")
    groups = noisy_groups(task, args, SITE)
    _, released = Recording(stanford, tmp_path).ask(task.name, args)
    assert released is not None
    worst = dict.fromkeys([g.fields for g in groups], 0.0)
    for patient in np.unique(stanford.index):
        _, without = Recording(stanford[stanford.index != patient], tmp_path).ask(task.name, args)
        for group in groups:
            moved = np.linalg.norm(group_vector(released, group) - group_vector(without, group))
            worst[group.fields] = max(worst[group.fields], moved / group.l2_sensitivity)
    assert max(worst.values()) <= 1 + TOLERANCE, (
        f"one patient moved a release by {worst} x its charge"
    )


def test_stanford_private_kaplan_meier_counts_refuse_intervals_of_one_patient(stanford, tmp_path):
    """Private Kaplan–Meier (and the private log-rank, the same task) counts each row leaving the
    risk set: a patient of two intervals moved the counts by sqrt(2) for a charge of 1. The
    site refuses, typed, before any charge."""
    silo = Recording(stanford, tmp_path)
    args = {"time": "stop", "event": "event", "group": None, "levels": [],
            "grid": np.array([50.0, 200.0, 1000.0]), "dp": _dp("events")}  # fmt: skip
    reply, _ = silo.ask("survival.counts", args)
    assert_refused_before_charge(silo, reply, 0)
    assert reply["error"]["type"] == "DisclosureError"
    assert "several rows" in reply["error"]["values"]["reason"]


def _stanford_federation(
    stanford: pd.DataFrame, tmp_path
) -> tuple[fedstats.Federation, dict[str, accounting.Ledger]]:
    """Three sites of the Stanford intervals (patient id modulo 3), indexed by patient, and
    their ledgers."""
    books = {}
    frames = {f"s{k}": stanford[stanford.index % 3 == k] for k in range(3)}
    for site in frames:
        books[site] = accounting.Ledger(tmp_path / f"{site}.ledger")
        books[site].set_budget(
            accounting.Scope(unit="patient", owner=site, study="study"), epsilon=50.0, delta=1e-5
        )
    return fedstats.Federation.in_process(frames, ledgers=books, noise_seed=3), books


def test_stanford_private_kaplan_meier_through_the_public_api_is_refused_uncharged(
    stanford, tmp_path
):
    fed, books = _stanford_federation(stanford, tmp_path)
    km = fedstats.KaplanMeier(
        "stop", "event", grid=[50.0, 200.0, 1000.0],
        privacy=fedstats.RecordDP(epsilon=1.0, delta=1e-6),
    )  # fmt: skip
    with pytest.raises(fedstats.errors.DisclosureError, match="several rows per patient"):
        km.fit(fed)
    for site, ledger in books.items():
        scope = accounting.Scope(unit="patient", owner=site, study="study")
        assert not ledger.entries(scope)


def test_stanford_private_logistic_through_the_public_api_fits_with_patients_clipped(
    stanford, tmp_path
):
    """The honest analysis still runs on frames of several rows per patient: every site
    answers each private round, each patient's rows clipped together."""
    fed, books = _stanford_federation(stanford, tmp_path)
    bounds = {c: (float(stanford[c].min()), float(stanford[c].max())) for c in STANFORD}
    result = fedstats.LogisticRegression("event ~ " + " + ".join(STANFORD)).fit(
        fed, privacy=fedstats.RecordDP(epsilon=5.0, delta=1e-6, rounds=3, bounds=bounds)
    )
    assert np.isfinite(result.params).all()
    for site, ledger in books.items():
        assert ledger.entries(accounting.Scope(unit="patient", owner=site, study="study"))
