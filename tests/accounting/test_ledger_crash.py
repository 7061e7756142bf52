"""A process killed at any moment never leaves a release without its charge.

A child process (``ledger_workers.py`` run as a script) does 50
charge-then-release cycles on one ledger: ``Ledger.charge``, then the
"release", appending the returned entry id to a release file and fsyncing it.
The parent kills it with SIGKILL at a random point: a few during start-up (a
random delay after the process starts), most while it is cycling (after a
random number of releases, plus a random delay of up to a few milliseconds,
about one or two cycles, so the kill lands anywhere inside a charge or a
release). After each kill the ledger opens, ``verify()`` is ok, every
released id is an entry, and at most one charge (the one in flight) has no
release. A last run completes all cycles.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import accounting

CHILD = Path(__file__).resolve().parent / "ledger_workers.py"
SCOPE = accounting.Scope(unit="patient", owner="site_a", study="crash")
CYCLES = 50
STARTUP_DELAYS = [0.0, 0.05, 0.25]  # seconds after the child starts: killed while importing
CYCLING_TRIALS = 10  # killed at a random point while cycling


def start(ledger: Path, releases: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(ledger), str(releases), str(CYCLES)],
        stdout=subprocess.PIPE,
        text=True,
    )


def released_ids(releases: Path) -> list[int]:
    if not releases.exists():
        return []
    lines = releases.read_text(encoding="ascii").split("\n")
    return [int(line) for line in lines[:-1]]  # the last piece is "" or a torn line


def check(ledger: Path, releases: Path) -> tuple[int, int]:
    """Verify the ledger and the releases; returns (entries, releases)."""
    with accounting.Ledger(ledger) as opened:
        report = opened.verify()
        ids = {entry.id for entry in opened.entries(SCOPE)}
    assert report.ok, report.problems
    released = released_ids(releases)
    assert len(released) == len(set(released))
    assert set(released) <= ids, "a release without its charge"
    return len(ids), len(released)


def test_sigkill_never_leaves_a_release_without_its_charge(tmp_path):
    ledger, releases = tmp_path / "site_a.ledger", tmp_path / "releases.txt"
    with accounting.Ledger(ledger) as opened:
        opened.set_budget(SCOPE, epsilon=100.0, delta=1e-5)

    rng = random.Random(20261122)
    plan = [("start-up", 0, delay) for delay in STARTUP_DELAYS] + [
        ("cycling", rng.randrange(CYCLES - 10), rng.uniform(0.0, 0.002))
        for _ in range(CYCLING_TRIALS)
    ]
    cut_mid_run = 0
    for phase, waited_releases, delay in plan:
        before = check(ledger, releases)
        child = start(ledger, releases)
        cycling = phase == "cycling"
        if cycling:
            assert child.stdout.readline() == "ready\n"
            for _ in range(waited_releases):
                assert child.stdout.readline().startswith("released ")
        time.sleep(delay)
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
        child.stdout.close()
        entries, released = check(ledger, releases)
        charged, shipped = entries - before[0], released - before[1]
        assert 0 <= charged - shipped <= 1, (phase, waited_releases, delay, charged, shipped)
        assert shipped >= waited_releases
        cut_mid_run += cycling and charged < CYCLES
        if child.returncode != -signal.SIGKILL:
            assert child.returncode == 0 and charged == CYCLES  # finished before the kill

    assert cut_mid_run >= CYCLING_TRIALS // 2, "the kills should land while the child cycles"

    # the ledger still works after all those kills
    before = check(ledger, releases)
    child = start(ledger, releases)
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 0
    lines = out.splitlines()
    assert lines[0] == "ready" and lines[-1] == "done" and len(lines) == CYCLES + 2
    assert check(ledger, releases) == (before[0] + CYCLES, before[1] + CYCLES)


def test_release_file_parsing_ignores_a_torn_last_line(tmp_path):
    releases = tmp_path / "releases.txt"
    releases.write_text("1\n2\n3", encoding="ascii")
    assert released_ids(releases) == [1, 2]
