"""Errors of reading a study's files; each message names the file, line and field."""

from __future__ import annotations


class StudyFileError(Exception):
    """A study file cannot be read as its format says."""


class InventoryFileError(StudyFileError):
    """A saved message inventory cannot be read (the message names the file, line and field)."""


class FitRecordError(StudyFileError):
    """A fit's results do not make a valid fit record (the message names every bad field)."""


class LinkageRecordError(StudyFileError):
    """A linkage record (``linkages/<id>.json``) does not match its format."""
