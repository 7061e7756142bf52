"""studyfiles: the files a federated study leaves behind, as their writers and readers share them.

``fedstats`` writes them and ``reports`` reads them; neither imports the
other, both import this package, and it imports neither.

* :mod:`studyfiles.durable` — content hashes and atomic, durable writes;
* :mod:`studyfiles.inventory` — the message inventory: what crossed the
  silo boundary, request by request (JSON Lines);
* :mod:`studyfiles.json_values` — numbers as the JSON files hold them.
"""

from studyfiles.durable import file_sha256, replace_durably, write_atomically, write_json_atomically
from studyfiles.errors import InventoryFileError, StudyFileError
from studyfiles.inventory import MessageInventory, MessageRecord
from studyfiles.json_values import json_number, json_numbers, json_tree

__all__ = [
    "InventoryFileError",
    "MessageInventory",
    "MessageRecord",
    "StudyFileError",
    "file_sha256",
    "json_number",
    "json_numbers",
    "json_tree",
    "replace_durably",
    "write_atomically",
    "write_json_atomically",
]
