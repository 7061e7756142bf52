"""Regulator-facing reports built only from what the other packages recorded.

* :func:`budget_table` and :func:`data_flows`: the budget table of a ledger
  and the data-flow table of a message inventory;
* :class:`StudyRecorder`: writes a study directory (:mod:`reports.layout`)
  of recorded facts;
* :meth:`Study.load`, :func:`build_report`, :func:`write_html`,
  :func:`write_pdf` and :func:`write_report`: the compliance report of a study
  directory, as self-contained HTML and as PDF.

The errors are imported with the package; every other public name is imported
from its module on first use (PEP 562), so ``import reports`` loads neither
pandas, matplotlib, Jinja2 nor the accountants (``dp_accounting`` and SciPy),
and a command that only shows a ledger's budgets loads no report builder.
"""

import importlib
from typing import TYPE_CHECKING, Any

from reports.errors import (
    RecordingError,
    RenderError,
    ReportError,
    StudyDirectoryError,
    StudyRecordError,
)

_PUBLIC: dict[str, str] = {
    "ComplianceReport": "reports.model",
    "Study": "reports.study",
    "StudyRecorder": "reports.recorder",
    "budget_table": "reports.budgets",
    "build_report": "reports.build",
    "data_flows": "reports.flows",
    "format_epsilon": "reports.formatting",
    "render_html": "reports.render",
    "write_html": "reports.render",
    "write_pdf": "reports.render",
    "write_report": "reports.render",
}
"""Where each public name other than the errors is defined, imported on first use."""

if TYPE_CHECKING:
    from reports.budgets import budget_table
    from reports.build import build_report
    from reports.flows import data_flows
    from reports.formatting import format_epsilon
    from reports.model import ComplianceReport
    from reports.recorder import StudyRecorder
    from reports.render import render_html, write_html, write_pdf, write_report
    from reports.study import Study


def __getattr__(name: str) -> Any:
    """Import a public name's module the first time the name is used."""
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'reports' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_PUBLIC})


__all__ = [
    "ComplianceReport",
    "RecordingError",
    "RenderError",
    "ReportError",
    "Study",
    "StudyDirectoryError",
    "StudyRecordError",
    "StudyRecorder",
    "budget_table",
    "build_report",
    "data_flows",
    "format_epsilon",
    "render_html",
    "write_html",
    "write_pdf",
    "write_report",
]
