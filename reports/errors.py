"""Domain errors of :mod:`reports`, each naming the folder, file or field and what to do."""

from __future__ import annotations

from pathlib import Path


class ReportError(Exception):
    """Base class of every error this package raises on purpose."""


class StudyDirectoryError(ReportError):
    """The folder is missing or is not a study directory (no ``study.json``)."""

    def __init__(self, directory: str | Path, reason: str) -> None:
        self.directory = Path(directory)
        super().__init__(
            f"{self.directory} is not a readable study directory: {reason}; give the folder a "
            "StudyRecorder wrote (it holds study.json), e.g. the one `fedstats demo` writes"
        )


class StudyRecordError(ReportError):
    """A file of a study directory is unreadable or holds a wrong field."""

    def __init__(self, path: str | Path, problem: str) -> None:
        self.path = Path(path)
        self.problem = problem
        super().__init__(
            f"{self.path}: {problem}; re-record the study (StudyRecorder) or restore the file"
        )


class RecordingError(ReportError):
    """A study cannot be recorded as asked (e.g. a name unusable as a file name)."""


class RenderError(ReportError):
    """The report could not be written (unsupported output type, or the renderer failed)."""
