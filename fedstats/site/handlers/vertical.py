"""Site side of vertical logistic regression (:mod:`fedstats.contract.tasks.vertical`).

The registry holds the 0/1 outcome ``y`` of the linked patients, a hospital their design
``X``. ``X^T y`` is computed under the registry's Paillier key (Paillier, EUROCRYPT 1999,
with python-paillier):

* registry, ``vertical.encrypt_outcome``: a fresh 2048-bit key pair for the (linkage,
  design), ``Enc(y_i)`` per pair with fresh randomness, signed;
* hospital, ``vertical.masked_products``: checks the registry's signature with the key its
  roster pins (so the public key is the registry's, not one the coordinator made), then
  ``Enc(S_j + r_j) = Enc(r_j) prod_i Enc(y_i)^{k_ij}``, ``k_ij = round(x_ij 2^F)``, with
  ``r_j`` uniform in ``Z_n`` and the product re-randomised by ``Enc(r_j)``'s fresh
  randomness; signed;
* registry, ``vertical.decrypt``: checks the hospital's signature, decrypts once per key
  exactly as many values as the design has columns, signed: ``S_j + r_j mod n``, uniform to
  anyone without ``r_j``;
* hospital, ``vertical.unmask``: checks the registry's signature and keeps
  ``(X^T y)_j = ((v_j - r_j) mod n, as a signed residue) / 2^F``;
* hospital, ``vertical.summaries``: at ``beta`` on the verified path, the score
  ``X^T y - X^T mu``, the information ``X^T diag(mu (1 - mu)) X`` and the log-likelihood
  ``beta^T X^T y - sum log(1 + exp(eta))``, ``eta = X beta``, ``mu = expit(eta)``: the sums
  of :mod:`fedstats.site.handlers.logistic`, so hospitals' replies add up as sites' do.

Unlike Hardy et al. (2017, arXiv:1711.10677), who encrypt per-patient terms of a Taylor
approximation of the loss, only ``X^T y`` crosses, once: the fit is exact. Semi-honest
sites: a hospital running modified software could send a column isolating one patient and
learn that patient's outcome from ``X^T y``; the registry cannot see the columns. The
coordinator is treated as malicious: it sees ciphertexts, masked residues and the sums of
the horizontal fit; every relayed value is signed by the site that made it.
"""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy.special import expit

from fedstats.contract.paths import design_digest
from fedstats.contract.tasks import vertical as wire
from fedstats.contract.tasks.design import checked_beta
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.site.handlers.logistic import extreme_flags
from fedstats.site.resource_limits import check_deadline
from fedstats.site.row_blocks import Information, column_blocks
from fedstats.site.task import SiteContext, TaskReply
from fedstats.site.vertical_design import hospital_design, registry_outcome

if TYPE_CHECKING:  # phe (the linkage extra) is imported where a key is made or read
    from phe import EncryptedNumber, PaillierPublicKey

MASKS = "vertical masks"
PRODUCTS = "vertical products"


# ------------------------------------------------------------------ both roles


def prepare(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Build and check the site's half of the design over the linked rows; the number of
    pairs, and the events at the registry (whether ``X^T y`` is held, at a hospital)."""
    spec = wire.vertical_spec(args)
    linkage = wire.linkage_of(args)
    rows, _ = ctx.linkages.rows(linkage, wire.PREPARE)
    if args["role"] == wire.OUTCOME:
        y = registry_outcome(ctx, spec, linkage, wire.PREPARE)
        return TaskReply({"n_pairs": rows.n_pairs, "n_events": int(y.sum())}, rows.n_pairs)
    hospital_design(ctx, spec, linkage, wire.PREPARE)
    ready = _analysis(spec, linkage) in ctx.cache.get(PRODUCTS, {})
    return TaskReply({"n_pairs": rows.n_pairs, "ready": int(ready)}, rows.n_pairs)


# ------------------------------------------------------------------ registry


def encrypt_outcome(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """A fresh key for this (linkage, design) and ``Enc(y_i)`` per linked pair, signed."""
    spec = wire.vertical_spec(args)
    linkage = wire.linkage_of(args)
    pin = _pin(ctx, wire.ENCRYPT)
    rows, _ = ctx.linkages.rows(linkage, wire.ENCRYPT)
    if rows.n_pairs != wire.pairs_of(args):
        raise _refused(ctx, wire.ENCRYPT, "the request names another number of linked pairs")
    y = registry_outcome(ctx, spec, linkage, wire.ENCRYPT)
    design = design_digest(spec.to_wire())
    keys = ctx.paillier_keys
    if keys.of_analysis(linkage, design) is not None:
        raise _refused(
            ctx,
            wire.ENCRYPT,
            "the registry encrypts the outcome once per linkage and design (its key decrypts "
            "once); a repeated fit reads the hospitals' kept X^T y",
        )
    from phe import generate_paillier_keypair  # the linkage extra, imported when first used

    public_key, private_key = generate_paillier_keypair(n_length=wire.KEY_BITS)
    keys.add(private_key, linkage, design)
    ciphertexts = []
    for i, value in enumerate(y.tolist()):
        if i % 64 == 0:
            check_deadline(ctx.deadline, task=wire.ENCRYPT)
        ciphertexts.append(public_key.encrypt(int(value)).ciphertext())  # fresh r per value
    payload = {
        "public_key": wire.words_of([public_key.n], wire.MODULUS_WORDS)[0],
        "ciphertexts": wire.words_of(ciphertexts, wire.CIPHERTEXT_WORDS),
    }
    payload["signature"] = pin.sign_advert(
        wire.statement(wire.ENCRYPT, ctx.name, linkage, spec.to_wire(), payload)
    )
    return TaskReply(payload, contributors=rows.n_pairs)


def decrypt(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Decrypt a hospital's signed masked sums: once per key, for the key's own linkage and
    design, exactly one value per design column."""
    spec = wire.vertical_spec(args)
    linkage = wire.linkage_of(args)
    hospital = wire.site_of(args, "hospital")
    pin = _pin(ctx, wire.DECRYPT)
    rows, _ = ctx.linkages.rows(linkage, wire.DECRYPT)
    n = wire.modulus_of(args["public_key"])
    record = ctx.paillier_keys.get(n)
    design = design_digest(spec.to_wire())
    if record is None or not record.released:
        raise _refused(ctx, wire.DECRYPT, "the key is not one this registry released")
    if (record.linkage, record.design) != (linkage, design):
        raise _refused(ctx, wire.DECRYPT, "the key was made for another linkage or design")
    if record.decrypted:
        raise _refused(ctx, wire.DECRYPT, "this key has decrypted once; it decrypts only once")
    masked = args["masked"]
    if masked["masked"].shape[0] != spec.n_params:  # the schema's too: one per design column
        raise _refused(ctx, wire.DECRYPT, "a registry decrypts one value per design column")
    key = wire.key_digest(n)
    signed = wire.statement(wire.MASKED, hospital, linkage, spec.to_wire(),
                            {"masked": masked["masked"]},
                            bound={"key": key, "registry": ctx.name})  # fmt: skip
    _check_signed(ctx, wire.DECRYPT, pin, hospital, signed, masked["signature"],
                  "the masked sums", "this key, linkage and design")  # fmt: skip
    values = _ciphertexts(masked["masked"], n)
    record.decrypted = True  # before any decryption: a failure below spends the key too
    plain = [record.private_key.raw_decrypt(c) for c in values]
    payload = {"values": wire.words_of(plain, wire.MODULUS_WORDS)}
    payload["signature"] = pin.sign_advert(
        wire.statement(
            wire.DECRYPT,
            ctx.name,
            linkage,
            spec.to_wire(),
            payload,
            bound={"key": key, "hospital": hospital},
        )
    )
    return TaskReply(payload, contributors=rows.n_pairs)


# ------------------------------------------------------------------ hospital


def masked_products(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """``Enc(S_j + r_j)`` per design column under the registry's signed key, signed."""
    spec = wire.vertical_spec(args)
    linkage = wire.linkage_of(args)
    registry = wire.site_of(args, "registry")
    pin = _pin(ctx, wire.MASKED)
    rows, _ = ctx.linkages.rows(linkage, wire.MASKED)
    if rows.n_pairs != wire.pairs_of(args):
        raise _refused(ctx, wire.MASKED, "the encrypted outcomes are not one per linked pair")
    encrypted = args["encrypted"]
    fields = {"public_key": encrypted["public_key"], "ciphertexts": encrypted["ciphertexts"]}
    signed = wire.statement(wire.ENCRYPT, registry, linkage, spec.to_wire(), fields)
    _check_signed(ctx, wire.MASKED, pin, registry, signed, encrypted["signature"],
                  "the public key and encrypted outcomes", "this linkage and design")  # fmt: skip
    n = wire.modulus_of(encrypted["public_key"])
    ciphertexts = _ciphertexts(encrypted["ciphertexts"], n)
    design = hospital_design(ctx, spec, linkage, wire.MASKED)
    from phe import EncryptedNumber, PaillierPublicKey

    public_key = PaillierPublicKey(n)
    encrypted_y = [EncryptedNumber(public_key, c) for c in ciphertexts]
    masks = [secrets.randbelow(n) for _ in design.columns]
    masked = []
    for column, mask in zip(design.columns, masks, strict=True):
        check_deadline(ctx.deadline, task=wire.MASKED)
        masked.append(_masked_sum(public_key, encrypted_y, fixed_point(column), mask))
    ctx.cache.setdefault(MASKS, {})[_analysis(spec, linkage)] = (wire.key_digest(n), n, masks)
    payload = {"masked": wire.words_of(masked, wire.CIPHERTEXT_WORDS)}
    payload["signature"] = pin.sign_advert(
        wire.statement(
            wire.MASKED,
            ctx.name,
            linkage,
            spec.to_wire(),
            payload,
            bound={"key": wire.key_digest(n), "registry": registry},
        )
    )
    return TaskReply(payload, contributors=rows.n_pairs)


def fixed_point(column: np.ndarray) -> list[int]:
    """``round(x 2^F)`` of each value as an integer (``F`` =
    :data:`~fedstats.contract.tasks.vertical.FRACTION_BITS`; exact scaling by a power of 2)."""
    return [int(v) for v in np.rint(np.ldexp(column, wire.FRACTION_BITS)).tolist()]


def _masked_sum(
    public_key: PaillierPublicKey, encrypted_y: list[EncryptedNumber], k: list[int], mask: int
) -> int:
    """``Enc(r + sum_i k_i y_i)``: the positive and negative terms summed apart, so only one
    inverse is taken; ``Enc(r)`` carries fresh randomness, which re-randomises the sum."""
    from phe import EncodedNumber

    total = public_key.encrypt(EncodedNumber(public_key, mask, 0))  # obfuscated
    positive = [c * ki for c, ki in zip(encrypted_y, k, strict=True) if ki > 0]
    negative = [c * -ki for c, ki in zip(encrypted_y, k, strict=True) if ki < 0]
    if positive:
        total = total + sum(positive[1:], positive[0])
    if negative:
        total = total - sum(negative[1:], negative[0])
    return total.ciphertext(be_secure=True)


def unmask(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Remove the masks from the registry's signed values: ``X^T y``, kept for the rounds."""
    spec = wire.vertical_spec(args)
    linkage = wire.linkage_of(args)
    registry = wire.site_of(args, "registry")
    pin = _pin(ctx, wire.UNMASK)
    analysis = _analysis(spec, linkage)
    held = ctx.cache.get(MASKS, {}).get(analysis)
    if held is None:
        raise _refused(ctx, wire.UNMASK, "this site holds no masked sums of that design")
    key, n, masks = held
    decrypted = args["decrypted"]
    signed = wire.statement(wire.DECRYPT, registry, linkage, spec.to_wire(),
                            {"values": decrypted["values"]},
                            bound={"key": key, "hospital": ctx.name})  # fmt: skip
    _check_signed(ctx, wire.UNMASK, pin, registry, signed, decrypted["signature"],
                  "the decrypted values", "this site's masked sums")  # fmt: skip
    del ctx.cache[MASKS][analysis]  # each mask is removed once
    products = []
    for value, mask in zip(wire.integers_of(decrypted["values"]), masks, strict=True):
        residue = (value - mask) % n
        signed_sum = residue - n if residue > n // 2 else residue
        products.append(signed_sum / 2**wire.FRACTION_BITS)  # correctly rounded
    ctx.cache.setdefault(PRODUCTS, {})[analysis] = np.array(products)
    return TaskReply({"columns": len(products)}, contributors=None)


def summaries(ctx: SiteContext, args: dict[str, Any]) -> TaskReply:
    """Score, information and log-likelihood at ``beta`` from the kept ``X^T y``."""
    spec = wire.vertical_spec(args)
    linkage = wire.linkages_of(args).get(ctx.name)
    if linkage is None:
        raise MalformedRequestError(
            site=ctx.name, task=wire.SUMMARIES_TASK, reason="'linkages' names no linkage here"
        )
    beta = checked_beta(ctx.name, args, spec.n_params)
    products = ctx.cache.get(PRODUCTS, {}).get(_analysis(spec, linkage))
    if products is None:
        raise MalformedRequestError(
            site=ctx.name,
            task=wire.SUMMARIES_TASK,
            reason="this site holds no X^T y of that linkage and design: the encrypted "
            "step (vertical.masked_products, vertical.unmask) comes first",
        )
    design = hospital_design(ctx, spec, linkage, wire.SUMMARIES_TASK)
    p = spec.n_params
    expected = np.zeros(p)
    information = Information(p)
    log_partition = 0.0
    all_extreme, any_extreme = True, False
    for _, block in column_blocks(design.columns, design.n_pairs):
        eta = np.dot(block, beta)
        mu = expit(eta)
        expected += np.dot(mu, block)
        information.add(block, mu * (1.0 - mu))
        log_partition += float(np.sum(np.logaddexp(0.0, eta)))
        flags = extreme_flags(mu)
        all_extreme &= flags["all_extreme"]
        any_extreme |= flags["any_extreme"]
    return TaskReply(
        {
            "gradient": products - expected,
            "hessian": information.total(),
            "loglik": float(beta @ products) - log_partition,
            "all_extreme": all_extreme,
            "any_extreme": any_extreme,
        },
        contributors=design.n_pairs,
    )


# ------------------------------------------------------------------ helpers


def _analysis(spec: Any, linkage: str) -> tuple[str, str]:
    return linkage, design_digest(spec.to_wire())


def _pin(ctx: SiteContext, task: str) -> Any:
    if ctx.secure_aggregation is None:
        raise DisclosureError(
            site=ctx.name,
            task=task,
            reason="a vertical fit's replies are signed and checked with the study's pinned "
            "roster and signing keys, which this site does not have",
            rule="roster",
        )
    return ctx.secure_aggregation


def _ciphertexts(words: np.ndarray, n: int) -> list[int]:
    """The Paillier ciphertexts under modulus ``n`` that ``words`` hold (``0 < c < n^2``)."""
    values = wire.integers_of(words)
    square = n * n
    if not all(0 < c < square for c in values):
        raise MalformedRequestError(site=None, task=None, reason="a value is not a ciphertext")
    return values


def _check_signed(
    ctx: SiteContext,
    task: str,
    pin: Any,
    signer: str,
    statement: bytes,
    signature: str,
    what: str,
    scope: str,
) -> None:
    """Refuse ``what`` unless another site, ``signer``, signed ``statement`` with the key this
    site's roster pins for it: the coordinator relays every value, so only a signature tells
    a site's reply from one the coordinator made."""
    if signer == ctx.name or not pin.verify_advert(signer, statement, signature):
        raise _refused(
            ctx,
            task,
            f"{what} are not signed by {signer!r} (the key this site's roster pins for it) for "
            f"{scope}",
        )


def _refused(ctx: SiteContext, task: str, reason: str) -> DisclosureError:
    return DisclosureError(site=ctx.name, task=task, reason=reason, rule="vertical")
