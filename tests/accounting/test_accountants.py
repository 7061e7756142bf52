"""Accountants against their oracles: dp_accounting's RDP and PLD accountants, and Opacus.

The oracle calls are written out in each test, e.g. for DP-SGD with q=0.01,
sigma=1.1, 10,000 steps, delta=1e-5::

    dp_accounting.rdp.RdpAccountant().compose(
        SelfComposedDpEvent(PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1)), 10_000)
    ).get_epsilon(1e-5)                                          # 5.632010670...
    acc = opacus.accountants.RDPAccountant(); acc.history = [(1.1, 0.01, 10_000)]
    acc.get_epsilon(1e-5)                                        # 5.631992368...
    dp_accounting.pld.PLDAccountant().compose(...).get_epsilon(1e-5)   # 5.19262...
"""

from __future__ import annotations

import json

import attr
import dp_accounting
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import PLDAccountant
from dp_accounting.rdp import RdpAccountant
from hypothesis import given, settings
from hypothesis import strategies as st

import accounting
from accounting.events import event_fields

Gaussian = dp_accounting.GaussianDpEvent
Laplace = dp_accounting.LaplaceDpEvent
Poisson = dp_accounting.PoissonSampledDpEvent
SelfComposed = dp_accounting.SelfComposedDpEvent
Composed = dp_accounting.ComposedDpEvent

# (sampling rate q, noise multiplier sigma, steps, delta); q = 1 is no sampling.
SETTINGS = [
    (0.01, 1.1, 10_000, 1e-5),
    (0.02, 0.8, 2_000, 1e-6),
    (0.1, 2.0, 500, 1e-5),
    (1.0, 5.0, 10, 1e-6),
    (0.005, 1.5, 20_000, 1e-7),
]


def step_event(q: float, sigma: float) -> dp_accounting.DpEvent:
    return Gaussian(sigma) if q == 1.0 else Poisson(q, Gaussian(sigma))


def dp_accounting_rdp(events, delta, relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE):
    accountant = RdpAccountant(neighboring_relation=relation)
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(delta)


def opacus_rdp(q: float, sigma: float, steps: int, delta: float) -> float:
    """Opacus' RDP accountant (installed with the deep extra; tests using it are marked deep)."""
    from opacus.accountants import RDPAccountant as OpacusRDPAccountant

    accountant = OpacusRDPAccountant()
    accountant.history = [(sigma, q, steps)]
    return accountant.get_epsilon(delta)


@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), SETTINGS)
def test_dp_sgd_epsilon_matches_dp_accounting_and_pld(q, sigma, steps, delta, tmp_path):
    """RDP equals dp_accounting's RdpAccountant to 1e-9 (function and ledger), and the ledger's
    PLD figure equals dp_accounting's PLDAccountant and is the tighter one."""
    event = SelfComposed(step_event(q, sigma), steps)
    reference = dp_accounting_rdp([event], delta)

    assert accounting.rdp_epsilon(event, delta) == pytest.approx(reference, rel=1e-9, abs=1e-9)
    assert accounting.rdp_epsilon([event], delta) == pytest.approx(reference, rel=1e-9, abs=1e-9)

    scope = accounting.Scope(unit="patient", owner="site_a", study="dp-sgd")
    with accounting.Ledger(tmp_path / "site_a.ledger") as ledger:
        ledger.set_budget(scope, epsilon=reference * 1.01, delta=delta)
        entry = ledger.charge(scope, event, task="dp_sgd", parameters={"steps": steps})
        spent = ledger.spent(scope)
    assert entry.epsilon_after == pytest.approx(reference, rel=1e-9, abs=1e-9)
    assert spent.epsilon == pytest.approx(reference, rel=1e-9, abs=1e-9)

    pld_reference = PLDAccountant().compose(event).get_epsilon(delta)
    assert spent.epsilon_pld == pytest.approx(pld_reference, rel=1e-9)
    assert accounting.pld_epsilon(event, delta) == pytest.approx(pld_reference, rel=1e-9)
    assert spent.epsilon_pld < spent.epsilon
    assert spent.pld_note is None


def test_reference_figures_of_dp_sgd():
    """The figures REFERENCES.md quotes for q=0.01, sigma=1.1, 10,000 steps, delta=1e-5."""
    event = SelfComposed(Poisson(0.01, Gaussian(1.1)), 10_000)
    assert accounting.rdp_epsilon(event, 1e-5) == pytest.approx(5.63201, abs=1e-5)
    assert accounting.pld_epsilon(event, 1e-5) == pytest.approx(5.19, abs=0.01)


@pytest.mark.deep
@pytest.mark.parametrize(("q", "sigma", "steps", "delta"), SETTINGS)
def test_dp_sgd_epsilon_agrees_with_opacus(q, sigma, steps, delta):
    """Opacus' RDP accountant (another order grid) agrees within 0.1 %."""
    event = SelfComposed(step_event(q, sigma), steps)
    reference = dp_accounting_rdp([event], delta)
    assert accounting.rdp_epsilon(event, delta) == pytest.approx(reference, rel=1e-9, abs=1e-9)
    assert opacus_rdp(q, sigma, steps, delta) == pytest.approx(reference, rel=1e-3)


@pytest.mark.deep
def test_reference_figure_of_dp_sgd_in_opacus():
    """Opacus gives the figure REFERENCES.md quotes for q=0.01, sigma=1.1, 10,000 steps."""
    assert opacus_rdp(0.01, 1.1, 10_000, 1e-5) == pytest.approx(5.63199, abs=1e-5)


def test_many_small_charges_compose_like_one_self_composed_event(tmp_path):
    """10,000 separate charges of one DP-SGD step reach RdpAccountant's epsilon to 1e-9."""
    step = Poisson(0.01, Gaussian(1.1))
    reference = dp_accounting_rdp([SelfComposed(step, 10_000)], 1e-5)
    scope = accounting.Scope(unit="patient", owner="site_a", study="steps")
    # durability only changes SQLite's fsync policy, not the charge path
    with accounting.Ledger(tmp_path / "steps.ledger", durability="normal") as ledger:
        ledger.set_budget(scope, epsilon=6.0, delta=1e-5)
        for _ in range(10_000):
            entry = ledger.charge(scope, step)
        spent = ledger.spent(scope)
    assert entry.seq == 10_000
    assert spent.epsilon == pytest.approx(reference, rel=1e-9, abs=1e-9)
    assert spent.epsilon_pld == pytest.approx(
        PLDAccountant().compose(SelfComposed(step, 10_000)).get_epsilon(1e-5), rel=1e-9
    )


MIXED = [
    Gaussian(2.0),
    Laplace(1.5),
    Composed([Gaussian(3.0), SelfComposed(Laplace(4.0), 3)]),
    Gaussian(2.0),
    SelfComposed(Composed([Gaussian(8.0), Laplace(10.0)]), 4),
]


@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_gaussian_laplace_and_composed_events(delta, tmp_path):
    reference = dp_accounting_rdp(MIXED, delta)
    assert accounting.rdp_epsilon(MIXED, delta) == pytest.approx(reference, rel=1e-9)
    pld = PLDAccountant()
    for event in MIXED:
        pld.compose(event)
    # grouping identical mechanisms changes only the PLD's discretisation path
    assert accounting.pld_epsilon(MIXED, delta) == pytest.approx(pld.get_epsilon(delta), rel=1e-4)

    scope = accounting.Scope(unit="site", owner="coordinator", study="mixed")
    with accounting.Ledger(tmp_path / "coordinator.ledger") as ledger:
        ledger.set_budget(scope, epsilon=50.0, delta=delta)
        for event in MIXED:
            ledger.charge(scope, event)
        spent = ledger.spent(scope)
        entries = ledger.entries(scope)
    assert spent.epsilon == pytest.approx(reference, rel=1e-9)
    for i, entry in enumerate(entries, start=1):
        assert entry.epsilon_after == pytest.approx(dp_accounting_rdp(MIXED[:i], delta), rel=1e-9)
        assert entry.epsilon == pytest.approx(dp_accounting_rdp([MIXED[i - 1]], delta), rel=1e-9)


def test_custom_orders_match_dp_accounting():
    orders = [1.5, 2, 4, 8, 16, 32, 64]
    event = SelfComposed(Poisson(0.05, Gaussian(1.3)), 300)
    reference = RdpAccountant(orders).compose(event).get_epsilon(1e-6)
    assert accounting.rdp_epsilon(event, 1e-6, orders=orders) == pytest.approx(reference, rel=1e-9)


@pytest.mark.parametrize(
    ("epsilon", "delta", "compositions", "sampling_rate", "neighbouring"),
    [
        (1.0, 1e-5, 1, None, "add_or_remove_one"),
        (2.0, 1e-6, 100, None, "add_or_remove_one"),
        (0.5, 1e-6, 20, None, "replace_one"),
        (5.632010670081592, 1e-5, 10_000, 0.01, "add_or_remove_one"),
        (3.0, 1e-7, 2_000, 0.02, "add_or_remove_one"),
    ],
)
def test_calibrate_gaussian_round_trip(epsilon, delta, compositions, sampling_rate, neighbouring):
    """The returned sigma meets the target; 0.99 sigma does not."""
    sigma = accounting.calibrate_gaussian(
        epsilon,
        delta,
        compositions=compositions,
        sampling_rate=sampling_rate,
        neighbouring=neighbouring,
    )

    def epsilon_at(s: float) -> float:
        step = Gaussian(s) if sampling_rate is None else Poisson(sampling_rate, Gaussian(s))
        return accounting.rdp_epsilon(SelfComposed(step, compositions), delta, neighbouring)

    assert epsilon_at(sigma) <= epsilon
    assert epsilon_at(sigma * 0.99) > epsilon
    if sampling_rate == 0.01 and compositions == 10_000:
        assert sigma == pytest.approx(1.1, abs=1e-5)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"epsilon": 0.0, "delta": 1e-5},
        {"epsilon": 1.0, "delta": 0.0},
        {"epsilon": 1.0, "delta": 1e-5, "compositions": 0},
        {"epsilon": 1.0, "delta": 1e-5, "sampling_rate": 1.5},
    ],
)
def test_calibrate_gaussian_refuses_bad_targets(kwargs):
    with pytest.raises(accounting.InvalidBudget):
        accounting.calibrate_gaussian(**kwargs)


FIXED_SIZE = dp_accounting.SampledWithoutReplacementDpEvent(
    source_dataset_size=10_000, sample_size=100, event=Gaussian(1.0)
)


@pytest.mark.parametrize(
    "event",
    [FIXED_SIZE, SelfComposed(FIXED_SIZE, 50), Composed([Gaussian(2.0), FIXED_SIZE])],
    ids=["alone", "self-composed", "composed"],
)
def test_fixed_size_batches_under_add_or_remove_are_refused(event):
    with pytest.raises(accounting.UnsupportedMechanism) as caught:
        accounting.rdp_epsilon(event, 1e-5)
    error = caught.value
    assert error.mechanism == "SampledWithoutReplacementDpEvent"
    assert error.accountant == "RDP"
    message = str(error)
    assert "SampledWithoutReplacementDpEvent" in message
    assert "fixed-size batches" in message
    assert "add-or-remove" in message
    assert "replace-one" in message


def test_fixed_size_batches_are_accounted_under_replace_one_by_rdp_only():
    replace_one = dp_accounting.NeighboringRelation.REPLACE_ONE
    reference = dp_accounting_rdp([SelfComposed(FIXED_SIZE, 50)], 1e-5, replace_one)
    ours = accounting.rdp_epsilon(SelfComposed(FIXED_SIZE, 50), 1e-5, neighbouring="replace_one")
    assert ours == pytest.approx(reference, rel=1e-9)
    with pytest.raises(accounting.UnsupportedMechanism) as caught:
        accounting.pld_epsilon(FIXED_SIZE, 1e-5, neighbouring="replace_one")
    assert caught.value.accountant == "PLD"


@pytest.mark.parametrize(
    ("event", "mechanism"),
    [
        (dp_accounting.UnsupportedDpEvent(), "UnsupportedDpEvent"),
        (Poisson(0.1, Laplace(1.0)), "PoissonSampledDpEvent"),
        (
            dp_accounting.SampledWithReplacementDpEvent(1000, 10, Gaussian(1.0)),
            "SampledWithReplacementDpEvent",
        ),
    ],
)
def test_other_unsupported_mechanisms_are_named(event, mechanism):
    with pytest.raises(accounting.UnsupportedMechanism, match=mechanism):
        accounting.rdp_epsilon(event, 1e-5)


def test_describe_event():
    event = SelfComposed(Poisson(0.01, Gaussian(1.1)), 10_000)
    assert accounting.describe_event(event) == (
        "Gaussian mechanism (noise multiplier 1.1), Poisson-sampled at rate 0.01, "
        "composed 10,000 times"
    )
    assert accounting.describe_event(Composed([Gaussian(2.0)] * 3)) == (
        "Gaussian mechanism (noise multiplier 2), composed 3 times"
    )
    text = accounting.describe_event(Composed([Gaussian(2.0), Laplace(0.5)]))
    assert text == (
        "composition of 2 mechanisms: Gaussian mechanism (noise multiplier 2); "
        "Laplace mechanism (noise multiplier 0.5)"
    )
    assert "sampled without replacement" in accounting.describe_event(FIXED_SIZE)


# -- event JSON ---------------------------------------------------------------

reals = st.floats(min_value=0.0, max_value=1e12, allow_nan=False, allow_infinity=False)
probabilities = st.floats(min_value=0.0, max_value=1.0)
counts = st.integers(min_value=0, max_value=10**12)
leaves = st.one_of(
    st.builds(Gaussian, reals),
    st.builds(Laplace, reals),
    st.builds(Gaussian, st.integers(min_value=0, max_value=100)),
    st.builds(dp_accounting.ZCDpEvent, reals, reals),
    st.builds(dp_accounting.RandomizedResponseDpEvent, probabilities, counts),
    st.builds(dp_event.DiscreteLaplaceDpEvent, reals, counts),
    st.just(dp_accounting.NoOpDpEvent()),
    st.just(dp_accounting.NonPrivateDpEvent()),
)
events = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.builds(Poisson, probabilities, children),
        st.builds(SelfComposed, children, counts),
        st.builds(Composed, st.lists(children, max_size=4)),
        st.builds(dp_accounting.SampledWithoutReplacementDpEvent, counts, counts, children),
        st.builds(dp_accounting.SampledWithReplacementDpEvent, counts, counts, children),
    ),
    max_leaves=12,
)


@given(events)
def test_event_json_round_trip(event):
    text = accounting.event_to_json(event)
    back = accounting.event_from_json(text)
    assert back == event
    assert accounting.event_to_json(back) == text  # canonical
    assert json.loads(text)["type"] == type(event).__name__
    assert isinstance(accounting.describe_event(event), str)


def test_event_table_covers_dp_accounting():
    """Every concrete event class of dp_accounting.dp_event, with exactly its fields."""
    classes = {
        cls
        for cls in vars(dp_event).values()
        if isinstance(cls, type) and issubclass(cls, dp_accounting.DpEvent)
    } - {dp_accounting.DpEvent}
    assert set(event_fields()) == classes
    for cls, fields in event_fields().items():
        assert [name for name, _ in fields] == [f.name for f in attr.fields(cls)], cls


def test_round_trip_of_rarer_events():
    rare = [
        dp_accounting.SingleEpochTreeAggregationDpEvent(1.5, [3, 4]),
        dp_accounting.SingleEpochTreeAggregationDpEvent(1.5, 7),
        dp_event.RepeatAndSelectDpEvent(Gaussian(2.0), 3.0, 1.0),
        dp_event.MixtureOfGaussiansDpEvent(1.0, [0.0, 1.0], [0.25, 0.75]),
        dp_accounting.TruncatedSubsampledGaussianDpEvent(1000, 0.01, 20, 1.1),
        dp_accounting.UnsupportedDpEvent(),
    ]
    for event in rare:
        assert accounting.event_from_json(accounting.event_to_json(event)) == event


@pytest.mark.parametrize(
    "text",
    [
        "",
        "null",
        "[]",
        '"GaussianDpEvent"',
        '{"noise_multiplier": 1.0}',
        '{"type": "FooDpEvent"}',
        '{"type": "GaussianDpEvent"}',
        '{"type": "GaussianDpEvent", "noise_multiplier": 1.0, "extra": 1}',
        '{"type": "GaussianDpEvent", "noise_multiplier": -1.0}',
        '{"type": "GaussianDpEvent", "noise_multiplier": NaN}',
        '{"type": "GaussianDpEvent", "noise_multiplier": Infinity}',
        '{"type": "GaussianDpEvent", "noise_multiplier": true}',
        '{"type": "GaussianDpEvent", "noise_multiplier": "1.0"}',
        '{"type": "GaussianDpEvent", "noise_multiplier": 1, "noise_multiplier": 2}',
        '{"type": "PoissonSampledDpEvent", "sampling_probability": 1.5,'
        ' "event": {"type": "GaussianDpEvent", "noise_multiplier": 1}}',
        '{"type": "SelfComposedDpEvent", "count": 2.5,'
        ' "event": {"type": "GaussianDpEvent", "noise_multiplier": 1}}',
        '{"type": "ComposedDpEvent", "events": {"type": "NoOpDpEvent"}}',
        '{"module_name": "os", "class_name": "system"}',
        "[" * 100_000 + "]" * 100_000,
        '{"type": "SelfComposedDpEvent", "count": 1, "event": ' * 100
        + '{"type": "NoOpDpEvent"}'
        + "}" * 100,
    ],
)
def test_malformed_event_json_is_refused(text):
    with pytest.raises(accounting.MalformedEvent):
        accounting.event_from_json(text)


@given(st.text(max_size=200))
def test_arbitrary_text_gives_an_event_or_the_typed_error(text):
    try:
        event = accounting.event_from_json(text)
    except accounting.MalformedEvent:
        return
    assert isinstance(event, dp_accounting.DpEvent)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(["type", "event", "events", "count", "noise_multiplier", "x"])
            | st.text(),
            children,
            max_size=4,
        )
    ),
    max_leaves=10,
)


@settings(max_examples=200)
@given(json_values, st.sampled_from([None, *sorted(c.__name__ for c in event_fields())]))
def test_arbitrary_json_gives_an_event_or_the_typed_error(value, type_name):
    if type_name is not None and isinstance(value, dict):
        value = {**value, "type": type_name}
    try:
        event = accounting.event_from_json(json.dumps(value))
    except accounting.MalformedEvent:
        return
    assert accounting.event_from_json(accounting.event_to_json(event)) == event


def test_unknown_event_classes_cannot_be_encoded():
    @attr.s(frozen=True, slots=True, auto_attribs=True)
    class HomeMadeDpEvent(dp_accounting.DpEvent):
        epsilon: float

    with pytest.raises(accounting.MalformedEvent, match="HomeMadeDpEvent"):
        accounting.event_to_json(HomeMadeDpEvent(1.0))
    with pytest.raises(accounting.MalformedEvent):
        accounting.event_to_json(Gaussian(float("nan")))


def test_pld_refuses_a_vanishing_noise_it_cannot_discretise_and_the_ledger_reports_it(tmp_path):
    """A noise multiplier of 1e-5 needs a PLD grid dp_accounting cannot allocate: PLD says
    so (UnsupportedMechanism), while RDP still accounts it and the ledger stays usable."""
    tiny = dp_accounting.GaussianDpEvent(1e-5)
    with pytest.raises(accounting.UnsupportedMechanism, match="cannot be discretised"):
        accounting.pld_epsilon([tiny], 1e-6)
    ledger = accounting.Ledger(tmp_path / "tiny.ledger")
    scope = accounting.Scope(unit="patient", owner="site", study="s")
    ledger.set_budget(scope, epsilon=1e15, delta=1e-6)
    ledger.charge(scope, tiny)
    spent = ledger.spent(scope)
    assert spent.epsilon == pytest.approx(accounting.rdp_epsilon([tiny], 1e-6))
    assert spent.epsilon_pld is None and "discretised" in spent.pld_note
