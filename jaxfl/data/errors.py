"""Errors of the data layer, each with a one-line message for users.

The CLI prints these as `jaxfl: error: <message>` and exits with status 2
before anything is written, so every message names the file (or directory)
and says what is wrong with it and, where it helps, what was expected.
"""

from __future__ import annotations


class DataFileError(ValueError):
    """A data file is unreadable, truncated, corrupt, or not the expected format."""


class MissingDataError(DataFileError):
    """A dataset's files are absent: the message says which and where it looked."""
