"""Fixed-point encoding of real vectors in the ring of integers modulo 2^64.

Secure aggregation adds masked vectors in a finite ring, where a uniformly
random mask hides its input completely (Bonawitz et al., "Practical secure
aggregation for privacy-preserving machine learning", CCS 2017, §3). A real
value ``x`` is encoded as ``round(x * 2^f) mod 2^64`` with ``f`` fraction
bits; a sum of encodings decodes, read as a signed 64-bit integer and
divided by ``2^f``, to the sum of the rounded values, exactly, as long as
the true sum stays inside ``(-2^(63-f), 2^(63-f))``. Each of ``n`` sites must
therefore keep every entry inside ``2^(63-f) / n``; :func:`encode` refuses
anything outside that per-party range instead of letting the sum wrap.

numpy's ``uint64`` arithmetic wraps modulo ``2^64``, which is the ring's
addition.
"""

from __future__ import annotations

import math

import numpy as np

from fedstats.errors import StudyConfigurationError

RING_BITS = 64
DEFAULT_FRACTION_BITS = 32


def per_party_limit(fraction_bits: int, parties: int) -> float:
    """Largest magnitude one of ``parties`` encodings may hold so that their sum cannot wrap."""
    return 2.0 ** (RING_BITS - 1 - fraction_bits) / parties


def check_fraction_bits(fraction_bits: int) -> int:
    if not isinstance(fraction_bits, int) or not 0 <= fraction_bits <= 52:
        raise StudyConfigurationError(
            f"fixed-point fraction bits must be an integer in [0, 52], got {fraction_bits!r}"
        )
    return fraction_bits


def encode(values: np.ndarray, fraction_bits: int, parties: int) -> np.ndarray:
    """``round(values * 2^f) mod 2^64`` as ``uint64``; ``ValueError`` when out of range."""
    values = np.asarray(values, dtype=np.float64).ravel()
    limit = per_party_limit(fraction_bits, parties)
    if not np.all(np.isfinite(values)) or (values.size and np.max(np.abs(values)) >= limit):
        worst = float(np.max(np.abs(values))) if values.size else 0.0
        raise ValueError(
            f"a value of magnitude {worst:.4g} is outside the secure-aggregation range "
            f"(|x| < {limit:.4g} for {parties} parties at {fraction_bits} fraction bits)"
        )
    scaled = np.rint(values * 2.0**fraction_bits).astype(np.int64)
    return scaled.view(np.uint64)


def decode(total: np.ndarray, fraction_bits: int) -> np.ndarray:
    """The signed value of a ring element, divided by ``2^f``."""
    signed = np.asarray(total, dtype=np.uint64).view(np.int64)
    return signed.astype(np.float64) / 2.0**fraction_bits


def resolution(fraction_bits: int) -> float:
    """The grid step ``2^-f``: each encoded entry is within half of it of its value."""
    return math.ldexp(1.0, -fraction_bits)
