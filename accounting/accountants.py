"""Epsilon from DpEvents, by dp_accounting's accountants only.

* RDP (the accountant that enforces budgets): Rényi DP of each mechanism at a
  grid of orders alpha, composed by adding the RDP curves order by order
  (Mironov, "Rényi differential privacy", CSF 2017; the subsampled Gaussian of
  Abadi et al., CCS 2016 and Mironov, Talwar & Zhang 2019), converted to
  (epsilon, delta)-DP with the improved bound that dp_accounting's
  ``compute_epsilon`` uses (Balle et al., AISTATS 2020, Prop. 12; Canonne,
  Kamath & Steinke 2020, eq. 20)::

      epsilon = min_alpha  rdp(alpha) + log1p(-1/alpha) - log(delta * alpha) / (alpha - 1)

* PLD (a tighter figure, reported beside it): privacy loss distributions
  composed by FFT (Koskela, Jälkö & Honkela 2020; Doroshenko, Ghazi, Kamath,
  Kumar & Manurangsi, "Connect the dots", PETS 2022), dp_accounting's
  ``PLDAccountant`` with its pessimistic discretisation.

No epsilon is computed here by a hand formula: these functions only build
accountants, compose events and ask them.

``dp_accounting`` is imported by the functions that use it, on first use: the
package loads its PLD accountant and with it SciPy's signal and stats modules
(about a second), which importing :mod:`accounting` does not need.
"""

from __future__ import annotations

import functools
import numbers
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from accounting.errors import InvalidBudget, UnsupportedMechanism
from accounting.events import describe_event, event_from_json, event_to_json
from accounting.units import Neighbouring

if TYPE_CHECKING:
    import dp_accounting


@functools.cache
def default_orders() -> tuple[float, ...]:
    """dp_accounting's default RDP orders, the grid every new ledger scope uses."""
    from dp_accounting.rdp.rdp_privacy_accountant import DEFAULT_RDP_ORDERS

    return tuple(float(order) for order in DEFAULT_RDP_ORDERS)


#: Floating-point slack allowed when comparing an epsilon with its budget.
BUDGET_SLACK = 1e-12


def check_delta(delta: float) -> float:
    """``delta`` as a float, or :class:`InvalidBudget` unless ``0 < delta < 1``."""
    if isinstance(delta, bool) or not isinstance(delta, numbers.Real) or not 0 < delta < 1:
        raise InvalidBudget(f"delta must be a number with 0 < delta < 1, got {delta!r}")
    return float(delta)


def _events(events: dp_accounting.DpEvent | Iterable[dp_accounting.DpEvent]) -> list:
    import dp_accounting

    items = [events] if isinstance(events, dp_accounting.DpEvent) else list(events)
    for item in items:
        if not isinstance(item, dp_accounting.DpEvent):
            raise TypeError(f"expected dp_accounting DpEvents, got {type(item).__name__}")
    return items


def _offender(
    accountant: dp_accounting.PrivacyAccountant, event: dp_accounting.DpEvent
) -> dp_accounting.DpEvent:
    """The outermost sub-event the accountant refuses, looking inside compositions only."""
    from dp_accounting import dp_event as _ev

    if isinstance(event, _ev.SelfComposedDpEvent) and not accountant.supports(event.event):
        return _offender(accountant, event.event)
    if isinstance(event, _ev.ComposedDpEvent):
        for item in event.events:
            if not accountant.supports(item):
                return _offender(accountant, item)
    return event


def _hint(event: dp_accounting.DpEvent, relation: Neighbouring, name: str) -> str:
    from dp_accounting import dp_event as _ev

    if isinstance(event, _ev.SampledWithoutReplacementDpEvent):
        if name == "RDP" and relation is Neighbouring.ADD_OR_REMOVE_ONE:
            return (
                "fixed-size batches (sampling without replacement) under add-or-remove: the "
                "RDP accountant supports them only under replace-one. Declare the scope with "
                "neighbouring='replace_one', or describe the batches as PoissonSampledDpEvent "
                "only if the code really includes each record independently (Poisson)"
            )
        return (
            f"fixed-size batches (sampling without replacement): the {name} accountant "
            "supports them only as a Gaussian mechanism under replace-one (RDP)"
        )
    if isinstance(event, _ev.SampledWithReplacementDpEvent):
        return (
            f"fixed-size batches sampled with replacement: the {name} accountant has no "
            "amplification for them; charge the mechanism without sampling instead"
        )
    if isinstance(event, _ev.PoissonSampledDpEvent):
        if name == "RDP" and relation is Neighbouring.REPLACE_ONE:
            return (
                "Poisson subsampling under replace-one: the RDP accountant supports it only "
                "under add-or-remove; use a scope with neighbouring='add_or_remove_one'"
            )
        return (
            f"the {name} accountant amplifies by Poisson sampling only "
            + ("Gaussian noise" if name == "RDP" else "Gaussian or Laplace noise")
            + "; charge the mechanism without sampling instead"
        )
    if isinstance(event, _ev.UnsupportedDpEvent):
        return "the release has no differential-privacy analysis; it must not be released"
    return (
        f"the {name} accountant cannot account it under {relation.key}; describe the release "
        "with an event it supports (e.g. GaussianDpEvent, LaplaceDpEvent, or a "
        "PoissonSampledDpEvent of a GaussianDpEvent)"
    )


def _compose(
    accountant: dp_accounting.PrivacyAccountant,
    event: dp_accounting.DpEvent,
    relation: Neighbouring,
    name: str,
) -> None:
    """``accountant.compose(event)``, with dp_accounting's refusal as UnsupportedMechanism."""
    import dp_accounting

    try:
        accountant.compose(event)
    except dp_accounting.UnsupportedEventError as error:
        offender = _offender(accountant, event)
        mechanism = type(offender).__name__
        reason = _hint(offender, relation, name)
        raise UnsupportedMechanism(
            f"{mechanism} ({describe_event(offender)}) cannot be accounted: {reason}. "
            f"Nothing was charged. [dp_accounting: {error}]",
            mechanism=mechanism,
            accountant=name,
            reason=reason,
        ) from None


def rdp_curve(
    event: dp_accounting.DpEvent,
    orders: Sequence[float] | None = None,
    neighbouring: Neighbouring | str = Neighbouring.ADD_OR_REMOVE_ONE,
) -> np.ndarray:
    """The RDP of ``event`` at each order: a fresh ``RdpAccountant`` composing it once.

    ``orders`` defaults to :func:`default_orders`.

    Raises
    ------
    UnsupportedMechanism
        If dp_accounting's RDP accountant cannot account the event under the relation.
    """
    from dp_accounting.rdp import RdpAccountant

    relation = Neighbouring.parse(neighbouring)
    orders = default_orders() if orders is None else orders
    accountant = RdpAccountant(list(orders), relation.to_dp_accounting())
    _compose(accountant, event, relation, "RDP")
    return accountant.rdp


@functools.lru_cache(maxsize=4096)
def cached_rdp_curve(event_json: str, orders: tuple[float, ...], relation_key: str) -> np.ndarray:
    """:func:`rdp_curve` of the event encoded as ``event_json``, cached, read-only.

    Studies charge the same event every round, so the ledger computes each
    (event, orders, relation) curve once per process.
    """
    curve = rdp_curve(event_from_json(event_json), orders, relation_key)
    curve.setflags(write=False)
    return curve


def epsilon_from_rdp(orders: Sequence[float], curve: Sequence[float], delta: float) -> float:
    """(epsilon, delta)-DP of an RDP curve: dp_accounting's ``compute_epsilon`` (see module).

    The curve is passed as Python floats (the same IEEE arithmetic as numpy
    scalars, about twice as fast in ``compute_epsilon``'s loop).
    """
    from dp_accounting.rdp import compute_epsilon

    values = curve.tolist() if isinstance(curve, np.ndarray) else list(curve)
    return float(compute_epsilon(list(orders), values, check_delta(delta))[0])


@functools.lru_cache(maxsize=4096)
def cached_event_epsilon(
    event_json: str, orders: tuple[float, ...], relation_key: str, delta: float
) -> float:
    """RDP epsilon of one event alone at ``delta`` (for refusal messages), cached."""
    return epsilon_from_rdp(orders, cached_rdp_curve(event_json, orders, relation_key), delta)


def rdp_epsilon(
    events: dp_accounting.DpEvent | Iterable[dp_accounting.DpEvent],
    delta: float,
    neighbouring: Neighbouring | str = Neighbouring.ADD_OR_REMOVE_ONE,
    orders: Sequence[float] | None = None,
) -> float:
    """Epsilon at ``delta`` of the events composed by ``dp_accounting.rdp.RdpAccountant``.

    Parameters
    ----------
    events:
        One DpEvent or several, composed in sequence (adaptively).
    delta:
        Target delta, ``0 < delta < 1``.
    neighbouring:
        ``"add_or_remove_one"`` (default) or ``"replace_one"``.
    orders:
        RDP orders; dp_accounting's ``DEFAULT_RDP_ORDERS`` when None.

    Raises
    ------
    UnsupportedMechanism
        If the RDP accountant cannot account one of the events.
    """
    from dp_accounting.rdp import RdpAccountant

    delta = check_delta(delta)
    relation = Neighbouring.parse(neighbouring)
    accountant = RdpAccountant(
        None if orders is None else list(orders), relation.to_dp_accounting()
    )
    for event in _events(events):
        _compose(accountant, event, relation, "RDP")
    return float(accountant.get_epsilon(delta))


def group_events(events: Iterable[dp_accounting.DpEvent]) -> dp_accounting.DpEvent:
    """One event equivalent to composing ``events``, identical mechanisms grouped.

    Compositions are flattened (composition is commutative for the accountants)
    and each distinct mechanism becomes ``SelfComposedDpEvent(mechanism, count)``,
    which the PLD accountant self-composes by FFT at once instead of one by one.
    """
    from dp_accounting import dp_event as _ev

    counts: dict[str, tuple[dp_accounting.DpEvent, int]] = {}

    def visit(event: dp_accounting.DpEvent, count: int) -> None:
        if isinstance(event, _ev.SelfComposedDpEvent):
            visit(event.event, count * event.count)
        elif isinstance(event, _ev.ComposedDpEvent):
            for item in event.events:
                visit(item, count)
        elif count and not isinstance(event, _ev.NoOpDpEvent):
            key = event_to_json(event)
            counts[key] = (event, counts.get(key, (event, 0))[1] + count)

    for event in _events(events):
        visit(event, 1)
    parts = [e if n == 1 else _ev.SelfComposedDpEvent(e, n) for e, n in counts.values()]
    return parts[0] if len(parts) == 1 else _ev.ComposedDpEvent(parts)


def pld_epsilon(
    events: dp_accounting.DpEvent | Iterable[dp_accounting.DpEvent],
    delta: float,
    neighbouring: Neighbouring | str = Neighbouring.ADD_OR_REMOVE_ONE,
    *,
    value_discretization_interval: float = 1e-4,
) -> float:
    """Epsilon at ``delta`` of the events composed by ``dp_accounting.pld.PLDAccountant``.

    Identical mechanisms are grouped first (:func:`group_events`); the PLD
    accountant's discretisation is pessimistic, so the figure is an upper bound
    (Doroshenko et al., PETS 2022).

    Raises
    ------
    UnsupportedMechanism
        If the PLD accountant cannot account one of the events (e.g. fixed-size
        batches, which dp_accounting's PLD accountant does not support), or
        cannot discretise it (a vanishing noise multiplier needs an unbounded
        grid: dp_accounting then fails to allocate it).
    """
    from dp_accounting.pld import PLDAccountant

    delta = check_delta(delta)
    relation = Neighbouring.parse(neighbouring)
    grouped = group_events(_events(events))
    key = (event_to_json(grouped), delta, relation.key, float(value_discretization_interval))
    if key in _PLD_EPSILONS:  # the same spending at several sites: discretised once
        return _PLD_EPSILONS[key]
    accountant = PLDAccountant(relation.to_dp_accounting(), value_discretization_interval)
    try:
        _compose(accountant, grouped, relation, "PLD")
        epsilon = float(accountant.get_epsilon(delta))
    except (MemoryError, OverflowError) as error:
        reason = (
            f"its privacy-loss distribution cannot be discretised at interval "
            f"{value_discretization_interval:g} ({type(error).__name__})"
        )
        raise UnsupportedMechanism(
            f"{describe_event(grouped)}: {reason}; the RDP figure still holds",
            mechanism=type(grouped).__name__,
            accountant="PLD",
            reason=reason,
        ) from None
    if len(_PLD_EPSILONS) >= _PLD_EPSILONS_KEPT:
        _PLD_EPSILONS.pop(next(iter(_PLD_EPSILONS)))
    _PLD_EPSILONS[key] = epsilon
    return epsilon


_PLD_EPSILONS: dict[tuple[str, float, str, float], float] = {}
""":func:`pld_epsilon`'s answers by (grouped events as JSON, delta, relation, interval): a
pure function of its key, and the slowest figure a report computes."""
_PLD_EPSILONS_KEPT = 256
