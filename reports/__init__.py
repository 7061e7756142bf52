"""Regulator-facing reports built only from what the other packages recorded.

* :func:`budget_table` and :func:`data_flows`: the budget table of a ledger
  and the data-flow table of a message inventory;
* :class:`StudyRecorder`: writes a study directory (:mod:`reports.layout`)
  of recorded facts;
* :meth:`Study.load`, :func:`build_report`, :func:`write_html`,
  :func:`write_pdf` and :func:`write_report`: the compliance report of a study
  directory, as self-contained HTML and as PDF.
"""

from reports.budgets import budget_table
from reports.build import build_report
from reports.errors import (
    RecordingError,
    RenderError,
    ReportError,
    StudyDirectoryError,
    StudyRecordError,
)
from reports.flows import data_flows
from reports.formatting import format_epsilon
from reports.model import ComplianceReport
from reports.recorder import StudyRecorder
from reports.render import render_html, write_html, write_pdf, write_report
from reports.study import Study

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
