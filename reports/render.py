"""Rendering the report model to one self-contained HTML file (Jinja2) and to PDF (WeasyPrint).

The HTML carries its style sheet inline and its figures as PNG data URIs:
it references no file or network address and runs no script. The PDF is
WeasyPrint's rendering of the same HTML with the print rules of the style
sheet (A4 pages, page numbers, table headers repeated across page breaks).
Jinja2, WeasyPrint and the report builder are imported when a report is
rendered, written or built, not with the module.
"""

from __future__ import annotations

from importlib.resources import files
from os import PathLike
from pathlib import Path
from typing import TYPE_CHECKING

from reports import formatting, labels
from reports.errors import RenderError

if TYPE_CHECKING:
    import jinja2

    from reports.model import ComplianceReport

FORMATS = (".html", ".pdf")


def _environment() -> jinja2.Environment:
    import jinja2

    environment = jinja2.Environment(
        loader=jinja2.PackageLoader("reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters.update(
        eps=formatting.format_epsilon,
        delta=formatting.format_delta,
        num=formatting.format_number,
        count=formatting.format_count,
        share=formatting.format_share,
        nbytes=formatting.format_bytes,
        time=formatting.format_time,
        label=labels.field_label,
        words=labels.value_text,
        term=labels.term_label,
        terms=labels.terms_in_text,
        digest=formatting.digest_html,
    )
    return environment


def render_html(report: ComplianceReport) -> str:
    """The report as one HTML document (style inline, figures as data URIs)."""
    style = files("reports").joinpath("templates", "report.css").read_text(encoding="utf-8")
    template = _environment().get_template("report.html.j2")
    return template.render(report=report, style=style)


def write_html(report: ComplianceReport, path: str | PathLike[str]) -> Path:
    path = Path(path)
    path.write_text(render_html(report), encoding="utf-8")
    return path


def write_pdf(report: ComplianceReport, path: str | PathLike[str]) -> Path:
    """The same HTML rendered to PDF by WeasyPrint."""
    import weasyprint

    path = Path(path)
    try:
        weasyprint.HTML(string=render_html(report)).write_pdf(path)
    except OSError as error:
        raise RenderError(f"cannot write the PDF report {path}: {error}") from None
    return path


def write_report(study_dir: str | PathLike[str], out: str | PathLike[str]) -> Path:
    """Load the study directory, build the report and write it as ``out`` (.html or .pdf)."""
    from reports.build import build_report
    from reports.study import Study

    out = Path(out)
    suffix = out.suffix.lower()
    if suffix not in FORMATS:
        raise RenderError(
            f"cannot write a report as {out.name!r}: give a file name ending in .html or .pdf"
        )
    if not out.parent.is_dir():
        raise RenderError(f"cannot write {out}: the folder {out.parent} does not exist")
    report = build_report(Study.load(study_dir))
    return write_html(report, out) if suffix == ".html" else write_pdf(report, out)
