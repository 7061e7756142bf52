"""Verified paths for record-level private training (DP-SGD at every site): a coordinator cannot
steer the network a private training ends at, so held-out sites can score it exactly.

A private round's update is a charged DP release whatever network it starts from, so a round
off any path would still be private; but the network it ends at is then the coordinator's to
choose (a crafted start moves only by clipped, noised steps), and scoring that network
exactly at held-out sites is an exact release at coordinator-chosen weights. A private round
that carries a path is therefore verified like an exact one: each site checks the network is
the FedAvg step from every site's signed, noised update of the round before, weighted by the
patient counts the sites released (noised, charged) when the design was agreed
(:mod:`fedstats.site.released_counts`), before anything is charged or read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_verified_training import FRAMES, frame, trainer

import accounting
import fedstats
from fedstats.contract import codec
from fedstats.deep.training.server_optimizers import ServerOptimizer

STUDY = "private-paths"
PRIVACY = fedstats.RecordDP(epsilon=2.0, delta=1e-3)


def ledgers(folder: Path) -> dict[str, accounting.Ledger]:
    out = {}
    for site in FRAMES:
        out[site] = accounting.Ledger(folder / f"{site}.db")
        scope = accounting.Scope(unit="patient", owner=site, study=STUDY)
        out[site].set_budget(scope, epsilon=10.0, delta=1e-3)
    return out


def recording(frames, **options) -> tuple[fedstats.Federation, list[tuple[str, bytes, bytes]]]:
    """A federation of verifying sites whose requests and replies are recorded."""
    inner = fedstats.Federation.in_process(frames, **options)
    sent: list[tuple[str, bytes, bytes]] = []

    def transport(site: str):
        def send(request: bytes) -> bytes:
            reply = inner.silos[site].handle(request)
            sent.append((site, request, reply))
            return reply

        return send

    fed = fedstats.Federation({s: transport(s) for s in frames}, study=options.get("study"))
    fed.silos = inner.silos
    fed.path_sites = inner.path_sites
    return fed, sent


def charges(ledger: accounting.Ledger, site: str) -> int:
    return len(ledger.entries(accounting.Scope(unit="patient", owner=site, study=STUDY)))


def test_a_private_training_is_verified_round_by_round_and_scored_at_held_out_sites(tmp_path):
    """Every DP-SGD round is answered on a verified path; each reply states as its FedAvg
    weight the noisy count its site released at the agreement; held-out sites pinned with the
    training sites' keys score the final network (the one the signed last round leads to)."""
    fed, sent = recording(FRAMES, study=STUDY, ledgers=ledgers(tmp_path))
    held_out = fedstats.Federation.in_process(
        {site: frame(60, 90 + i) for i, site in enumerate(FRAMES)}, study=STUDY, keys_of=fed
    )
    result = trainer(rounds=3).fit(fed, privacy=PRIVACY, evaluation=held_out)
    rounds = [r for r in fed.inventory.records() if r.task == "deep.train"]
    assert len(rounds) == 3 * len(FRAMES) and all(r.path == "verified" for r in rounds)
    assert result.evaluation is not None and result.evaluation.table.loc["pooled", "n"] == 180
    scored = [r for r in held_out.inventory.records() if r.task == "deep.evaluate"]
    assert scored and all(r.status == "ok" for r in scored)
    weights: dict[str, set[float]] = {site: set() for site in FRAMES}
    counts: dict[str, float] = {}
    for site, request, reply in sent:
        task, result = codec.decode(request)["task"], codec.decode(reply)["result"]
        if task == "prepare":
            counts[site] = max(0.0, result["n_obs"])  # noisy: a private agreement
        elif task == "deep.train":
            weights[site].add(result["n_obs"])
    assert all(counts[site] != round(counts[site]) for site in FRAMES)  # noised counts
    assert weights == {site: {counts[site]} for site in FRAMES}


def test_a_crafted_network_in_a_private_round_is_refused_before_it_is_charged(
    tmp_path, monkeypatch
):
    """A coordinator whose server step scales the network after round 1 of a private training:
    every site refuses round 2 (rule ``path``) and charges nothing for it."""
    honest_step = ServerOptimizer.step

    def crafted(self, weights, update):
        return (honest_step(self, weights, update) * 1000).astype(np.float32)

    books = ledgers(tmp_path)
    fed = fedstats.Federation.in_process(FRAMES, study=STUDY, ledgers=books)
    monkeypatch.setattr(ServerOptimizer, "step", crafted)
    with pytest.raises(fedstats.DisclosureError) as refused:
        trainer(rounds=2).fit(fed, privacy=PRIVACY, evaluation=False)
    assert refused.value.rule == "path"
    rounds = [r for r in fed.inventory.records() if r.task == "deep.train"]
    assert [r.status for r in rounds].count("ok") == len(FRAMES)  # round 1 only
    for site in FRAMES:  # the agreement's counts and round 1: two charges, none for round 2
        assert charges(books[site], site) == 2, site


def test_a_private_round_is_weighed_only_by_the_count_its_site_released(tmp_path):
    """Replayed raw: round 2 with a relayed weight (``n_obs``) changed, or at a site that
    released no count for the analysis (its memory cleared, or the request's DP block naming
    another analysis): refused, rule ``path``, and nothing charged; as sent, answered."""
    books = ledgers(tmp_path)
    fed, sent = recording(FRAMES, study=STUDY, ledgers=books)
    trainer(rounds=2).fit(fed, privacy=PRIVACY, evaluation=False)
    second = [codec.decode(r) for s, r, _ in sent
              if s == "a" and codec.decode(r)["task"] == "deep.train"][1]  # fmt: skip
    silo = fed.silos["a"]
    before = charges(books["a"], "a")

    def answer(message: dict) -> dict:
        return codec.decode(silo.handle(codec.encode(message)))

    def refused(message: dict) -> None:
        reply = answer(message)
        assert reply["status"] == "error", reply
        assert reply["error"]["values"]["rule"] == "path", reply
        assert charges(books["a"], "a") == before

    path = second["args"]["path"]
    replies = path["previous"]["replies"]
    lighter = {**replies["b"], "reply": {**replies["b"]["reply"], "n_obs": 1.0}}
    relayed = {**path, "previous": {**path["previous"], "replies": {**replies, "b": lighter}}}
    refused({**second, "args": {**second["args"], "path": relayed}})
    other = {**second["args"]["dp"], "analysis": second["args"]["dp"]["analysis"] + "-other"}
    refused({**second, "args": {**second["args"], "dp": other}})
    memory = dict(silo._context.cache)
    silo._context.cache.pop("released_counts")
    refused(second)
    silo._context.cache.update(memory)
    assert answer(second)["status"] == "ok"
    assert charges(books["a"], "a") == before + 1


def test_a_site_re_derives_its_private_rounds_from_its_own_records(tmp_path):
    """``fedstats site verify`` replays a private training's archived rounds with the pinned
    roster alone: every DP-SGD round verifies again (its relayed, signed noisy updates and
    their weights), and the scoring of the network with the last round relayed too."""
    from test_verified_paths import served_sites

    from fedstats.jobs.path_audit import audit_site
    from fedstats.jobs.site_config import load_site_config
    from fedstats.jobs.site_service import SiteService

    configs = served_sites(FRAMES, tmp_path)
    for site, path in configs.items():
        with accounting.Ledger(path.parent / "site.ledger") as ledger:
            ledger.set_budget(accounting.Scope(unit="patient", owner=site, study="audit-study"),
                              epsilon=10.0, delta=1e-3)  # fmt: skip
    services = {site: SiteService.from_file(path) for site, path in configs.items()}
    try:
        fed = fedstats.Federation({s: service.answer for s, service in services.items()},
                                  study="audit-study")  # fmt: skip
        result = trainer(rounds=3).fit(fed, privacy=PRIVACY)
    finally:
        for service in services.values():
            service.close()
    assert result.evaluation is not None
    for path in configs.values():
        audit = audit_site(load_site_config(path))
        assert audit.ok, audit.problems
        (training,) = audit.fits
        assert training.task == "deep.train" and training.answers == training.rounds == 3
        assert audit.evaluations == 1  # the final network, scored with the last round relayed
