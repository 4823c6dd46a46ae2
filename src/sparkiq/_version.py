"""The package version: the one place it is written (pyproject.toml reads it from here).

It sits in the lowest layer so any module may read it without importing the top package.
"""

from __future__ import annotations

__version__ = "0.1.0"
