"""SQL over materialized tables: pull queries (parse and plan with sqlglot, execute with
DuckDB over Arrow, push down to the stores) and push queries (``EMIT CHANGES``).

Public API: :class:`SqlEngine` (``execute(text, bound=..., page_token=..., page_size=...)``),
:class:`SqlResult`, :class:`SqlLimits`, :class:`QuerySource` (what the engine reads) and the
errors (see :mod:`sparkiq.sql.errors`). Importing this package registers
:class:`SqlFragmentQuery` with the store dispatch and the wire protocol, so every process
that answers SQL fragments must import it (a :class:`~sparkiq.Node` does on first SQL use).
"""

from __future__ import annotations

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
