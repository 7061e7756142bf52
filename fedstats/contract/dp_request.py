"""The differential-privacy fields of the wire: a request's ``dp`` block, a private reply's facts.

A request that asks for a differentially private release carries a ``dp``
block (:class:`DpRequest`): a noise multiplier per noisy group
(:class:`NoisyGroup`, named by its first field) and the study, analysis and
note the site's ledger records. Every private reply adds the public facts of
:data:`DP_REPLY_FIELDS`. The coordinator writes these fields and the site reads
them with the same code.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from fedstats.errors import MalformedRequestError
from fedstats.schema import Number, Text

DP_REPLY_FIELDS: dict[str, Number | Text] = {
    "dp_epsilon_spent": Number(),
    "dp_budget_epsilon": Number(),
    "dp_fixed_seed": Number(),
    "dp_ledger_entries": Number(),
    "dp_ledger_head": Text(max_chars=64),
}
"""Public facts a site adds to every private reply: its cumulative RDP epsilon for
the study after this charge, its budget, whether its noise used a fixed seed, and
the study scope's ledger chain head after this charge (entry count and sha256 hash,
:class:`accounting.ChainHead`). The coordinator records the heads in its study
record, so a ledger rewritten later no longer extends what the site released under
(the compliance report compares them). The head is a hash of the ledger's entries
(mechanisms, notes, times), which hold no patient data; the count is the number of
private releases this site made for the study."""


MIN_NOISE_MULTIPLIER = 1e-6
"""The least noise multiplier a request may ask for. One Gaussian release at 0.01 already
costs epsilon above 5,000 (RDP, delta = 1e-5), so only a test budget pays for less: the
project checks that its noisy Newton path reproduces the exact fit at 1e-5. Far below
(about 1e-160) ``sigma**2`` underflows to 0 in the accountant's ``alpha / (2 sigma^2)``."""


MAX_NOISE_MULTIPLIER = 1e6
"""The largest: at 1e6 a release costs epsilon 0 to the accountant's precision, and past
about 1e154 ``sigma**2`` overflows (``OverflowError`` in the RDP accountant)."""


def noise_multiplier_in_range(value: object) -> bool:
    """Whether ``value`` is a real number in ``[MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER]``
    (not a bool, not NaN or infinite); every noise multiplier a request carries is checked so."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and MIN_NOISE_MULTIPLIER <= value <= MAX_NOISE_MULTIPLIER
    )


@dataclass(frozen=True)
class DpRequest:
    """The ``dp`` block of a request: a noise multiplier per noisy group, and what it pays for.

    Groups are named by their first field (e.g. ``"gradient"``, ``"hessian"``).
    """

    noise_multipliers: dict[str, float]
    study: str
    analysis: str
    note: str

    def to_args(self) -> dict[str, Any]:
        return {
            "noise_multipliers": dict(self.noise_multipliers),
            "study": self.study,
            "analysis": self.analysis,
            "note": self.note,
        }

    @classmethod
    def from_args(cls, args: dict[str, Any]) -> DpRequest | None:
        block = args.get("dp")
        if block is None:
            return None
        keys = {"noise_multipliers", "study", "analysis", "note"}
        if not isinstance(block, dict) or set(block) != keys:
            raise MalformedRequestError(
                site=None, task=None, reason=f"'dp' must hold exactly {sorted(keys)}"
            )
        sigmas = block["noise_multipliers"]
        if (
            not isinstance(sigmas, dict)
            or not sigmas
            or not all(noise_multiplier_in_range(v) for v in sigmas.values())
        ):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="'dp.noise_multipliers' must map each noisy group to a number in "
                f"[{MIN_NOISE_MULTIPLIER:g}, {MAX_NOISE_MULTIPLIER:g}]",
            )
        if not all(isinstance(block[k], str) and block[k] for k in ("study", "analysis")) or (
            not isinstance(block["note"], str)
        ):
            raise MalformedRequestError(
                site=None,
                task=None,
                reason="'dp.study' and 'dp.analysis' must be non-empty strings, 'dp.note' a string",
            )
        return cls(
            {k: float(v) for k, v in sigmas.items()},
            block["study"],
            block["analysis"],
            block["note"][:200],
        )

    def sigmas_for(self, groups: list[NoisyGroup], site: str, task: str) -> list[float]:
        """The multiplier of each group, in order; the request must name exactly these groups."""
        names = [g.fields[0] for g in groups]
        if sorted(names) != sorted(self.noise_multipliers):
            raise MalformedRequestError(
                site=site,
                task=task,
                reason=f"noise_multipliers must name the groups {names}, "
                f"got {sorted(self.noise_multipliers)}",
            )
        return [self.noise_multipliers[n] for n in names]


@dataclass(frozen=True)
class NoisyGroup:
    """Reply fields released together by one Gaussian mechanism.

    ``l2_sensitivity`` bounds how far the fields (flattened and stacked; for a
    ``symmetric`` matrix, its upper triangle) can move when one patient is
    added or removed. The handler must enforce the bound (by clipping) when
    the request asks for differential privacy; the silo then adds
    ``N(0, (noise_multiplier * l2_sensitivity)^2)`` to every released entry.
    """

    fields: tuple[str, ...]
    l2_sensitivity: float
    symmetric: bool = False
