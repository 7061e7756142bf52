"""Make the known-answer encodings of ``known_answers.json`` under clkhash's own dependencies.

clkhash 0.18.3 declares cryptography<41; the project runs it under cryptography 50. This
script is run with a separate environment holding clkhash 0.18.3 and the cryptography it
declares (40.0.2):

    /tmp/pprl-venv/bin/python tests/linkage/data/make_known_answers.py

It reads each case's clkhash schema (written by ``linkage.schema``, stored in the file),
records and secret from ``known_answers.json``, encodes them with
``clkhash.clk.generate_clks`` and writes the encodings (base64, one per record) and the
versions it ran under back into the file. ``tests/linkage/test_encoding.py`` checks that
``linkage.encode`` under the project's cryptography gives the same bytes.
"""

from __future__ import annotations

import base64
import json
from importlib.metadata import version
from pathlib import Path

from clkhash import clk
from clkhash import schema as clkhash_schema

PATH = Path(__file__).with_name("known_answers.json")


def main() -> None:
    document = json.loads(PATH.read_text())
    for case in document["cases"]:
        schema = clkhash_schema.from_json_dict(case["clkhash_schema"])
        secret = bytes.fromhex(case["secret_hex"])
        records = [[r[name] for name in case["columns"]] for r in case["records"]]
        filters = clk.generate_clks(records, schema, secret, validate=True, max_workers=1)
        case["clks_base64"] = [base64.b64encode(f.tobytes()).decode("ascii") for f in filters]
    document["made_with"] = {
        name: version(name) for name in ("clkhash", "cryptography", "bitarray")
    }
    PATH.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
