"""Unbiased stochastic quantisation of update vectors to ``b`` bits per entry.

A vector ``x`` with ``M = max |x_i|`` is mapped to the grid of ``L = 2^b - 1``
steps on ``[-M, M]``: ``u_i = (x_i + M) L / (2M)`` is rounded down or up at
random, up with probability ``u_i - floor(u_i)``, so the decoded
``x^_i = q_i 2M / L - M`` satisfies ``E[x^_i] = x_i`` and
``Var[x^_i] <= (M / L)^2`` (stochastic rounding as in QSGD, Alistarh et al.,
NeurIPS 2017). The codes are bit-packed: ``ceil(d b / 8)`` bytes plus the
8-byte scale ``M`` travel instead of ``8 d`` bytes of float64.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedstats.errors import StudyConfigurationError


@dataclass(frozen=True)
class Quantized:
    """Bit-packed codes of a vector, with what is needed to decode them."""

    packed: np.ndarray  # uint8
    scale: float
    bits: int
    length: int

    @property
    def nbytes(self) -> int:
        """Bytes on the wire: the packed codes and the float64 scale."""
        return int(self.packed.nbytes) + 8

    def to_wire(self) -> dict:
        return {
            "packed": self.packed,
            "scale": self.scale,
            "bits": self.bits,
            "length": self.length,
        }

    @classmethod
    def from_wire(cls, message: dict) -> Quantized:
        bits, length = int(message["bits"]), int(message["length"])
        check_bits(bits)
        packed = np.asarray(message["packed"], dtype=np.uint8)
        if packed.size != math.ceil(length * bits / 8) or not math.isfinite(message["scale"]):
            raise ValueError("quantized message has inconsistent size or scale")
        return cls(packed, float(message["scale"]), bits, length)


def check_bits(bits: int) -> int:
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 16:
        raise StudyConfigurationError(
            f"quantisation bits must be an integer in 1..16, got {bits!r}"
        )
    return bits


def quantize(x: np.ndarray, bits: int, rng: np.random.Generator | None = None) -> Quantized:
    """Stochastically round ``x`` to ``bits`` bits per entry (unbiased)."""
    check_bits(bits)
    rng = rng if rng is not None else np.random.default_rng()
    x = np.asarray(x, dtype=np.float64).ravel()
    if not np.all(np.isfinite(x)):
        raise ValueError("cannot quantise non-finite values")
    scale = float(np.max(np.abs(x))) if x.size else 0.0
    levels = (1 << bits) - 1
    if scale == 0.0:
        codes = np.zeros(x.size, dtype=np.uint32)
    else:
        u = (x / scale + 1.0) * (levels / 2)  # x / scale in [-1, 1]: no overflow
        low = np.floor(u)
        codes = (low + (rng.random(x.size) < (u - low))).clip(0, levels).astype(np.uint32)
    # bit planes, most significant first, packed 8 entries per byte
    planes = ((codes[:, None] >> np.arange(bits - 1, -1, -1, dtype=np.uint32)) & 1).astype(np.uint8)
    return Quantized(np.packbits(planes.ravel()), scale, bits, x.size)


def dequantize(q: Quantized) -> np.ndarray:
    """The decoded vector ``x^`` (unbiased for the quantised ``x``)."""
    levels = (1 << q.bits) - 1
    planes = np.unpackbits(q.packed)[: q.length * q.bits].reshape(q.length, q.bits)
    weights = (1 << np.arange(q.bits - 1, -1, -1)).astype(np.uint32)
    codes = planes.astype(np.uint32) @ weights
    if q.scale == 0.0:
        return np.zeros(q.length)
    # on [-1, 1] first, then scaled: 2 M / L underflows for a subnormal M
    return (codes * (2.0 / levels) - 1.0) * q.scale
