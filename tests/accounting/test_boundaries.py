"""The accounting package stands alone: it imports none of fedstats, harmonize or reports."""

from __future__ import annotations

import subprocess
import sys

import accounting


def test_accounting_imports_no_other_project_package():
    code = (
        "import sys, accounting; "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'fedstats', 'harmonize', 'reports'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_public_api():
    for name in [
        "Scope", "Ledger", "Budget", "Entry", "Preview", "Spent", "VerifyReport",
        "BudgetExceeded", "UnsupportedMechanism", "UnknownScope", "LedgerError",
        "LedgerCorrupted", "rdp_epsilon", "pld_epsilon", "calibrate_gaussian",
        "event_to_json", "event_from_json", "describe_event", "PrivacyUnit", "Neighbouring",
    ]:  # fmt: skip
        assert name in accounting.__all__
        assert hasattr(accounting, name)
    assert issubclass(accounting.LedgerCorrupted, accounting.LedgerError)
    assert issubclass(accounting.UnknownScope, accounting.LedgerError)
