"""The one exception to the parameter-size rule: a registry's encrypted outcomes.

Every reply's size follows from the number of parameters (:mod:`fedstats.site.disclosure`),
except the reply of ``vertical.encrypt_outcome``, which is one Paillier ciphertext per
linked pair (:class:`fedstats.schema.Ciphertexts`). The exception is narrow, and checked
here, where every reply is checked (:func:`fedstats.site.disclosure.check_reply`):

* only the tasks of :data:`CIPHERTEXT_TASKS` may declare such a field;
* the key in the reply must be one this site made for this reply and never released
  before (:class:`PaillierKeys`: a fresh key per linkage and design, its private half kept
  at the site);
* every value must be a ciphertext under it (``0 < c < n^2``) that was re-randomised: an
  encryption with randomness 1 is ``c = 1 + m n`` and shows ``m = (c - 1) / n``, so a value
  with ``c mod n = 1`` is refused (a random ``r^n mod n`` is 1 with probability ``1/n``).

So no clear value can leave in the field, whatever a handler puts there.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedstats.contract.tasks.vertical import ENCRYPT, integers_of, key_digest, modulus_of
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.schema import Ciphertexts, ReplySchema

if TYPE_CHECKING:  # phe (the linkage extra) is imported only where a key is made or read
    from phe import PaillierPrivateKey

CIPHERTEXT_TASKS = frozenset({ENCRYPT})
"""The tasks whose reply may hold a :class:`~fedstats.schema.Ciphertexts` field."""


@dataclass
class KeyRecord:
    """A key pair the site made: what it was made for, and what it has done with it."""

    private_key: PaillierPrivateKey
    linkage: str
    design: str
    released: bool = False
    """Whether its public key and ciphertexts left the site (once, in one reply)."""
    decrypted: bool = False
    """Whether it decrypted a hospital's masked sums (once)."""


@dataclass
class PaillierKeys:
    """The Paillier keys a site made, by :func:`~fedstats.contract.tasks.vertical.key_digest`,
    and the (linkage, design) each one serves: one key per analysis, ever."""

    records: dict[str, KeyRecord] = field(default_factory=dict)
    analyses: dict[tuple[str, str], str] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, private_key: PaillierPrivateKey, linkage: str, design: str) -> None:
        with self.lock:
            digest = key_digest(private_key.public_key.n)
            self.records[digest] = KeyRecord(private_key, linkage, design)
            self.analyses[(linkage, design)] = digest

    def of_analysis(self, linkage: str, design: str) -> KeyRecord | None:
        digest = self.analyses.get((linkage, design))
        return None if digest is None else self.records[digest]

    def get(self, n: int) -> KeyRecord | None:
        return self.records.get(key_digest(n))


def check_ciphertexts(
    schema: ReplySchema,
    payload: dict[str, Any],
    keys: PaillierKeys | None,
    *,
    site: str,
    task: str,
) -> None:
    """Refuse a reply whose :class:`~fedstats.schema.Ciphertexts` fields break the rules of
    the module docstring (rule ``shape``); then mark their keys released. Call after the
    payload matched its schema."""
    fields = {name: f for name, f in schema.items() if isinstance(f, Ciphertexts)}
    if not fields:
        return
    if task not in CIPHERTEXT_TASKS or keys is None:
        raise _refused(site, task, "only a registry's encrypted outcomes may be ciphertexts")
    released = []
    for name, spec in fields.items():
        try:
            n = modulus_of(payload.get(spec.key))
        except MalformedRequestError:
            raise _refused(site, task, f"{name!r} names no Paillier public key") from None
        record = keys.get(n)
        if record is None or record.released:
            raise _refused(
                site, task, f"{name!r} is not under a key this site made fresh for this reply"
            )
        square = n * n
        for c in integers_of(payload[name]):
            if not 0 < c < square or c % n == 1:
                raise _refused(
                    site, task, f"{name!r} holds a value that is not a re-randomised ciphertext"
                )
        released.append(record)
    for record in released:
        record.released = True


def _refused(site: str, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=site, task=task, reason=reason, rule="shape")
