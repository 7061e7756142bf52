"""Harmonisation at scale: 100,000 patients with 5,000,000 observations, FHIR and OMOP.

The same synthetic patients (:mod:`harmonize.synthetic_ehr`, 50 measurements
each, plus visits, diagnoses, prescriptions and deaths) are written once as
FHIR Bulk Data NDJSON and once as OMOP CDM 5.4 in a DuckDB file, then each
is harmonised under the demo study (``fedstats/examples/demo/study.toml``) by
``fedstats harmonize`` in a fresh process, as a site's batch job would run
it. For each: wall time, and peak memory of the whole process tree (the run
and its validating workers, sampled every 50 ms with psutil), with the
kernel's peaks (``ru_maxrss``) of the main process and of its largest
worker beside it. The data are written by a child process, so that no
harmonisation run inherits the generator's memory. Measured side
by side in the same run: the time to merely parse every NDJSON line with
``json.loads`` (what any reader pays) and to scan the OMOP tables with DuckDB.
The two frames are compared (they must be identical) and both reports must
balance (read = included + excluded + rejected). The FHIR run validates with
``fhir.resources`` the records the frame relies on (see :mod:`harmonize.fhir`);
the JSON line says what share of the records read that was
(``ndjson_validated_fraction``), and the machine's load average before and
after the runs (the cores are shared). Prints one JSON line.

    .venv/bin/python benchmarks/harmonize.py [--patients 100000] [--observations 5000000]
        [--workers N] [--memory-limit 1GB]

Targets: OMOP/DuckDB wall time under 60 s; NDJSON wall time at most 120 s
and peak memory of the process tree under 2 GB.
"""

from __future__ import annotations

import sys
from pathlib import Path

# This script shares its name with the ``harmonize`` package: keep its folder off the path.
HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != HERE]

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import duckdb  # noqa: E402
import pandas as pd  # noqa: E402
import psutil  # noqa: E402

from harmonize.synthetic_ehr import (  # noqa: E402
    person_keys,
    synthetic_ehr,
    write_fhir_ndjson,
    write_omop_duckdb,
)

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "fedstats" / "examples" / "demo" / "study.toml"
OMOP_SECONDS_TARGET = 60.0
NDJSON_SECONDS_TARGET = 120.0
NDJSON_PEAK_GB_TARGET = 2.0
GB = 1e9


def generate_in_child(folder: Path, patients: int, per_patient: int, seed: int) -> float:
    """Write the synthetic sources in a child process, so this one stays small.

    (A child forked from a large parent inherits its peak resident size, which
    would then be charged to the harmonisation runs.)
    """
    start = time.perf_counter()
    command = [sys.executable, __file__, "--generate", str(folder), "--patients", str(patients),
               "--per-patient", str(per_patient), "--seed", str(seed)]  # fmt: skip
    subprocess.run(command, check=True)
    return time.perf_counter() - start


def generate(folder: Path, patients: int, per_patient: int, seed: int) -> None:
    ehr = synthetic_ehr(patients, seed=seed, measurements_per_patient=per_patient)
    write_omop_duckdb(ehr, folder / "omop.duckdb")
    write_fhir_ndjson(ehr, folder / "fhir")
    keys = pd.Series(person_keys(ehr), name="person_id")
    keys.to_frame().to_parquet(folder / "keys.parquet")
    (folder / "observations.txt").write_text(str(len(ehr.measurements)))


CHILD = """
import json, resource, sys
from fedstats.cli.main import app
report, sys.argv = sys.argv[1], ["fedstats", *sys.argv[2:]]
try:
    app()
except SystemExit as done:
    code = done.code or 0
else:
    code = 0
peak = {"main": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "largest_worker": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024}
open(report, "w").write(json.dumps(peak))
sys.exit(code)
"""


def harmonize_in_child(source: str, path: Path, out: Path, options: list[str]) -> dict:
    """Run ``fedstats harmonize`` in a new process: wall time and peak memory of its tree.

    The peak is the largest sum of resident sizes over the process tree
    (the run and its validating workers), sampled every 50 ms with psutil.
    The kernel's own peaks (``ru_maxrss``) of the main process and of its
    largest worker are reported beside it as a check on the sampling: the
    main process's kernel peak must not exceed the sampled tree peak by more
    than what 50 ms can hide.
    """
    peaks = out.with_suffix(".peak.json")
    command = [sys.executable, "-c", CHILD, str(peaks), "harmonize", "--spec", str(SPEC),
               "--site", f"bench_{source}", f"--{source}", str(path), "--out", str(out),
               *options]  # fmt: skip
    log = out.with_suffix(".stderr.log")  # a file, not a pipe: the run's progress log fills one
    start = time.perf_counter()
    with log.open("wb") as stderr:
        child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
        sampled = 0
        tree = psutil.Process(child.pid)
        processes: set[int] = set()
        while child.poll() is None:
            try:
                members = [tree, *tree.children(recursive=True)]
                processes |= {p.pid for p in members}
                sampled = max(sampled, sum(p.memory_info().rss for p in members))
            except psutil.Error:
                pass
            time.sleep(0.05)
    wall = time.perf_counter() - start
    if child.returncode != 0:
        errors = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"harmonize --{source} failed ({child.returncode}): {errors}")
    kernel = json.loads(peaks.read_text())
    return {
        "seconds": round(wall, 2),
        "peak_gb": round(sampled / GB, 3),
        "main_peak_gb": round(kernel["main"] / GB, 3),
        "largest_worker_peak_gb": round(kernel["largest_worker"] / GB, 3),
        "child_processes": len(processes) - 1,
        "report": json.loads((out / "report.json").read_text()),
    }


def parse_seconds(folder: Path) -> float:
    """Time to ``json.loads`` every line of every NDJSON file (no validation, no store)."""
    start = time.perf_counter()
    for path in sorted(folder.glob("*.ndjson")):
        with path.open("rb") as handle:
            for line in handle:
                json.loads(line)
    return time.perf_counter() - start


def scan_seconds(path: Path) -> float:
    """Time for DuckDB to read every column of every OMOP table once (counting values)."""
    start = time.perf_counter()
    with duckdb.connect(str(path), read_only=True) as connection:
        tables = [t for (t,) in connection.execute("SHOW TABLES").fetchall()]
        for table in tables:
            columns = [c for (c, *_) in connection.execute(f"DESCRIBE {table}").fetchall()]
            counts = ", ".join(f"count({c})" for c in columns)
            connection.execute(f"SELECT {counts} FROM {table}").fetchall()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patients", type=int, default=100_000)
    parser.add_argument("--observations", type=int, default=5_000_000)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--memory-limit", default="1GB")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--generate", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--per-patient", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.generate is not None:
        generate(args.generate, args.patients, args.per_patient, args.seed)
        return
    per_patient = max(1, args.observations // args.patients)

    with tempfile.TemporaryDirectory(prefix="fedstats-bench-") as folder:
        work = Path(folder)
        setup = generate_in_child(work, args.patients, per_patient, args.seed)
        load_before = os.getloadavg()[0]
        keys = pd.read_parquet(work / "keys.parquet")["person_id"].to_dict()
        observations = int((work / "observations.txt").read_text())
        options = ["--memory-limit", args.memory_limit]
        if args.workers is not None:
            options += ["--workers", str(args.workers)]
        omop = harmonize_in_child("omop", work / "omop.duckdb", work / "out_omop", options)
        ndjson = harmonize_in_child("fhir", work / "fhir", work / "out_fhir", options)
        load_after = os.getloadavg()[0]
        parse = parse_seconds(work / "fhir")
        scan = scan_seconds(work / "omop.duckdb")

        from_omop = pd.read_parquet(work / "out_omop" / "frame.parquet").sort_index()
        from_fhir = pd.read_parquet(work / "out_fhir" / "frame.parquet")
        from_fhir = from_fhir.rename(index=keys).sort_index()
        identical = from_fhir.equals(from_omop) and len(from_omop) > 0
        ndjson_bytes = sum(p.stat().st_size for p in (work / "fhir").glob("*.ndjson"))

    result = {
        "benchmark": "harmonize",
        "patients": args.patients,
        "observations": observations,
        "ndjson_gb": round(ndjson_bytes / GB, 2),
        "setup_seconds": round(setup, 1),
        "omop_seconds": omop["seconds"],
        "omop_peak_gb": omop["peak_gb"],
        "ndjson_seconds": ndjson["seconds"],
        "ndjson_peak_gb": ndjson["peak_gb"],
        "ndjson_main_peak_gb": ndjson["main_peak_gb"],
        "ndjson_largest_worker_peak_gb": ndjson["largest_worker_peak_gb"],
        "ndjson_child_processes": ndjson["child_processes"],
        "ndjson_parse_only_seconds": round(parse, 1),
        "ndjson_time_ratio_vs_parse_only": round(ndjson["seconds"] / parse, 2),
        "omop_scan_only_seconds": round(scan, 2),
        "omop_time_ratio_vs_scan_only": round(omop["seconds"] / scan, 2),
        "records_read": {"omop": omop["report"]["read"], "fhir": ndjson["report"]["read"]},
        "ndjson_not_validated": ndjson["report"]["not_validated"],
        "ndjson_validated_fraction": round(
            1 - ndjson["report"]["not_validated"] / ndjson["report"]["read"], 4
        ),
        "balanced": omop["report"]["balanced"] and ndjson["report"]["balanced"],
        "frame_patients": len(from_omop),
        "frames_identical": bool(identical),
        "workers": args.workers if args.workers is not None else "auto",
        "cpus": os.cpu_count(),
        "memory_limit": args.memory_limit,
        "load_average_1min": {"before": round(load_before, 2), "after": round(load_after, 2)},
        "omop_target_met": omop["seconds"] < OMOP_SECONDS_TARGET,
        "ndjson_wall_target_s": NDJSON_SECONDS_TARGET,
        "ndjson_wall_meets_target": ndjson["seconds"] <= NDJSON_SECONDS_TARGET,
        "ndjson_memory_target_met": ndjson["peak_gb"] < NDJSON_PEAK_GB_TARGET,
        "ndjson_meets_target": (
            ndjson["seconds"] <= NDJSON_SECONDS_TARGET
            and ndjson["peak_gb"] < NDJSON_PEAK_GB_TARGET
            and bool(identical)
            and omop["report"]["balanced"]
            and ndjson["report"]["balanced"]
        ),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
