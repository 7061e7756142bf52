"""Shamir secret sharing of 32-byte secrets over the prime field GF(2^521 - 1).

A secret ``s`` becomes the constant term of a random polynomial ``q`` of
degree ``t - 1``; party ``i`` (``i = 1..n``) holds ``q(i)``. Any ``t``
shares give ``s = q(0)`` by Lagrange interpolation; fewer reveal nothing
about it (Shamir, "How to share a secret", CACM 22(11), 1979). Secure
aggregation shares each site's mask seed and key this way, so the
coordinator can remove the masks of sites that drop out as long as ``t``
sites answer (Bonawitz et al., CCS 2017, §4).

The field is the Mersenne prime ``2^521 - 1``, larger than any 32-byte
secret. Coefficients come from :mod:`secrets` (the OS's entropy source).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Mapping

PRIME = (1 << 521) - 1
SECRET_BYTES = 32
SHARE_BYTES = 66  # 521 bits


def split(secret: bytes, threshold: int, parties: int) -> dict[int, bytes]:
    """Shares ``{i: q(i)}`` for ``i = 1..parties``; any ``threshold`` of them rebuild ``secret``."""
    if not 1 <= threshold <= parties:
        raise ValueError(f"threshold {threshold} must be between 1 and {parties}")
    return split_at(secret, threshold, range(1, parties + 1))


def split_at(secret: bytes, threshold: int, points: Iterable[int]) -> dict[int, bytes]:
    """Shares ``{x: q(x)}`` at the given distinct positive points only (a site's holders in a
    sparse graph); any ``threshold`` of them rebuild ``secret``."""
    points = list(points)
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"a secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    if not 1 <= threshold <= len(points):
        raise ValueError(f"threshold {threshold} must be between 1 and {len(points)}")
    if any(x <= 0 for x in points) or len(set(points)) != len(points):
        raise ValueError("share points must be distinct positive integers")
    coefficients = [int.from_bytes(secret, "big")] + [
        secrets.randbelow(PRIME) for _ in range(threshold - 1)
    ]
    shares = {}
    for x in points:
        y = 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        shares[x] = y.to_bytes(SHARE_BYTES, "big")
    return shares


def combine(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """Rebuild the secret from at least ``threshold`` shares (``q(0)`` by Lagrange)."""
    if len(shares) < threshold:
        raise ValueError(f"{len(shares)} shares cannot rebuild a secret of threshold {threshold}")
    points = [(x, int.from_bytes(y, "big")) for x, y in list(shares.items())[:threshold]]
    if any(x <= 0 for x, _ in points) or len({x for x, _ in points}) != len(points):
        raise ValueError("share indices must be distinct positive integers")
    secret = 0
    for i, (xi, yi) in enumerate(points):
        numerator, denominator = 1, 1
        for j, (xj, _) in enumerate(points):
            if i != j:
                numerator = numerator * (-xj) % PRIME
                denominator = denominator * (xi - xj) % PRIME
        secret = (secret + yi * numerator * pow(denominator, -1, PRIME)) % PRIME
    if secret >= 1 << (8 * SECRET_BYTES):
        raise ValueError("the shares do not rebuild a secret (inconsistent shares)")
    return secret.to_bytes(SECRET_BYTES, "big")
