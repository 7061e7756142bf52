"""`fedstats report --study DIR --out FILE`: HTML or PDF, and clear errors without a traceback."""

from __future__ import annotations

from typer.testing import CliRunner

from fedstats.cli.main import app


def run(*args: str):
    return CliRunner().invoke(app, ["report", *args])


def test_report_writes_html_and_pdf(demo_study, tmp_path):
    for name in ("report.html", "report.pdf"):
        out = tmp_path / name
        result = run("--study", str(demo_study), "--out", str(out))
        assert result.exit_code == 0, result.output
        assert str(out) in result.output
    assert (tmp_path / "report.pdf").read_bytes().startswith(b"%PDF-")
    assert "Privacy compliance report" in (tmp_path / "report.html").read_text()


def test_a_missing_study_directory_is_a_clear_error(tmp_path):
    result = run("--study", str(tmp_path / "nowhere"), "--out", str(tmp_path / "r.html"))
    assert result.exit_code == 2
    assert "nowhere is not a readable study directory: no such folder" in result.output
    assert "Traceback" not in result.output and not (tmp_path / "r.html").exists()


def test_a_folder_without_a_manifest_is_a_clear_error(tmp_path):
    result = run("--study", str(tmp_path), "--out", str(tmp_path / "r.pdf"))
    assert result.exit_code == 2 and "it holds no study.json" in result.output


def test_an_unknown_output_type_is_a_clear_error(demo_study, tmp_path):
    result = run("--study", str(demo_study), "--out", str(tmp_path / "r.docx"))
    assert result.exit_code == 2 and "ending in .html or .pdf" in result.output


def test_a_changed_specification_is_refused(study_copy, tmp_path):
    spec = study_copy / "spec.toml"
    spec.write_text(spec.read_text() + "\n# edited\n")
    result = run("--study", str(study_copy), "--out", str(tmp_path / "r.html"))
    assert result.exit_code == 2
    assert "spec.toml" in result.output and "changed after the study was recorded" in result.output
