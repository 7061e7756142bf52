"""No per-patient value crosses in the clear in a vertical fit: every message inspected.

Every request and reply of a vertical fit is captured as the bytes the transport carries and
decoded with the codec. The only arrays as long as the linkage are the registry's Paillier
ciphertexts (64-bit words of numbers mod ``n^2``), each re-randomised (an encryption with
randomness 1 is ``1 + m n`` and would show ``m``); every other array is parameter-sized;
the registry's decrypted values are the hospital's sums plus a mask (not ``X^T y``); and
no number of any message equals a patient's outcome vector, covariate column, linear
predictor, fitted probability or residual (all longer than any clear array that crosses).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from formulaic import model_matrix
from scipy.special import expit

import fedstats
from fedstats.contract import codec
from fedstats.contract.tasks import vertical as wire
from tests.vertical.linked_frames import vertical_study


def leaves(value, path="message"):
    """Every (path, leaf) of a decoded message."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield from leaves(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from leaves(item, f"{path}[{i}]")
    else:
        yield path, value


def test_no_message_of_a_vertical_fit_carries_a_patients_clear_value():
    rng = np.random.default_rng(8)
    n = 150
    joined = pd.DataFrame({"age": rng.uniform(30, 90, n), "x": rng.normal(size=n)})
    joined["y"] = (rng.random(n) < expit(-3 + 0.05 * joined["age"] + joined["x"])).astype(int)
    study = vertical_study({"clinic": joined}, ["y"], seed=4)
    fed = study.federation
    captured = []
    for site in fed.sites:
        carry = fed._transports[site]

        def tapped(request, carry=carry, site=site):
            reply = carry(request)
            captured.append((site, codec.decode(request), codec.decode(reply)))
            return reply

        fed._transports[site] = tapped
    formula = "y ~ age + x"
    result = fedstats.VerticalLogisticRegression(
        formula, outcome_site="registry", covariate_sites=["clinic"], linkage_id="L-clinic"
    ).fit(fed)
    y, X = model_matrix(formula, joined)
    y, X = y.to_numpy().ravel(), X.to_numpy()
    p = X.shape[1]
    eta = X @ result.params.to_numpy()
    per_patient = {"y": y, "eta": eta, "p": expit(eta), "residual": y - expit(eta)}
    per_patient.update({f"x{j}": X[:, j] for j in range(p)})
    long_arrays, public_key = [], None
    tasks = set()
    for _site, request, reply in captured:
        task = request["task"]
        tasks.add(task)
        assert reply["status"] == "ok", reply
        for path, leaf in [*leaves(request, "request"), *leaves(reply, "reply")]:
            if not isinstance(leaf, np.ndarray):
                continue
            if leaf.dtype == np.uint64:  # big integers: keys, ciphertexts, masked residues
                if leaf.shape == (n, wire.CIPHERTEXT_WORDS):
                    long_arrays.append((task, path, leaf))
                else:
                    assert leaf.shape[0] <= p or leaf.shape == (wire.MODULUS_WORDS,), path
                if leaf.shape == (wire.MODULUS_WORDS,):
                    public_key = wire.integers_of(leaf[None, :])[0]
                continue
            assert leaf.size <= p * p, f"{task} {path}: {leaf.shape} is not parameter-sized"
            values = leaf.ravel()
            for name, column in per_patient.items():  # no patient's value vector, nor part
                if len(np.unique(column)) <= 10:  # 0/1 values: their length rules them out
                    continue
                overlap = np.isin(np.round(column, 12), np.round(values, 12)).sum()
                assert overlap <= 2, f"{task} {path} holds {overlap} values of {name}"
    assert {"vertical.encrypt_outcome", "vertical.masked_products", "vertical.decrypt",
            "vertical.unmask", "vertical.summaries"} <= tasks  # fmt: skip
    # the only arrays as long as the linkage: the registry's ciphertexts, as they left it
    # and as relayed, each re-randomised and under the registry's key
    assert {t for t, _, _ in long_arrays} == {
        "vertical.encrypt_outcome",
        "vertical.masked_products",
    }
    square = public_key * public_key
    for _, _, words in long_arrays:
        for c in wire.integers_of(words):
            assert 0 < c < square and c % public_key != 1
    # the decrypted values are masked: not X^T y in fixed point (nor its negative residue)
    decrypted = next(r for _, q, r in captured if q["task"] == "vertical.decrypt")["result"]
    exact = np.rint(np.ldexp(X.T @ y, wire.FRACTION_BITS))
    for value, clear in zip(wire.integers_of(decrypted["values"]), exact, strict=True):
        assert (value - int(clear)) % public_key != 0
    # and the fit is the joined rows' fit (the capture changed nothing)
    assert result.converged
