"""The README's harmonisation commands run as printed, from a checkout and nothing else.

Every ``sh`` block of the README that runs ``fedstats harmonize`` is run
command by command in an empty folder, as a reader would from the clone: the
only change is that the checkout's relative ``fedstats/examples/`` is given
as an absolute path. Each harmonised frame must be written with its report
and hold patients.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"


def harmonise_blocks() -> list[str]:
    text = README.read_text(encoding="utf-8")
    blocks = re.findall(r"^```sh\n(.*?)^```", text, flags=re.MULTILINE | re.DOTALL)
    return [block for block in blocks if "fedstats harmonize" in block]


def test_the_readme_harmonisation_commands_run_on_a_fresh_clone(tmp_path: Path) -> None:
    blocks = harmonise_blocks()
    assert blocks, "the README shows no fedstats harmonize command"
    environment = dict(os.environ)
    environment["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environment['PATH']}"
    environment["PYTHONPATH"] = os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    )
    environment.pop("FEDSTATS_DATA", None)  # nothing beside the clone
    outs = []
    for block in blocks:
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in filter(None, (line.strip() for line in joined.splitlines())):
            argv = shlex.split(line, comments=True)
            argv = [str(ROOT / a) if a.startswith("fedstats/examples/") else a for a in argv]
            done = subprocess.run(
                argv, cwd=tmp_path, env=environment, capture_output=True, text=True, check=False
            )
            assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
            if argv[:2] == ["fedstats", "harmonize"]:
                outs.append(tmp_path / argv[argv.index("--out") + 1])
    assert len(outs) >= 2
    for out in outs:
        report = json.loads((out / "report.json").read_text())
        frame = pd.read_parquet(out / "frame.parquet")
        assert report["status"] == "ok" and report["balanced"], out
        assert len(frame) == report["patients"] > 100, out
