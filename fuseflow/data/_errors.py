"""The two ways loading a data set fails: the files are nowhere, or a file is damaged.

Both carry the whole story in their message (which file, what was expected, what was
found, and the fix), because a data error is usually met far from the code that caused it:
in a CLI run, a notebook, or CI.
"""

from __future__ import annotations


class DatasetError(ValueError):
    """A data set file exists but is damaged, truncated, or not what its name says."""


class DatasetNotFoundError(FileNotFoundError):
    """A data set is in none of the places fuseflow looked, and could not be downloaded."""
