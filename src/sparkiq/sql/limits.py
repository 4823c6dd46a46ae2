"""Bounds on what one SQL statement may cost, and the DuckDB settings that enforce some.

Every limit has a keyword argument and a ``SPARKIQ_SQL_<NAME>`` environment variable, which
:class:`~sparkiq.serving.config.NodeConfig` reads (a node's ``sql_limits``; the class itself
reads nothing); exceeding one raises :class:`~sparkiq.sql.errors.SqlLimitError` naming the
limit and how to raise it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import ConfigError
from sparkiq.limits import parse_size
from sparkiq.sql.errors import SqlLimitError

__all__ = ["SqlLimits"]

_SIZES = ("memory_limit", "spill_limit")  # DuckDB sizes as text: "512MB", "1GiB"


@dataclass(frozen=True, slots=True)
class SqlLimits:
    """Limits of one :class:`~sparkiq.sql.SqlEngine`.

    - ``max_statement_chars``: longest statement text accepted, pull or push
      (:meth:`check_statement`).
    - ``max_result_rows``: most rows one answer (or one page) may hold; larger results must
      use ``LIMIT`` or paging.
    - ``timeout_seconds``: wall-clock budget of one statement; DuckDB work is interrupted
      when it runs out.
    - ``default_page_size`` / ``max_page_size``: page size when a page token is passed
      without ``page_size``, and the largest page a caller may ask for.
    - ``memory_limit`` / ``threads``: DuckDB's ``memory_limit`` and ``threads`` for the
      engine's database (shared by its threads); the process may grow at most twice
      ``memory_limit`` while statements run before they are interrupted.
    - ``spill_limit``: most bytes DuckDB spills to disk (into a private temporary
      directory it removes when closed).
    - ``max_value_bytes``: largest value a function may build (``repeat``, ``lpad``,
      ``range``...; see :mod:`sparkiq.sql.duck`).
    - ``max_result_bytes``: most bytes (approximately, as encoded) a result computed by
      DuckDB may hold, on every path (REST JSON, the binary client, Postgres).
    - ``max_terms``: most literal values (strings, numbers) plus ``AND``/``OR``
      connectives one pull statement may hold: planning costs about a millisecond per
      term, all of it holding the GIL. Longer lists: one statement per batch of keys, or a
      key range.
    - ``max_key_lookups``: most point lookups an ``IN`` list (or the product of ``IN`` lists
      on a composite key) turns into before the engine scans the key range instead.
    - ``fragment_min_rows``: a partition with fewer rows in range skips its filter or
      top-N fragment and ships them (the coordinator filters again): one DuckDB run costs
      about as much as shipping a few thousand rows. 0 always runs fragments.
    """

    max_statement_chars: int = 100_000
    max_result_rows: int = 100_000
    timeout_seconds: float = 30.0
    default_page_size: int = 1_000
    max_page_size: int = 10_000
    memory_limit: str = "512MB"
    threads: int = 2
    spill_limit: str = "1GB"
    max_value_bytes: int = 64 << 10
    max_result_bytes: int = 64 << 20
    max_terms: int = 1000
    max_key_lookups: int = 256
    fragment_min_rows: int = 2048

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name in _SIZES:
                parse_size(value, f"SqlLimits.{f.name}")
                continue
            floor = 0 if f.name == "fragment_min_rows" else 1e-9
            if isinstance(value, bool) or not isinstance(value, int | float) or value < floor:
                raise ConfigError(
                    f"SqlLimits.{f.name} must be a number >= {floor:g}, got {value!r}"
                )
        if self.default_page_size > self.max_page_size:
            raise ConfigError(
                f"SqlLimits.default_page_size ({self.default_page_size}) exceeds max_page_size "
                f"({self.max_page_size})"
            )

    def check_statement(self, text: str) -> None:
        """Refuse a statement longer than ``max_statement_chars`` (pull and push queries
        alike), before anything else reads it: a regex, the shape cache or the parser."""
        if len(text) > self.max_statement_chars:
            raise SqlLimitError(
                f"the statement has {len(text)} characters, more than "
                f"SqlLimits.max_statement_chars={self.max_statement_chars}",
                code=ErrorCode.STATEMENT_TOO_LONG,
            )
