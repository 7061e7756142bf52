"""The cryptographic primitives of secure aggregation, all from ``cryptography``.

* key agreement: X25519 (RFC 7748) between two sites' key pairs; the shared
  secret goes through HKDF-SHA256 (RFC 5869) with the session and purpose in
  its ``info`` before any use;
* share transport: a site encrypts the Shamir shares it owes another site
  with AES-256-GCM under their agreed key, the session, sender and receiver
  bound as associated data, so the coordinator relaying them can neither
  read nor redirect them;
* masks: a 32-byte seed expands to a vector of ``uint64`` ring elements by
  AES-256 in counter mode (the PRG of Bonawitz et al., CCS 2017, §4).
"""

from __future__ import annotations

import os

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16


def new_private_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def public_bytes(key: X25519PrivateKey) -> bytes:
    """The 32 raw bytes of ``key``'s public half (RFC 7748)."""
    return key.public_key().public_bytes_raw()


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes_raw()


def private_from_bytes(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def public_from_bytes(raw: bytes) -> X25519PublicKey:
    """A peer's public key from its 32 raw bytes; ``ValueError`` when it is not one."""
    if len(raw) != KEY_BYTES:
        raise ValueError(f"an X25519 public key is {KEY_BYTES} bytes, got {len(raw)}")
    return X25519PublicKey.from_public_bytes(raw)


def agreed_key(own: X25519PrivateKey, peer_public: bytes, session: str, purpose: str) -> bytes:
    """``HKDF-SHA256(X25519(own, peer), info = purpose | session)``: 32 bytes both sides derive.

    ``ValueError`` for a peer key that is not one, or that agrees on the all-zero secret
    (a small-order point, RFC 7748 §6.1)."""
    shared = own.exchange(public_from_bytes(peer_public))
    return HKDF(
        algorithm=hashes.SHA256(),
        length=KEY_BYTES,
        salt=None,
        info=f"fedstats secagg {purpose} {session}".encode(),
    ).derive(shared)


def seal(key: bytes, plaintext: bytes, associated: str) -> bytes:
    """AES-256-GCM with a random nonce: ``nonce | ciphertext | tag``."""
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated.encode())


def open_sealed(key: bytes, sealed: bytes, associated: str) -> bytes:
    """Decrypt :func:`seal`'s output; ``ValueError`` when it was altered, replayed from
    another session or addressed to another site (the associated data differ)."""
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], associated.encode())
    except (ValueError, InvalidTag):
        raise ValueError("a sealed share failed authentication") from None


def mask(seed: bytes, length: int) -> np.ndarray:
    """``length`` ring elements from AES-256-CTR keyed by ``seed`` (zero counter start)."""
    stream = Cipher(algorithms.AES(seed), modes.CTR(bytes(16))).encryptor()
    return np.frombuffer(stream.update(bytes(8 * length)), dtype="<u8").copy()
