"""``EXPLAIN``: the path a statement takes, as plain data.

The description names the tier (0 key lookup, 1 key set or key range, 2 filtered scan,
3 aggregation, 4 join), whether the Python fast path or DuckDB computes the answer, and for
every table reference: the access (``key_lookup``; ``range_query``, a ``RangeQuery`` per
partition answered in Python; ``key_range``, an encoded key range read by fragments;
``full_scan``), the keys
or encoded key range, window-start bounds, the partitions touched, the pushed predicate, the
columns read, the SQL each partition runs and the table's ``AS OF``. Nothing is read to
explain a statement. A node hosting every partition of the tables scanned runs ``final_sql``'s
statement once over the partitions' Arrow versions instead of per-partition fragments; every
read spanning partitions reads one batch per table either way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.sql.keys import KeyAccess
from sparkiq.sql.plan import Plan

__all__ = ["explain_plan"]

Codecs = Callable[[str], tuple[TableSchema, KeyCodec, Partitioner]]


def _tier(plan: Plan, accesses: list[KeyAccess]) -> int:
    if plan.joins:
        return 4
    if plan.aggregation is not None:
        return 3
    if not accesses:
        return 2
    access = accesses[0]
    if access.keys is not None and len(access.keys) == 1:
        return 0
    if access.keys is not None or access.lower is not None or access.upper is not None:
        return 1
    if access.window_from is not None or access.window_to is not None:
        return 1
    return 2


def explain_plan(plan: Plan, accesses: list[KeyAccess], codecs: Codecs) -> dict[str, Any]:
    """The plan of ``plan`` with its bound ``accesses`` (see the module docstring)."""
    first = accesses[0] if accesses else KeyAccess()
    python = plan.python is not None and (
        (first.keys is not None and first.exact) or first.range_bounds is not None
    )
    tables = []
    for table, access in zip(plan.tables, accesses, strict=True):
        _, codec, partitioner = codecs(table.name)
        if access.keys is not None:
            kind = "key_lookup"
            partitions = sorted({partitioner(codec.to_internal(k)) for k in access.keys})
        else:
            ranged = access.lower is not None or access.upper is not None
            kind = "key_range" if ranged else "full_scan"
            if python and access.range_bounds is not None:
                kind = "range_query"
            partitions = list(range(partitioner.partitions))
        tables.append(
            {
                "table": table.name,
                "alias": table.alias,
                "access": kind,
                "keys": None if access.keys is None else [repr(k) for k in access.keys],
                "key_range": None
                if access.keys is not None
                else {
                    "lower": None if access.lower is None else access.lower.hex(),
                    "upper_exclusive": None if access.upper is None else access.upper.hex(),
                },
                "window_start": {"from": access.window_from, "to": access.window_to},
                "partitions": partitions,
                "pushed_predicate": table.pushed,
                "columns": list(table.columns),
                "fragment_sql": None if python else table.fragment_sql,
                "top_n_pushed": table.top_n,
                "as_of": None if table.as_of is None else str(table.as_of),
            }
        )
    return {
        "statement": plan.text,
        "tier": _tier(plan, accesses),
        "path": "python" if python else "duckdb",
        "duckdb": not python,
        "aggregation": plan.aggregation,
        "paging": "key" if plan.key_paging else "offset",
        "tables": tables,
        "final_sql": None if python else plan.final_sql,
    }


def explain_rows(described: Any) -> list[dict[str, str]]:
    """An ``EXPLAIN``'s rows: ``{"property": dotted path, "value": text}`` per leaf of the
    description."""
    return [{"property": k, "value": v} for k, v in _flatten(described)]


def _flatten(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    if isinstance(value, dict):
        out: list[tuple[str, str]] = []
        for key, inner in value.items():
            out += _flatten(inner, f"{prefix}.{key}" if prefix else str(key))
        return out
    if isinstance(value, list) and value and isinstance(value[0], dict):
        out = []
        for i, inner in enumerate(value):
            out += _flatten(inner, f"{prefix}[{i}]")
        return out
    return [(prefix, "" if value is None else str(value))]
