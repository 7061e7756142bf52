"""Sybils and substituted keys: a site pins the secure-aggregation roster, or pays for its noise.

The attack: a site took the session's sites and public keys from the
coordinator. Inventing ``t - 1`` sites (or relaying keys it made for real
sites), the coordinator held ``t`` shares of a site's mask seed, unmasked its
reply alone and saw ``1/sqrt(t)`` of the noise the ledger was charged for.

Here the coordinator runs that attack with the site's own protocol code for
its invented sites. A site with a pinned roster refuses the session; a site
without one answers, and its ledger is charged for the noise the coordinator
then sees (checked by measuring that noise over repeated attacks, against
``dp_accounting``).
"""

from __future__ import annotations

import dp_accounting
import numpy as np
import pandas as pd
import pytest
from cryptography.hazmat.primitives.asymmetric import ed25519

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.contract import secure_aggregation as secagg_wire
from fedstats.contract.secagg_session import Adverts, SessionPlan, signature_hex
from fedstats.datasets import heart_disease
from fedstats.models.agree import agree_design
from fedstats.models.secure_aggregation import SecureAggregation
from fedstats.secagg import crypto
from fedstats.secagg import ring as secagg_ring
from fedstats.secagg import roster as secagg_roster
from fedstats.secagg import shamir as secagg_shamir
from fedstats.site import secure_aggregation as secagg_site
from fedstats.site.silo import Silo
from fedstats.site.task import SiteContext
from tests.security import secagg_sessions as sessions

TASK = "logistic.summaries"
SIGMA, ROW_NORM, BITS = 3.0, 2.0, 32
STUDY = "heart"


@pytest.fixture(scope="module")
def cleveland() -> pd.DataFrame:
    return heart_disease().frames["cleveland"]


@pytest.fixture(scope="module")
def private_args(cleveland) -> dict:
    """A record-level private gradient request for ``disease ~ age + chol`` at beta = 0."""
    spec = agree_design(
        fedstats.Federation.in_process({"cleveland": cleveland}),
        "disease ~ age + chol",
        analysis="a",
    ).spec
    return {
        "design": spec.to_wire(),
        "beta": np.zeros(spec.n_params),
        "clip": {"row_norm": ROW_NORM, "scaling": np.tile([0.0, 100.0], (spec.n_params, 1))},
        "release": "gradient",
        "dp": {
            "noise_multipliers": {"gradient": SIGMA},
            "study": STUDY,
            "analysis": "a",
            "note": "",
        },
    }


def ledger(tmp_path, name="cleveland") -> accounting.Ledger:
    book = accounting.Ledger(tmp_path / f"{name}-{len(list(tmp_path.iterdir()))}.sqlite")
    book.set_budget(accounting.Scope("patient", name, STUDY), 1e6, 1e-5)
    return book


def raw(silo: Silo, task: str, args: dict) -> dict:
    return codec.decode(silo.handle(codec.encode({"task": task, "args": args})))


ATTACKS = {"secagg": (4, secagg_wire.majority), "secagg+": (11, lambda n: n)}
"""Per construction, how many sites the coordinator invents and the threshold it asks: the
complete graph of 5 sites at a majority, and SecAgg+ over 12 sites at ``t = n`` (a ring of
degree 4: the target's four neighbours are all invented)."""


def sybil_attack(
    target: Silo, args: dict, session: str, construction: str = "secagg", forge=None
) -> dict:
    """The coordinator's attack: a session of the target and sites it invents and runs
    itself, then the target's reply unmasked alone. Returns the target's replies at each
    step (an error stops the attack) and, when it succeeded, the recovered reply."""
    fakes, threshold_of = ATTACKS[construction]
    names = [target.name, *(f"sybil-{i}" for i in range(fakes))]
    plan = SessionPlan(session, tuple(names), construction, threshold_of(len(names)), BITS)
    mine = {s: SiteContext(s, pd.DataFrame(), fedstats.DisclosurePolicy()) for s in names[1:]}
    if forge is not None:  # the invented sites sign with keys the coordinator holds
        for s, ctx in mine.items():
            ctx.secure_aggregation = forge[s]
    advert = raw(target, secagg_wire.ADVERTISE_TASK, plan.to_args())
    if advert["status"] != "ok":
        return {"refused": advert}
    keys = {target.name: bytes(advert["result"]["keys"])}
    signatures = {target.name: signature_hex(bytes(advert["result"]["signature"]))}
    for s, ctx in mine.items():
        reply = secagg_site.advertise(ctx, plan.to_args()).payload
        keys[s], signatures[s] = bytes(reply["keys"]), signature_hex(bytes(reply["signature"]))
    drawn = plan.graph(keys[plan.contributor])

    def share_args(site):
        def only(sites):
            return Adverts({v: keys[v] for v in sites}, {v: signatures[v] for v in sites})

        return {
            "session": session,
            "contributor": only([plan.contributor]).to_wire(),
            "neighbours": only(drawn.neighbours(site)).to_wire(),
        }

    shared = raw(target, secagg_wire.SHARE_TASK, share_args(target.name))
    if shared["status"] != "ok":
        return {"refused": shared}
    sealed = {target.name: [bytes(r) for r in shared["result"]["sealed"]]}
    for s, ctx in mine.items():
        sealed[s] = [bytes(r) for r in secagg_site.share(ctx, share_args(s)).payload["sealed"]]

    def block(site):
        rows = [sealed[v][drawn.neighbours(v).index(site)] for v in drawn.neighbours(site)]
        return secagg_wire.MaskBlock(session, rows)

    masked = raw(target, TASK, {**args, "secagg": block(target.name).to_wire()})
    if masked["status"] != "ok":
        return {"refused": masked}
    holders = drawn.neighbours(target.name)  # all invented
    states = {v: secagg_site.open_shares(mine[v], block(v), TASK) for v in holders}
    seed = secagg_shamir.combine(
        {plan.point(v): state.shares[target.name][1] for v, state in states.items()},
        plan.shape.share_threshold,
    )
    total = np.asarray(masked["result"]["masked"], dtype=np.uint64)
    total = total - crypto.mask(seed, len(total))
    for state in states.values():  # the target (point 1) added +PRG(s_uv) for each neighbour
        total = total - crypto.mask(state.pair_seeds[target.name], len(total))
    return {"recovered": secagg_ring.decode(total, BITS), "threshold": plan.threshold}


@pytest.mark.parametrize("construction", ATTACKS)
def test_a_site_with_a_pinned_roster_refuses_invented_sites(
    cleveland, private_args, tmp_path, construction
):
    pins = secagg_roster.in_process_pins(["cleveland", "hungary", "va"])
    book = ledger(tmp_path)
    target = Silo("cleveland", cleveland, ledger=book, secure_aggregation=pins["cleveland"])
    outcome = sybil_attack(target, private_args, "1" * 32, construction)
    error = outcome["refused"]["error"]
    assert error["type"] == "DisclosureError" and error["values"]["rule"] == "roster"
    assert error["values"]["site"] == "cleveland" and error["values"]["task"] == "secagg.advertise"
    assert "sybil-0" in error["values"]["reason"]
    assert book.entries(accounting.Scope("patient", "cleveland", STUDY)) == []


@pytest.mark.parametrize("construction", ATTACKS)
def test_a_site_refuses_keys_not_signed_by_the_keys_it_pinned(
    cleveland, private_args, tmp_path, construction
):
    """The coordinator names only real sites but relays keys it made for them, unsigned or
    signed with keys of its own: the share round is refused, nothing is charged."""
    fakes = ATTACKS[construction][0]
    names = ["cleveland", *(f"sybil-{i}" for i in range(fakes))]
    pins = secagg_roster.in_process_pins(names)  # the roster lists these names...
    forged = secagg_roster.in_process_pins(names)  # ...the coordinator signs with other keys
    book = ledger(tmp_path)
    target = Silo("cleveland", cleveland, ledger=book, secure_aggregation=pins["cleveland"])
    outcome = sybil_attack(target, private_args, "2" * 32, construction, forge=forged)
    error = outcome["refused"]["error"]
    assert error["type"] == "DisclosureError" and error["values"]["rule"] == "roster"
    assert error["values"]["task"] == "secagg.share"
    assert "not signed" in error["values"]["reason"]
    unsigned = sybil_attack(target, private_args, "3" * 32, construction)  # no signatures
    assert unsigned["refused"]["error"]["values"]["rule"] == "roster"
    assert book.entries(accounting.Scope("patient", "cleveland", STUDY)) == []


@pytest.mark.parametrize(
    "changed", [{"threshold": 2}, {"construction": "secagg"}, {"fraction_bits": 16}]
)
def test_a_pinned_site_refuses_a_session_whose_plan_was_changed_for_it(changed):
    """Signatures cover the session's sites, construction, threshold and precision: telling
    one site another threshold than the others (to unmask it with fewer shares), or another
    construction (another graph), is seen by every site."""
    names = ["a", "b", "c"]
    drawn = sessions.session(names, threshold=3, construction="secagg+")
    for s in names:
        args = drawn.plan.to_args() | (changed if s == "a" else {})
        secagg_site.advertise(drawn.contexts[s], args)
    keys, signatures = {}, {}
    for s in names:
        state = secagg_site.sessions(drawn.contexts[s])[drawn.plan.session]
        keys[s] = state.own_keys
        signatures[s] = drawn.contexts[s].secure_aggregation.sign_advert(
            state.plan.advert(s, keys[s])
        )
    drawn.adverts = Adverts(keys, signatures)
    drawn.graph = drawn.plan.graph(keys["a"])
    for s in names:
        with pytest.raises(fedstats.errors.DisclosureError, match="not signed") as refused:
            secagg_site.share(drawn.contexts[s], drawn.share_args(s))
        assert refused.value.rule == "roster"


@pytest.mark.parametrize("construction", ATTACKS)
def test_an_unpinned_site_is_charged_for_the_noise_the_coordinator_can_see(
    cleveland, private_args, tmp_path, construction
):
    """The attack succeeds against a site without a pinned roster: the coordinator reads its
    reply alone. Over repeated attacks the noise it sees has sd sigma / sqrt(t) times the
    sensitivity, and the ledger charged each release at least the epsilon of that noise
    (dp_accounting); charging sigma, the noise of the sum, would have charged less."""
    book = ledger(tmp_path)
    target = Silo("cleveland", cleveland, ledger=book)
    draws = []
    for i in range(80):
        outcome = sybil_attack(target, private_args, f"{i:032d}", construction)
        draws.append(outcome["recovered"])
    threshold = outcome["threshold"]
    seen = np.std(np.array(draws), axis=0, ddof=1)  # the data part is the same every time
    d = len(seen)
    sensitivity = ROW_NORM + np.sqrt(d) * secagg_ring.resolution(BITS) / 2
    multiplier_seen = float(np.sqrt(np.mean(seen**2))) / sensitivity
    assert multiplier_seen == pytest.approx(SIGMA / np.sqrt(threshold), rel=0.15)
    entry = book.entries(accounting.Scope("patient", "cleveland", STUDY))[-1]
    assert entry.parameters["secure_aggregation_roster"] == "unpinned"
    true_epsilon = (
        dp_accounting.rdp.RdpAccountant()
        .compose(dp_accounting.GaussianDpEvent(multiplier_seen * 1.15))  # generous to the site
        .get_epsilon(entry.delta)
    )
    assert entry.epsilon >= true_epsilon
    central = (
        dp_accounting.rdp.RdpAccountant()
        .compose(dp_accounting.GaussianDpEvent(SIGMA))
        .get_epsilon(entry.delta)
    )
    assert central < true_epsilon  # the old charge was below the truth


@pytest.mark.parametrize("construction", ATTACKS)
def test_in_process_federations_pin_their_sites_and_charge_the_noise_of_the_sum(
    tmp_path, construction
):
    heart = heart_disease().only(("cleveland", "hungary", "va"))
    books = {s: ledger(tmp_path, s) for s in heart.frames}
    fed = fedstats.Federation.in_process(heart.frames, ledgers=books, study=STUDY)
    privacy = fedstats.RecordDP(epsilon=2.0, delta=1e-5, bounds={"chol": (0.0, 610.0)})
    fedstats.LogisticRegression("disease ~ chol").fit(
        fed, privacy=privacy, secure_aggregation=SecureAggregation(construction=construction)
    )
    for s, book in books.items():
        entries = book.entries(accounting.Scope("patient", s, STUDY))
        secure = [e for e in entries if "secure_aggregation_threshold" in e.parameters]
        assert secure and {e.parameters["secure_aggregation_roster"] for e in secure} == {"pinned"}


def test_a_roster_file_and_signing_key_are_read_and_checked(tmp_path):
    from cryptography.hazmat.primitives import serialization

    keys = {s: ed25519.Ed25519PrivateKey.generate() for s in ("north", "south")}
    public = {
        s: k.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
        for s, k in keys.items()
    }
    roster = secagg_roster.write_roster(tmp_path / "roster.toml", "demo", public)
    key_file = tmp_path / "north.key"
    key_file.write_bytes(
        keys["north"].private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )

    class Section:
        require = True

    section = Section()
    section.roster, section.signing_key = roster, key_file
    pin = secagg_roster.load_roster_pin(section, site="north")
    assert set(pin.sites) == {"north", "south"} and pin.require
    with pytest.raises(fedstats.errors.StudyConfigurationError, match="does not match"):
        secagg_roster.load_roster_pin(section, site="south")
    with pytest.raises(fedstats.errors.StudyConfigurationError, match="not in it"):
        secagg_roster.load_roster_pin(section, site="east")


def test_a_site_that_requires_secure_aggregation_refuses_a_plain_request(cleveland, private_args):
    pins = secagg_roster.in_process_pins(["cleveland", "hungary"])
    pin = secagg_roster.RosterPin(
        site="cleveland",
        sites=pins["cleveland"].sites,
        signing_key=pins["cleveland"].signing_key,
        require=True,
    )
    silo = Silo("cleveland", cleveland, secure_aggregation=pin)
    reply = raw(
        silo, TASK, {k: v for k, v in private_args.items() if k not in ("dp", "clip", "release")}
    )
    assert reply["error"]["values"]["rule"] == "secure-aggregation"


def test_the_supernode_keys_of_the_study_pki_sign_the_roster(tmp_path):
    """``study_pki roster`` writes the roster from the sites' node.pub; each site signs its
    advertisements with its node.key (ECDSA P-256) and the others verify them."""
    from fedstats.flower import study_pki

    nodes = {s: study_pki.make_node_key(tmp_path / s, s) for s in ("region_0", "region_1")}
    roster = tmp_path / "roster.toml"
    args = [f"--node={s}={n.public_key}" for s, n in nodes.items()]
    study_pki.main(["roster", "--out", str(roster), "--study", "tcga", *args])

    class Section:
        require = False

    pins = {}
    for s, node in nodes.items():
        section = Section()
        section.roster, section.signing_key = roster, node.private_key
        pins[s] = secagg_roster.load_roster_pin(section, site=s)
    message = secagg_roster.advert_message(
        "5" * 32, "region_0", ["region_0", "region_1"], 2, 32, "a", "b", construction="secagg+"
    )
    signature = pins["region_0"].sign_advert(message)
    assert pins["region_1"].verify_advert("region_0", message, signature)
    assert not pins["region_1"].verify_advert("region_1", message, signature)
    assert not pins["region_1"].verify_advert("region_0", message.replace(b"32", b"16"), signature)


@pytest.mark.parametrize("construction", ATTACKS)
def test_sybil_sites_through_the_public_api_are_refused_by_the_pinned_site(cleveland, construction):
    """The coordinator builds a federation of one real, pinned site and sites it runs itself
    (copies of other hospitals' data), and fits through secure aggregation: the real site
    refuses the session (rule roster) and releases no masked reply."""
    heart = heart_disease()
    pins = secagg_roster.in_process_pins(["cleveland", "hungary", "va"])
    real = Silo("cleveland", cleveland, secure_aggregation=pins["cleveland"])
    sybils = {
        f"sybil-{i}": Silo(f"sybil-{i}", heart.frames[s]) for i, s in enumerate(["hungary", "va"])
    }
    fed = fedstats.Federation(
        {"cleveland": real.handle, **{s: v.handle for s, v in sybils.items()}}
    )
    with pytest.raises(fedstats.errors.FedstatsError):
        fedstats.LogisticRegression("disease ~ age + chol").fit(
            fed, secure_aggregation=SecureAggregation(construction=construction)
        )
    refusals = [e for e in real.log if e.status == "refused"]
    assert [(e.task, e.reason) for e in refusals] == [("secagg.advertise", "roster")]
    assert not [e for e in real.log if e.task == TASK]
