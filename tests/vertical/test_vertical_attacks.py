"""Attacks on a vertical fit, each refused before anything is released.

A malicious coordinator (or a request crafted straight to a silo): asking the registry to
decrypt twice, to decrypt more values than the design has columns, or the registry's own
ciphertexts; relaying a ciphertext vector of another size, or a public key of its own
making; asking Newton rounds off the path; and, at the linkage, a subset of an accepted
linkage less one patient, a linkage of fewer than k pairs, repeated ids or patients, or
patients the site does not hold. The reply check refuses clear values in the one
patient-sized field.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from phe import EncodedNumber, generate_paillier_keypair
from scipy.special import expit

import fedstats
from fedstats.contract.tasks import vertical as wire
from fedstats.errors import DisclosureError, MalformedRequestError
from fedstats.schema import Array, Ciphertexts
from fedstats.site.ciphertext_replies import PaillierKeys, check_ciphertexts
from fedstats.site.linked_rows import LinkedRows
from tests.vertical.linked_frames import vertical_study

FORMULA = "y ~ age + x"
N = 120


def joined(seed: int = 0, n: int = N) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"age": rng.uniform(30, 90, n), "x": rng.normal(size=n)})
    frame["y"] = (rng.random(n) < expit(-3 + 0.05 * frame["age"] + frame["x"])).astype(int)
    return frame


@pytest.fixture
def study():
    return vertical_study({"clinic": joined()}, ["y"], seed=2)


def model(study):
    return fedstats.VerticalLogisticRegression(
        FORMULA, outcome_site="registry", covariate_sites=["clinic"], linkage_id="L-clinic"
    )


def steps(study):
    """The one-time step asked by hand, each reply kept: (design, encrypted, masked)."""
    fed = study.federation
    m = model(study)
    design = m.agree(fed, "a").to_wire()
    base = {"design": design, "linkage": "L-clinic"}
    ask = lambda site, task, args: fed.request(task, {**base, **args}, analysis="a",  # noqa: E731
                                               sites=[site])[site]  # fmt: skip
    encrypted = ask("registry", wire.ENCRYPT, {"n_pairs": N})
    masked = ask("clinic", wire.MASKED, {"n_pairs": N, "registry": "registry",
                                         "encrypted": encrypted})  # fmt: skip
    return design, base, ask, encrypted, masked


def refused(call, rule: str | None = "vertical") -> Exception:
    with pytest.raises((DisclosureError, MalformedRequestError)) as caught:
        call()
    if rule is not None:
        assert getattr(caught.value, "rule", None) == rule, caught.value
    return caught.value


def test_the_registry_decrypts_once(study):
    _, _, ask, encrypted, masked = steps(study)
    args = {"hospital": "clinic", "masked": masked, "public_key": encrypted["public_key"]}
    ask("registry", wire.DECRYPT, args)
    error = refused(lambda: ask("registry", wire.DECRYPT, args))
    assert "only once" in str(error)
    # nor a new key for the same linkage and design
    refused(lambda: ask("registry", wire.ENCRYPT, {"n_pairs": N}))


def test_more_values_than_design_columns_or_its_own_ciphertexts_are_refused(study):
    """p + 1 values (the schema's one per design column); p of the registry's own
    Enc(y_i), re-randomised by the coordinator, under a signature the hospital never made."""
    _, _, ask, encrypted, masked = steps(study)
    p = masked["masked"].shape[0]
    longer = {"masked": np.vstack([masked["masked"], masked["masked"][:1]]),
              "signature": masked["signature"]}  # fmt: skip
    refused(lambda: ask("registry", wire.DECRYPT, {"hospital": "clinic", "masked": longer,
                        "public_key": encrypted["public_key"]}), rule=None)  # fmt: skip
    own = {"masked": encrypted["ciphertexts"][:p], "signature": masked["signature"]}
    error = refused(lambda: ask("registry", wire.DECRYPT, {"hospital": "clinic", "masked": own,
                                "public_key": encrypted["public_key"]}))  # fmt: skip
    assert "not signed" in str(error)
    # the honest request still decrypts: nothing was spent by the refusals
    ask("registry", wire.DECRYPT, {"hospital": "clinic", "masked": masked,
                                   "public_key": encrypted["public_key"]})  # fmt: skip


def test_a_ciphertext_vector_of_another_size_is_refused(study):
    _, _, ask, encrypted, _ = steps(study)
    shorter = {**encrypted, "ciphertexts": encrypted["ciphertexts"][:-1]}
    refused(lambda: ask("clinic", wire.MASKED, {"n_pairs": N - 1, "registry": "registry",
                                                "encrypted": shorter}))  # fmt: skip
    refused(lambda: ask("clinic", wire.MASKED, {"n_pairs": N, "registry": "registry",
                                                "encrypted": shorter}), rule=None)  # fmt: skip
    fresh = vertical_study({"clinic": joined()}, ["y"], seed=2)
    design = model(fresh).agree(fresh.federation, "a").to_wire()
    wrong = {"design": design, "linkage": "L-clinic", "n_pairs": N + 1}
    refused(lambda: fresh.federation.request(wire.ENCRYPT, wrong, analysis="a",
                                             sites=["registry"]))  # fmt: skip


def test_a_public_key_of_the_coordinators_making_is_refused(study):
    """The coordinator encrypts y-probing values under its own key and relays them with the
    registry's signature, or with none that verifies: the hospital refuses both."""
    _, _, ask, encrypted, _ = steps(study)
    public_key, _ = generate_paillier_keypair(n_length=wire.KEY_BITS)
    forged = {
        "public_key": wire.words_of([public_key.n], wire.MODULUS_WORDS)[0],
        "ciphertexts": wire.words_of(
            [public_key.encrypt(1).ciphertext() for _ in range(N)], wire.CIPHERTEXT_WORDS
        ),
        "signature": encrypted["signature"],
    }
    error = refused(lambda: ask("clinic", wire.MASKED, {"n_pairs": N, "registry": "registry",
                                                        "encrypted": forged}))  # fmt: skip
    assert "not signed by 'registry'" in str(error)
    # naming itself as the registry does not help either
    refused(lambda: ask("clinic", wire.MASKED, {"n_pairs": N, "registry": "clinic",
                                                "encrypted": encrypted}))  # fmt: skip


def test_newton_rounds_off_the_path_are_refused(study):
    fed = study.federation
    m = model(study)
    m.fit(fed)  # the hospital now holds X^T y
    design = m.agree(fed, "a").to_wire()
    beta = np.array([-1e6, 1e4, 1e6])  # a half-space: mu becomes an indicator of rows
    args = {"design": design, "linkages": {"clinic": "L-clinic"}, "beta": beta,
            "path": {"sites": ["clinic"], "round": 1}}  # fmt: skip
    refused(lambda: fed.request(wire.SUMMARIES_TASK, args, analysis="a"), rule="path")
    no_path = {k: v for k, v in args.items() if k != "path"}
    refused(lambda: fed.request(wire.SUMMARIES_TASK, no_path, analysis="a"), rule="path")


# ------------------------------------------------------------------ linkages


def silo(n: int = 40) -> fedstats.Silo:
    frame = pd.DataFrame({"age": np.arange(n, dtype=float)}, index=[f"p{i}" for i in range(n)])
    return fedstats.Silo("clinic", frame)


def linkage(name: str, patients: list[str]) -> LinkedRows:
    return LinkedRows(name, np.arange(len(patients)) * 3 + 1, np.array(patients))


def test_a_linkage_differing_from_an_accepted_one_by_one_patient_is_refused():
    site = silo()
    everyone = [f"p{i}" for i in range(30)]
    site.accept_linkage(linkage("L1", everyone))
    error = refused(lambda: site.accept_linkage(linkage("L2", everyone[:-1])), "differencing")
    assert error.site == "clinic"
    refused(lambda: site.accept_linkage(linkage("L3", [*everyone, "p35"])), "differencing")
    site.accept_linkage(linkage("L1", everyone))  # the same linkage again: nothing changes
    site.accept_linkage(linkage("L4", everyone[:-5]))  # k_cell (3) or more patients apart


def test_a_linkage_of_fewer_than_k_pairs_is_refused():
    refused(lambda: silo().accept_linkage(linkage("L", [f"p{i}" for i in range(9)])), "threshold")


def test_repeated_pairs_or_patients_and_unknown_patients_are_refused():
    site = silo()
    patients = [f"p{i}" for i in range(12)]
    refused(lambda: site.accept_linkage(LinkedRows("L", np.r_[np.arange(11), 3],
                                                   np.array(patients))), rule=None)  # fmt: skip
    refused(lambda: site.accept_linkage(linkage("L", [*patients[:-1], "p0"])), rule=None)
    error = refused(lambda: site.accept_linkage(linkage("L", [*patients, "stranger"])), None)
    assert "not in this site's frame" in str(error)
    site.accept_linkage(linkage("L", patients))
    refused(lambda: site.accept_linkage(linkage("L", patients[::-1])), rule=None)  # same id


# ------------------------------------------------------------------ the reply check


def test_the_patient_sized_field_holds_only_fresh_ciphertexts_of_the_site():
    """The reply check refuses, in the one field whose size is the number of patients: a
    value encrypted with randomness 1 (``1 + m n``, which shows m), a key the site did not
    make, a key already released, and the field in any other task."""
    public_key, private_key = generate_paillier_keypair(n_length=wire.KEY_BITS)
    keys = PaillierKeys()
    keys.add(private_key, "L", "design")
    schema = {"public_key": Array((wire.MODULUS_WORDS,)),
              "ciphertexts": Ciphertexts(3, wire.CIPHERTEXT_WORDS, key="public_key")}  # fmt: skip
    key_words = wire.words_of([public_key.n], wire.MODULUS_WORDS)[0]

    def reply(values: list[int]) -> dict:
        return {"public_key": key_words,
                "ciphertexts": wire.words_of(values, wire.CIPHERTEXT_WORDS)}  # fmt: skip

    clear = [public_key.raw_encrypt(v, r_value=1) for v in (0, 1, 1)]
    assert [(c - 1) // public_key.n for c in clear] == [0, 1, 1]  # why it is refused
    check = lambda payload, task=wire.ENCRYPT, k=keys: check_ciphertexts(  # noqa: E731
        schema, payload, k, site="registry", task=task)  # fmt: skip
    refused(lambda: check(reply(clear)), "shape")
    refused(lambda: check(reply([1, 2, 3])), "shape")
    refused(lambda: check(reply([public_key.encrypt(1).ciphertext()] * 3), task="prepare"),
            "shape")  # fmt: skip
    refused(lambda: check(reply([public_key.encrypt(1).ciphertext()] * 3), k=PaillierKeys()),
            "shape")  # fmt: skip
    fresh = [public_key.encrypt(EncodedNumber(public_key, v, 0)).ciphertext() for v in (0, 1, 1)]
    check(reply(fresh))
    refused(lambda: check(reply(fresh)), "shape")  # released once: never again


def test_a_design_column_or_an_outcome_of_fewer_than_k_linked_patients_is_refused():
    """The coordinator crafts the design: a column that marks two linked patients (a cell of
    two at the hospital), or an outcome with two events among the linked pairs (at the
    registry). Each site's cell rules refuse it before the registry encrypts anything."""
    frame = joined()
    frame["rare"] = 0
    frame.loc[frame.index[:2], "rare"] = 1
    study = vertical_study({"clinic": frame}, ["y"], seed=2)
    rare = fedstats.VerticalLogisticRegression(
        "y ~ age + rare", outcome_site="registry", covariate_sites=["clinic"],
        linkage_id="L-clinic",
    )  # fmt: skip
    with pytest.raises(DisclosureError) as caught:
        rare.fit(study.federation)
    assert caught.value.rule in {"cells", "cross-cells"} and caught.value.site == "clinic"
    few_events = joined()
    few_events["y"] = 0
    few_events.loc[few_events.index[:2], "y"] = 1
    study = vertical_study({"clinic": few_events}, ["y"], seed=2)
    with pytest.raises(DisclosureError) as caught:
        model(study).fit(study.federation)
    assert caught.value.site == "registry"
    tasks = [r.task for r in study.federation.inventory.records() if r.status == "ok"]
    assert wire.ENCRYPT not in tasks
