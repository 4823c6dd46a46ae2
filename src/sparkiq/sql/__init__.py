"""SQL over materialized tables: pull queries (parse and plan with sqlglot, execute with
DuckDB over Arrow, push down to the stores) and push queries (``EMIT CHANGES``).

Public API: :class:`SqlEngine` (``execute(text, bound=..., page_token=..., page_size=...)``),
:class:`SqlResult`, :class:`SqlLimits`, :class:`QuerySource` (what the engine reads) and the
errors (see :mod:`sparkiq.sql.errors`). Each is imported when first used (see
:mod:`sparkiq.exports`), so a client reading :mod:`sparkiq.sql.change` does not load DuckDB
and sqlglot. Importing the engine registers :class:`SqlFragmentQuery` with the store dispatch
and the wire protocol (the engine's reader imports it), so every process that answers SQL
fragments has it: a :class:`~sparkiq.Node`, an attached checkpoint and a follower each build
an engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkiq.exports import lazy_exports

_HOMES: dict[str, tuple[str, ...]] = {
    "sparkiq.sql.engine": ("SqlEngine",),
    "sparkiq.sql.errors": (
        "SqlError",
        "SqlLimitError",
        "SqlPartitionError",
        "SqlSyntaxError",
        "SqlUnknownNameError",
        "SqlUnsupportedError",
    ),
    "sparkiq.sql.fragment": ("SqlFragmentQuery",),
    "sparkiq.sql.limits": ("SqlLimits",),
    "sparkiq.sql.result": ("SqlResult",),
    "sparkiq.sql.source": ("QuerySource",),
}

__all__ = [
    "QuerySource",
    "SqlEngine",
    "SqlError",
    "SqlFragmentQuery",
    "SqlLimitError",
    "SqlLimits",
    "SqlPartitionError",
    "SqlResult",
    "SqlSyntaxError",
    "SqlUnknownNameError",
    "SqlUnsupportedError",
]

if TYPE_CHECKING:
    # What type checkers see; tests/test_package.py keeps it, _HOMES and __all__ equal.
    from sparkiq.sql.engine import SqlEngine
    from sparkiq.sql.errors import (
        SqlError,
        SqlLimitError,
        SqlPartitionError,
        SqlSyntaxError,
        SqlUnknownNameError,
        SqlUnsupportedError,
    )
    from sparkiq.sql.fragment import SqlFragmentQuery
    from sparkiq.sql.limits import SqlLimits
    from sparkiq.sql.result import SqlResult
    from sparkiq.sql.source import QuerySource
else:
    __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
