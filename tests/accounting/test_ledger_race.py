"""Eight processes charging one scope at once never overspend it.

Eight long-lived worker processes (spawn context, each imports accounting
once) are given a fresh ledger per repetition, start together at a barrier and
charge the same scope until ``BudgetExceeded``. The budget is set between the
epsilon of 45 and of 46 charges, so exactly 45 charges must succeed in total:
more would be an overspend, fewer a charge lost or refused wrongly.
"""

from __future__ import annotations

import multiprocessing
import sys
from pathlib import Path

import dp_accounting
import pytest
from dp_accounting.rdp import RdpAccountant

import accounting

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ledger_workers  # the spawned workers import it by name

WORKERS = 8
REPETITIONS = 20
CHARGES = 45
SIGMA = 10.0
DELTA = 1e-6


def rdp(events) -> float:
    accountant = RdpAccountant()
    for event in events:
        accountant.compose(event)
    return accountant.get_epsilon(DELTA)


@pytest.fixture(scope="module")
def workers():
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS)
    tasks = [context.Queue() for _ in range(WORKERS)]
    results = context.Queue()
    processes = [
        context.Process(
            target=ledger_workers.charge_until_exhausted,
            args=(queue, results, barrier),
            daemon=True,
        )
        for queue in tasks
    ]
    for process in processes:
        process.start()
    yield tasks, results
    for queue in tasks:
        queue.put(None)
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.terminate()
            process.join()


def test_concurrent_charges_never_exceed_the_budget(workers, tmp_path):
    tasks, results = workers
    event = dp_accounting.GaussianDpEvent(SIGMA)
    budget = (rdp([event] * CHARGES) + rdp([event] * (CHARGES + 1))) / 2
    busy_workers = []
    for repetition in range(REPETITIONS):
        path = tmp_path / f"race-{repetition}.ledger"
        scope = accounting.Scope(unit="patient", owner="site_a", study=f"race-{repetition}")
        with accounting.Ledger(path) as ledger:
            ledger.set_budget(scope, epsilon=budget, delta=DELTA)
        for queue in tasks:
            queue.put((str(path), scope.owner, scope.study, SIGMA))
        reports = [results.get(timeout=120) for _ in range(WORKERS)]
        errors = [report for report in reports if report[0] != "ok"]
        assert not errors, errors
        reported = [entry_id for _, _, ids in reports for entry_id in ids]
        busy_workers.append(sum(1 for _, _, ids in reports if ids))

        with accounting.Ledger(path) as ledger:
            entries = ledger.entries(scope)
            spent = ledger.spent(scope)
            report = ledger.verify()
        assert report.ok, report.problems
        assert len(entries) == len(reported) == CHARGES
        assert sorted(e.id for e in entries) == sorted(reported)
        assert [e.seq for e in entries] == list(range(1, CHARGES + 1))
        recomposed = rdp([e.event for e in entries])
        assert recomposed <= budget
        assert spent.epsilon == pytest.approx(recomposed, rel=1e-9)
    # the workers did race: in most repetitions several of them got charges through
    assert max(busy_workers) > 1, busy_workers
