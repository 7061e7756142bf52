"""Does every private interval of the demonstration study cover the exact estimate, or warn?

Runs the demonstration study (:func:`fedstats.jobs.demo.run_demo_study`, what
``make demo`` records) ``--runs`` times with fresh OS noise and reads each
run's fit records as the compliance report does. For every coefficient of
every private fit it checks that the private 95% interval covers the exact
fit's estimate, or that the fit carries a utility warning
(``PrivacyUtilityWarning``; ``utility_warnings`` in the record). Prints one
JSON line: per private fit, the intervals checked, those covering the exact
estimate, those not covering it in a fit that warned, and those not covering
it in a fit that did not warn (the target is 0), with the noise shares.

    .venv/bin/python benchmarks/demo_intervals.py [--runs 20]
"""

from __future__ import annotations

import sys
from pathlib import Path

# benchmarks/harmonize.py would shadow the harmonize package: keep this folder off the path.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import argparse  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

from fedstats.jobs.demo import run_demo_study  # noqa: E402
from reports.study import Study  # noqa: E402

PRIVATE_FITS = ("logistic-record-dp", "logistic-client-dp")


def check_run(study: Study, tally: dict) -> None:
    """Add one run's private intervals to ``tally``, fit by fit."""
    exact = study.fit("logistic-exact").result
    for name in PRIVATE_FITS:
        result = study.fit(name).result
        counts = tally.setdefault(
            name,
            {"intervals": 0, "cover_exact": 0, "miss_warned": 0, "miss_unwarned": 0,
             "fits_warned": 0, "noise_share_max": 0.0},
        )  # fmt: skip
        counts["fits_warned"] += bool(result.utility_warnings)
        for term, estimate in exact.params.items():
            lower, upper = result.conf_int["lower"][term], result.conf_int["upper"][term]
            counts["intervals"] += 1
            if lower is not None and upper is not None and lower <= estimate <= upper:
                counts["cover_exact"] += 1
            elif result.utility_warnings:
                counts["miss_warned"] += 1
            else:
                counts["miss_unwarned"] += 1
        shares = [v for v in result.noise_share.values() if v is not None]
        counts["noise_share_max"] = max(counts["noise_share_max"], *shares, 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    options = parser.parse_args()
    tally: dict = {}
    started = time.perf_counter()
    for _ in range(options.runs):
        with tempfile.TemporaryDirectory() as folder:
            check_run(Study.load(run_demo_study(folder)), tally)
    unwarned = sum(t["miss_unwarned"] for t in tally.values())
    print(
        json.dumps(
            {
                "benchmark": "demo_intervals",
                "runs": options.runs,
                "noise": "OS entropy",
                "fits": tally,
                "uncovered_without_warning": unwarned,
                "meets_target": unwarned == 0,
                "seconds": round(time.perf_counter() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
