"""The differencing guard fails closed at the cap a privacy officer sets.

The attack (heart-disease data, Cleveland): ask ``disease ~ I(thalach >= v)``,
where one patient has ``thalach == v``; ``I(thalach > v)`` is then refused as a
one-patient difference. Fill the guard's record with designs of half-space
indicators (``I(chol >= t)``, thresholds at least ``k`` rows apart, so each is
answered), then ask ``I(thalach > v)`` again. A guard that forgot its oldest
row sets when full answered it, and the two replies differ by that patient's
terms. Now nothing is forgotten: a request that needs a new entry in a full
record is refused with rule ``guard-full`` (saying the cap was reached and that
the officer can raise it), in the same run and after a restart; a design
already answered is still served.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import fedstats
from fedstats.contract import codec
from fedstats.datasets import heart_disease
from fedstats.errors import DisclosureError, StudyConfigurationError
from fedstats.jobs.site_config import DisclosureSection
from fedstats.models.agree import agree_design, agreed_design
from fedstats.site.differencing import DifferencingGuard
from fedstats.site.silo import Silo

CAP = 40


@pytest.fixture(scope="module")
def cleveland() -> pd.DataFrame:
    return heart_disease().frames["cleveland"]


def one_patient_value(data: pd.DataFrame) -> int:
    """A ``thalach`` held by exactly one patient, away from the column's ends."""
    counts = data.thalach.value_counts()
    return int(next(v for v in sorted(counts.index) if counts[v] == 1 and v > 140))


def fill_designs(data: pd.DataFrame, per_design: int = 8) -> list[str]:
    """Designs of ``per_design`` indicators ``I(chol >= t)``, each at least 4 rows from the
    others and from the column's ends (every one passes the cell rules and the guard)."""
    chol = data.chol.to_numpy()
    thresholds, last = [], None
    for t in np.unique(chol):
        above = int((chol >= t).sum())
        if 30 <= above <= len(chol) - 30 and (last is None or last - above >= 4):
            thresholds.append(float(t))
            last = above
    return [
        "disease ~ " + " + ".join(f"I(chol >= {t})" for t in thresholds[b : b + per_design])
        for b in range(0, len(thresholds), per_design)
    ]


def site(data: pd.DataFrame, path, cap: int = CAP) -> tuple[Silo, fedstats.Federation]:
    silo = Silo(
        "cleveland",
        data,
        policy=fedstats.DisclosurePolicy(max_guard_entries=cap),
        guard_path=path,
    )
    return silo, fedstats.Federation({"cleveland": silo.handle})


def refusal(fed: fedstats.Federation, formula: str, analysis: str) -> DisclosureError:
    with pytest.raises(DisclosureError) as info:
        agree_design(fed, formula, analysis=analysis)
    return info.value


def test_a_full_guard_refuses_what_it_refused_before_and_forgets_nothing(cleveland, tmp_path):
    path = tmp_path / "guard.sqlite"
    v = one_patient_value(cleveland)
    silo, fed = site(cleveland, path)
    agree_design(fed, f"disease ~ I(thalach >= {v})", analysis="first")
    assert refusal(fed, f"disease ~ I(thalach > {v})", "second").rule == "differencing"
    filled = 0
    for n, formula in enumerate([*fill_designs(cleveland), *fill_designs(cleveland, 1)]):
        try:
            agree_design(fed, formula, analysis=f"fill {n}")
            filled += 1
        except DisclosureError as error:  # a design of several, or a repeated single one
            assert error.rule in ("guard-full", "differencing")
    assert filled >= 2 and silo._context.guard.entries == CAP
    error = refusal(fed, f"disease ~ I(thalach > {v})", "again")
    assert error.rule == "guard-full" and error.site == "cleveland"
    assert "max_guard_entries" in error.reason and str(CAP) in error.reason
    agree_design(fed, f"disease ~ I(thalach >= {v})", analysis="first")  # nothing new: served
    silo._context.guard.close()

    # after a restart the record is as full as it was
    silo, fed = site(cleveland, path)
    assert refusal(fed, f"disease ~ I(thalach > {v})", "restart").rule == "guard-full"
    agree_design(fed, f"disease ~ I(thalach >= {v})", analysis="first")
    silo._context.guard.close()

    # the officer raises the cap: the one-patient difference meets the row set it differs from
    silo, fed = site(cleveland, path, cap=10 * CAP)
    assert refusal(fed, f"disease ~ I(thalach > {v})", "raised").rule == "differencing"
    silo._context.guard.close()


def test_a_full_guard_refuses_a_raw_request_on_the_wire(cleveland):
    """The same refusal as the coordinator sees it: a typed error reply, rule guard-full."""
    silo, fed = site(cleveland, None, cap=3)
    agree_design(fed, "disease ~ I(chol >= 240)", analysis="a")  # design rows + 1 indicator
    spec, _ = agreed_design(fed, "disease ~ I(chol >= 200) + I(chol >= 280)", analysis="b")
    raw = {"task": "prepare", "args": {"design": spec.to_wire()}}
    reply = codec.decode(silo.handle(codec.encode(raw)))
    assert reply["status"] == "error" and reply["error"]["type"] == "DisclosureError"
    assert reply["error"]["values"]["rule"] == "guard-full"
    assert "max_guard_entries" in reply["error"]["values"]["reason"]


@settings(max_examples=25, deadline=None)
@given(cap=st.integers(1, 12), sizes=st.lists(st.integers(1, 4), min_size=1, max_size=8))
def test_the_record_never_exceeds_its_cap_and_only_refuses_when_full(cap, sizes):
    """Oracle: a request of fresh, far-apart row sets is answered exactly when the record
    has room for all of them; the record never holds more than the cap."""
    n = 400
    guard = DifferencingGuard(
        fedstats.DisclosurePolicy(max_guard_entries=cap), pd.DataFrame({"a": range(n)})
    )
    start = 0
    for size in sizes:
        sets = []
        for _ in range(size):
            mask = np.zeros(n, bool)
            mask[start : start + 10] = True  # disjoint blocks: 20 rows apart
            start += 10
            sets.append((f"rows from {start}", mask))
        room = guard.entries + size <= cap
        if room:
            guard.check_row_sets("s", "t", sets)
        else:
            with pytest.raises(DisclosureError) as info:
                guard.check_row_sets("s", "t", sets)
            assert info.value.rule == "guard-full"
        assert guard.entries <= cap
        guard.check_row_sets("s", "t", sets[:0])  # nothing new: never refused


@pytest.mark.parametrize("bad", [0, -1, 2.5, True])
def test_the_cap_is_a_positive_integer(bad):
    with pytest.raises(StudyConfigurationError, match="max_guard_entries"):
        fedstats.DisclosurePolicy(max_guard_entries=bad)


def test_site_toml_sets_the_cap():
    section = DisclosureSection.model_validate({"max_guard_entries": 123})
    assert section.policy().max_guard_entries == 123
    assert section.policy().as_record()["max_guard_entries"] == 123


def test_remembered_columns_count_against_the_cap(cleveland, tmp_path):
    """A full record refuses a design whose continuous columns it has not seen (one a
    near-copy or not): a column it cannot remember is a column it cannot compare later."""
    path = tmp_path / "guard.sqlite"
    silo, fed = site(cleveland, path, cap=4)
    agree_design(fed, "disease ~ age + chol", analysis="a")  # design rows, age, chol
    agree_design(fed, "disease ~ trestbps", analysis="b")  # the fourth entry
    assert silo._context.guard.entries == 4
    assert refusal(fed, "disease ~ thalach", "c").rule == "guard-full"
    agree_design(fed, "disease ~ I(age / 10) + chol", analysis="d")  # copies: nothing new
    silo._context.guard.close()
    silo, fed = site(cleveland, path, cap=4)
    assert silo._context.guard.entries == 4
    assert refusal(fed, "disease ~ thalach", "c").rule == "guard-full"
    silo._context.guard.close()
