"""The wire of vertical logistic regression: one registry holds the outcome, hospitals the
covariates of the same (linked) patients.

The only quantity of a logistic likelihood that needs both sites is ``X^T y``: the score
``X^T y - X^T p(beta)``, the information ``X^T W X`` and the log-likelihood
``beta^T X^T y - sum log(1 + exp(eta))`` are computed at the hospital once it holds
``X^T y``, which does not depend on ``beta``. ``X^T y`` crosses once, under Paillier's
additively homomorphic encryption (Paillier, EUROCRYPT 1999; python-paillier, ``phe``):

1. ``vertical.encrypt_outcome`` (registry): a fresh key pair per (linkage, design), its
   public key and ``Enc(y_i)`` for every linked pair, in pair-id order; signed.
2. ``vertical.masked_products`` (hospital): the registry's signed reply relayed; per design
   column ``j``, ``Enc(S_j + r_j)`` with ``S_j = sum_i y_i round(x_ij 2^F)`` (a residue mod
   ``n``: negative values wrap) and ``r_j`` uniform in ``Z_n``; re-randomised; signed.
3. ``vertical.decrypt`` (registry): the hospital's signed reply relayed; once per key, exactly
   as many values as the design has columns; the masked sums, signed.
4. ``vertical.unmask`` (hospital): the registry's signed values relayed; the hospital removes
   its masks and keeps ``X^T y`` (exact to ``n 2^-(F+1)``).
5. ``vertical.summaries`` (hospital): Newton rounds on the path rule of logistic regression
   (:data:`fedstats.contract.path_rules.PATH_RULES`).

Big integers (the modulus, ciphertexts, residues) travel as arrays of little-endian 64-bit
words (:func:`words_of`), since the codec's integers stop at 64 bits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from fedstats.contract.paths import design_digest, digest, reply_digest
from fedstats.contract.task_spec import TaskSpec
from fedstats.contract.tasks.design import checked_beta, spec_from_args
from fedstats.errors import MalformedRequestError
from fedstats.schema import Array, Ciphertexts, Number, Text

KEY_BITS = 2048
"""The Paillier modulus' bits (the registry's fresh key per linkage and design)."""
MODULUS_WORDS = KEY_BITS // 64
"""64-bit words of a modulus ``n`` or of a residue mod ``n``."""
CIPHERTEXT_WORDS = 2 * MODULUS_WORDS
"""64-bit words of a ciphertext (mod ``n^2``)."""
FRACTION_BITS = 52
"""``F``: covariates are multiplied by ``2^F`` and rounded before the homomorphic sums."""
MAX_PAIRS = 1_000_000
"""The most linked pairs a request may name."""
MAX_NAME_CHARS = 200
SIGNATURE = Text(max_chars=200)

ENCRYPT = "vertical.encrypt_outcome"
MASKED = "vertical.masked_products"
DECRYPT = "vertical.decrypt"
UNMASK = "vertical.unmask"
PREPARE = "vertical.prepare"
SUMMARIES_TASK = "vertical.summaries"

OUTCOME, COVARIATES = "outcome", "covariates"
"""The roles of the sites of a vertical fit: the registry (outcome), the hospitals."""

STATEMENT_KIND = "fedstats vertical reply v1"


# ------------------------------------------------------------------ big integers


def words_of(values: Sequence[int], words: int) -> np.ndarray:
    """Non-negative integers below ``2^(64 words)`` as a ``(len, words)`` uint64 array."""
    out = np.zeros((len(values), words), dtype=np.uint64)
    for i, value in enumerate(values):
        out[i] = np.frombuffer(int(value).to_bytes(8 * words, "little"), dtype="<u8")
    return out


def integers_of(array: np.ndarray) -> list[int]:
    """The integers of a ``(count, words)`` uint64 array (:func:`words_of`)."""
    little = np.ascontiguousarray(array, dtype="<u8")
    return [int.from_bytes(row.tobytes(), "little") for row in little]


def modulus_of(public_key: Any) -> int:
    """A wire public key (``MODULUS_WORDS`` words) as the modulus ``n``, or
    :class:`~fedstats.errors.MalformedRequestError`."""
    if not (
        isinstance(public_key, np.ndarray)
        and public_key.dtype == np.uint64
        and public_key.shape == (MODULUS_WORDS,)
    ):
        raise MalformedRequestError(
            site=None, task=None, reason=f"a public key is {MODULUS_WORDS} 64-bit words"
        )
    n = integers_of(public_key[None, :])[0]
    if n.bit_length() != KEY_BITS or n % 2 == 0:
        raise MalformedRequestError(
            site=None, task=None, reason=f"a public key is an odd {KEY_BITS}-bit modulus"
        )
    return n


def key_digest(n: int) -> str:
    """The digest naming a key: SHA-256 of its modulus' bytes."""
    return digest(int(n).to_bytes(KEY_BITS // 8, "big"))


# ------------------------------------------------------------------ signed replies


def statement(
    task: str,
    signer: str,
    linkage: str,
    design: Any,
    reply: Mapping[str, Any],
    bound: Mapping[str, str] | None = None,
) -> bytes:
    """The bytes a site signs over a vertical reply: canonical JSON of the task, the signing
    site, the linkage, the design's digest, the reply's digest (every field but the
    signature, :func:`fedstats.contract.paths.reply_digest`) and ``bound`` (the recipient,
    the key); signed with the key the study's roster pins for the site."""
    fields = {k: v for k, v in reply.items() if k != "signature"}
    return json.dumps(
        {"kind": STATEMENT_KIND, "task": task, "site": signer, "linkage": linkage,
         "design": design_digest(design), "reply": reply_digest(fields),
         "bound": dict(sorted((bound or {}).items()))},
        sort_keys=True, separators=(",", ":"),
    ).encode()  # fmt: skip


# ------------------------------------------------------------------ arguments


def linkage_of(args: Mapping[str, Any]) -> str:
    """The request's ``linkage``: the id of a linkage the sites accepted."""
    value = args.get("linkage")
    if not (isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS):
        raise MalformedRequestError(
            site=None, task=None, reason="'linkage' must name an accepted linkage"
        )
    return value


MAX_HOSPITALS = 100


def linkages_of(args: Mapping[str, Any]) -> dict[str, str]:
    """A Newton round's ``linkages``: each hospital's linkage id, by site (one request for
    every hospital, so that each signs the same request on the path)."""
    value = args.get("linkages")
    if not (
        isinstance(value, dict)
        and 0 < len(value) <= MAX_HOSPITALS
        and all(isinstance(v, str) and 0 < len(v) <= MAX_NAME_CHARS for v in value.values())
    ):
        raise MalformedRequestError(
            site=None, task=None, reason="'linkages' must give each hospital's linkage id"
        )
    return value


def pairs_of(args: Mapping[str, Any]) -> int:
    """The request's ``n_pairs``: how many linked pairs the linkage holds."""
    value = args.get("n_pairs")
    if type(value) is not int or not 1 <= value <= MAX_PAIRS:
        raise MalformedRequestError(
            site=None, task=None, reason=f"'n_pairs' must be an integer from 1 to {MAX_PAIRS}"
        )
    return value


def site_of(args: Mapping[str, Any], key: str) -> str:
    """A site named by the request (``registry``, ``hospital``)."""
    value = args.get(key)
    if not (isinstance(value, str) and 0 < len(value) <= MAX_NAME_CHARS):
        raise MalformedRequestError(site=None, task=None, reason=f"{key!r} must name a site")
    return value


def relayed(args: Mapping[str, Any], key: str, fields: Mapping[str, tuple[int, ...]]) -> dict:
    """A signed reply relayed under ``key``: exactly ``fields`` (uint64 arrays of these
    shapes) and its ``signature``."""
    value = args.get(key)
    if not (
        isinstance(value, dict)
        and set(value) == {*fields, "signature"}
        and isinstance(value["signature"], str)
        and len(value["signature"]) <= SIGNATURE.max_chars
        and all(
            isinstance(value[f], np.ndarray)
            and value[f].dtype == np.uint64
            and value[f].shape == shape
            for f, shape in fields.items()
        )
    ):
        layout = ", ".join(f"{f} {shape}" for f, shape in fields.items())
        raise MalformedRequestError(
            site=None,
            task=None,
            reason=f"{key!r} must be a signed reply holding {layout} (64-bit words) and its "
            "signature",
        )
    return value


def vertical_spec(args: Mapping[str, Any]) -> Any:
    """The request's design: a binary outcome, no site intercepts, offset, weights or strata
    (a vertical fit has one outcome column at one site)."""
    spec = spec_from_args(dict(args))
    if (
        spec.outcome_kind != "binary"
        or spec.site_intercepts
        or spec.offset
        or spec.weights
        or spec.exposure
        or spec.strata
        or spec.missing != "raise"
    ):
        raise MalformedRequestError(
            site=None,
            task=None,
            reason="a vertical fit takes a binary outcome and a plain formula: no site "
            "intercepts, offset, weights, exposure, strata, and missing='raise'",
        )
    return spec


# ------------------------------------------------------------------ schemas


def prepare_schema(args: dict[str, Any]) -> dict:
    vertical_spec(args)
    linkage_of(args)
    role = args.get("role")
    if role == OUTCOME:
        return {"n_pairs": Number(), "n_events": Number()}
    if role == COVARIATES:
        return {"n_pairs": Number(), "ready": Number()}
    raise MalformedRequestError(
        site=None, task=None, reason=f"'role' must be {OUTCOME!r} or {COVARIATES!r}"
    )


def encrypt_schema(args: dict[str, Any]) -> dict:
    vertical_spec(args)
    linkage_of(args)
    return {
        "public_key": Array((MODULUS_WORDS,)),
        "ciphertexts": Ciphertexts(pairs_of(args), CIPHERTEXT_WORDS, key="public_key"),
        "signature": SIGNATURE,
    }


def masked_schema(args: dict[str, Any]) -> dict:
    spec = vertical_spec(args)
    linkage_of(args)
    site_of(args, "registry")
    relayed(args, "encrypted", {"public_key": (MODULUS_WORDS,),
                                "ciphertexts": (pairs_of(args), CIPHERTEXT_WORDS)})  # fmt: skip
    return {"masked": Array((spec.n_params, CIPHERTEXT_WORDS)), "signature": SIGNATURE}


def decrypt_schema(args: dict[str, Any]) -> dict:
    spec = vertical_spec(args)
    linkage_of(args)
    site_of(args, "hospital")
    relayed(args, "masked", {"masked": (spec.n_params, CIPHERTEXT_WORDS)})
    modulus_of(args.get("public_key"))
    return {"values": Array((spec.n_params, MODULUS_WORDS)), "signature": SIGNATURE}


def unmask_schema(args: dict[str, Any]) -> dict:
    spec = vertical_spec(args)
    linkage_of(args)
    site_of(args, "registry")
    relayed(args, "decrypted", {"values": (spec.n_params, MODULUS_WORDS)})
    return {"columns": Number()}


def summaries_schema(args: dict[str, Any]) -> dict:
    spec = vertical_spec(args)
    linkages_of(args)
    checked_beta(None, args, spec.n_params)
    p = spec.n_params
    return {
        "gradient": Array((p,)),
        "hessian": Array((p, p)),
        "loglik": Number(),
        "all_extreme": Number(),
        "any_extreme": Number(),
    }


PREPARE_SPEC = TaskSpec(
    name=PREPARE,
    schema=prepare_schema,
    description="a vertical fit's linked rows: pairs, and events at the registry",
)
ENCRYPT_SPEC = TaskSpec(
    name=ENCRYPT,
    schema=encrypt_schema,
    description="the registry's fresh Paillier key and Enc(y) per linked pair (signed)",
)
MASKED_SPEC = TaskSpec(
    name=MASKED,
    schema=masked_schema,
    description="Enc(X^T y + mask) per design column, from the registry's signed Enc(y)",
)
DECRYPT_SPEC = TaskSpec(
    name=DECRYPT,
    schema=decrypt_schema,
    description="the registry decrypts a hospital's signed masked sums, once per key",
)
UNMASK_SPEC = TaskSpec(
    name=UNMASK,
    schema=unmask_schema,
    description="the hospital removes its masks from the registry's signed values",
)
SUMMARIES = TaskSpec(
    name=SUMMARIES_TASK,
    schema=summaries_schema,
    description="vertical logistic score, information and log-likelihood at coefficients",
)
SPECS = (PREPARE_SPEC, ENCRYPT_SPEC, MASKED_SPEC, DECRYPT_SPEC, UNMASK_SPEC, SUMMARIES)
