"""Child-process code for the ledger's concurrency and crash tests (not collected by pytest).

* :func:`charge_until_exhausted` runs in long-lived ``multiprocessing`` workers
  (spawn context): for each task it opens the ledger, waits at a barrier with
  the other workers, then charges one scope until ``BudgetExceeded``.
* Run as a script, it is the crash test's child: ``python ledger_workers.py
  LEDGER RELEASES CYCLES`` charges and then "releases" (appends the entry id to
  the release file and fsyncs it) ``CYCLES`` times, printing ``ready`` first,
  ``released ID`` after each release and ``done`` at the end.
"""

from __future__ import annotations

import os
import sys

import dp_accounting

import accounting


def charge_until_exhausted(tasks, results, barrier) -> None:
    """Worker loop: ``tasks`` gives (path, owner, study, sigma) tuples, None to stop."""
    while True:
        task = tasks.get()
        if task is None:
            return
        path, owner, study, sigma = task
        scope = accounting.Scope(unit="patient", owner=owner, study=study)
        event = dp_accounting.GaussianDpEvent(sigma)
        ids: list[int] = []
        try:
            with accounting.Ledger(path) as ledger:
                barrier.wait(timeout=60)
                while True:
                    try:
                        ids.append(ledger.charge(scope, event, task="race").id)
                    except accounting.BudgetExceeded:
                        break
        except Exception as error:  # noqa: BLE001  (any failure goes to the parent, which fails)
            results.put(("error", os.getpid(), repr(error)))
        else:
            results.put(("ok", os.getpid(), ids))


def charge_then_release(ledger_path: str, release_path: str, cycles: int) -> None:
    """The crash test's child: charge, then release, ``cycles`` times."""
    scope = accounting.Scope(unit="patient", owner="site_a", study="crash")
    event = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
    with accounting.Ledger(ledger_path) as ledger:
        ledger.preview(scope, event)  # warm the event's RDP curve
        print("ready", flush=True)
        with open(release_path, "a", encoding="ascii") as releases:
            for cycle in range(cycles):
                entry = ledger.charge(scope, event, note=f"cycle {cycle}")
                # the release: only after charge() has returned, i.e. committed
                releases.write(f"{entry.id}\n")
                releases.flush()
                os.fsync(releases.fileno())
                print(f"released {entry.id}", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    charge_then_release(sys.argv[1], sys.argv[2], int(sys.argv[3]))
