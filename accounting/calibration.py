"""Noise calibration: the smallest Gaussian noise multiplier that fits a budget."""

from __future__ import annotations

import math
import numbers
from typing import TYPE_CHECKING

from accounting.accountants import check_delta
from accounting.errors import InvalidBudget
from accounting.units import Neighbouring

if TYPE_CHECKING:
    import dp_accounting

_SIGMA_MIN = 1e-6
_SIGMA_MAX = 1e9


def calibrate_gaussian(
    epsilon: float,
    delta: float,
    *,
    compositions: int = 1,
    sampling_rate: float | None = None,
    neighbouring: Neighbouring | str = Neighbouring.ADD_OR_REMOVE_ONE,
) -> float:
    """Smallest noise multiplier sigma whose releases fit (epsilon, delta) under RDP.

    The event is ``SelfComposedDpEvent(GaussianDpEvent(sigma), compositions)``, or
    with ``PoissonSampledDpEvent(sampling_rate, GaussianDpEvent(sigma))`` inside
    when ``sampling_rate`` is given (DP-SGD, Abadi et al., CCS 2016). Its RDP
    epsilon (Mironov 2017, converted as in Balle et al. 2020) decreases in sigma;
    dp_accounting's ``calibrate_dp_mechanism`` finds the root by Brent's method
    and guarantees the returned sigma has epsilon <= the target, within 1e-6 of
    the smallest such sigma.

    Raises
    ------
    InvalidBudget
        For epsilon <= 0, delta outside (0, 1), compositions < 1, a sampling
        rate outside (0, 1], or a target no sigma in [1e-6, 1e9] can meet.
    """
    if isinstance(epsilon, bool) or not isinstance(epsilon, numbers.Real):
        raise InvalidBudget(f"epsilon must be a number, got {epsilon!r}")
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise InvalidBudget(f"epsilon must be positive and finite, got {epsilon!r}")
    delta = check_delta(delta)
    if isinstance(compositions, bool) or not isinstance(compositions, numbers.Integral):
        raise InvalidBudget(f"compositions must be an integer, got {compositions!r}")
    if compositions < 1:
        raise InvalidBudget(f"compositions must be at least 1, got {compositions}")
    if sampling_rate is not None and not (
        isinstance(sampling_rate, numbers.Real) and 0 < sampling_rate <= 1
    ):
        raise InvalidBudget(f"sampling_rate must be in (0, 1], got {sampling_rate!r}")
    import dp_accounting
    from dp_accounting.mechanism_calibration import ExplicitBracketInterval, calibrate_dp_mechanism
    from dp_accounting.rdp import RdpAccountant

    relation = Neighbouring.parse(neighbouring).to_dp_accounting()

    def make_event(sigma: float) -> dp_accounting.DpEvent:
        event: dp_accounting.DpEvent = dp_accounting.GaussianDpEvent(sigma)
        if sampling_rate is not None:
            event = dp_accounting.PoissonSampledDpEvent(sampling_rate, event)
        return dp_accounting.SelfComposedDpEvent(event, int(compositions))

    def gap(sigma: float) -> float:
        accountant = RdpAccountant(neighboring_relation=relation).compose(make_event(sigma))
        return accountant.get_epsilon(delta) - epsilon

    # An explicit bracket [low, high] with gap(low) > 0 >= gap(high); dp_accounting's own
    # search starts at sigma = 0, where the Gaussian's RDP is infinite.
    low, high = 1.0, 1.0
    while gap(low) <= 0:
        low /= 4
        if low < _SIGMA_MIN:
            raise InvalidBudget(
                f"epsilon={epsilon} at delta={delta} is met by any noise multiplier "
                f">= {_SIGMA_MIN}; the target is too loose to calibrate"
            )
    while gap(high) > 0:
        low, high = high, high * 4
        if high > _SIGMA_MAX:
            raise InvalidBudget(
                f"no noise multiplier up to {_SIGMA_MAX:g} reaches epsilon={epsilon} "
                f"at delta={delta}"
            )
    return float(
        calibrate_dp_mechanism(
            lambda: RdpAccountant(neighboring_relation=relation),
            make_event,
            epsilon,
            delta,
            ExplicitBracketInterval(low, high),
        )
    )
