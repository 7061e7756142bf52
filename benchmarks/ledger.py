"""Privacy ledger: charges per second on a scope that already holds 10,000 entries.

A ledger in a temporary directory gets one scope filled with 10,000 charges
through the ordinary ``Ledger.charge`` path (with ``durability="normal"`` to
fill quickly: the same code, only SQLite's ``synchronous`` setting differs).
The file is copied, and on each copy ``Ledger.charge`` is timed for at least
2 s and 2,000 charges of ``PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1))``
(one DP-SGD step): once with the default durability, once with the other.
Prints one JSON line.

    .venv/bin/python benchmarks/ledger.py [--entries 10000] [--seconds 2] [--charges 2000]

Target: ``charges_per_second`` >= 1,000 with the default durability.
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import dp_accounting  # noqa: E402

import accounting  # noqa: E402

TARGET = 1000
EVENT = dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1))
SCOPE = accounting.Scope(unit="patient", owner="benchmark_site", study="benchmark")


def fill(path: Path, entries: int) -> None:
    with accounting.Ledger(path, durability="normal") as ledger:
        ledger.set_budget(SCOPE, epsilon=1_000.0, delta=1e-6)
        for i in range(entries):
            ledger.charge(SCOPE, EVENT, note=f"fill {i}", task="benchmark.fill")


def charges_per_second(path: Path, durability: str, seconds: float, charges: int) -> float:
    with accounting.Ledger(path, durability=durability) as ledger:
        ledger.charge(SCOPE, EVENT, task="benchmark.warm-up")  # event curve cached, file warm
        done = 0
        start = time.perf_counter()
        while done < charges or time.perf_counter() - start < seconds:
            ledger.charge(
                SCOPE,
                EVENT,
                note=f"step {done}",
                analysis="benchmark",
                task="benchmark.dp_sgd_step",
                parameters={"noise_multiplier": 1.1, "sample_rate": 0.01},
            )
            done += 1
        elapsed = time.perf_counter() - start
        if not ledger.verify().ok:
            raise SystemExit(f"ledger {path} does not verify after the benchmark")
    return done / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--charges", type=int, default=2_000)
    args = parser.parse_args()

    default = accounting.DEFAULT_DURABILITY
    other = "normal" if default == "full" else "full"
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.ledger"
        fill(base, args.entries)  # closing checkpoints the log into the file
        rates = {}
        for durability in (default, other):
            copy = Path(tmp) / f"{durability}.ledger"
            shutil.copyfile(base, copy)
            rates[durability] = charges_per_second(copy, durability, args.seconds, args.charges)
    print(
        json.dumps(
            {
                "benchmark": "ledger",
                "entries_before": args.entries,
                "charges_per_second": round(rates[default], 1),
                "durability": default,
                "charges_per_second_other_durability": round(rates[other], 1),
                "other_durability": other,
                "target": TARGET,
                "met": rates[default] >= TARGET,
            }
        )
    )


if __name__ == "__main__":
    main()
