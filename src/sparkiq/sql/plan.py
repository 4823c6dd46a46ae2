"""Planning: what each partition computes, what the coordinator computes, and the fast path.

A :class:`Plan` is built once per statement (or statement shape) and holds no literal
values of its own beyond the statement's:

- one :class:`TablePlan` per table reference: the columns to build, the key and window
  :class:`~sparkiq.sql.analyze.Term` values, and the *fragment* each partition runs over
  its rows (``SELECT ... FROM __sq_part``): the table's pushable ``WHERE`` conjuncts,
  a per-partition top-N (``ORDER BY ... LIMIT``) for single-table queries, or a partial
  aggregate;
- the *final* query the coordinator runs in DuckDB over the fragments' concatenated
  results (relations ``__sq_r0``, ``__sq_r1``...);
- the *whole* statement over those relations holding plain rows, run in one DuckDB query
  when every table can be read where the engine runs (no fragments, no partial aggregates);
- for single-table key lookups whose select list is only columns, a
  :class:`PythonProjection`: no DuckDB at all.

Aggregates are rewritten by :mod:`sparkiq.sql.aggregate`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field, replace

import pyarrow as pa
from sqlglot import exp

from sparkiq.schema.arrowrows import KEY_COLUMN
from sparkiq.sql.aggregate import decompose
from sparkiq.sql.analyze import Analysis, TableRef, Term, conjuncts, resolve, stored_tables
from sparkiq.sql.fragment import PART
from sparkiq.sql.keys import KeyAccess
from sparkiq.sql.paging import PageToken
from sparkiq.sql.parse import DIALECT
from sparkiq.sql.visible import rows_at, with_ctes

__all__ = [
    "Plan",
    "PythonProjection",
    "TablePlan",
    "build_plan",
    "relation_name",
    "with_versions",
]


def relation_name(index: int) -> str:
    return f"__sq_r{index}"


@dataclass(frozen=True, slots=True)
class TablePlan:
    """How one table reference is read. ``fragment`` is SQL over ``__sq_part`` (None: the
    columns as built); ``pushed`` is the pushed predicate's text (for EXPLAIN)."""

    name: str
    alias: str
    relation: str
    columns: tuple[str, ...]
    terms: tuple[Term, ...]
    fragment: exp.Select | None
    pushed: str | None
    top_n: bool = False
    filter: exp.Select | None = None
    as_of: int | dt.datetime | str | None = None
    #: ``fragment`` as text, made once with the plan: a cached plan's every execution sends
    #: it, and sqlglot's generator took a tenth of a scan's Python time when it was made
    #: per execution (the two-node scan's flame graph in docs/benchmarks.md).
    fragment_sql: str | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        if self.fragment is not None:
            text = self.fragment.sql(dialect=DIALECT, copy=False)
            object.__setattr__(self, "fragment_sql", text)


@dataclass(frozen=True, slots=True)
class PythonProjection:
    """Output ``(name, column)`` pairs of a lookup evaluated in Python; a pseudo-column
    reads the window column's member."""

    items: tuple[tuple[str, str], ...]
    window_column: str | None
    whole_rows: bool = False


@dataclass(slots=True)
class Plan:
    """A statement's plan (see the module docstring)."""

    text: str
    digest: str
    tables: tuple[TablePlan, ...]
    final: exp.Query
    joins: bool
    aggregation: str | None
    python: PythonProjection | None
    key_paging: bool
    explain: bool
    whole: exp.Query | None = None
    final_sql: str = field(init=False)
    #: The result's column types (sparkiq.sql.result_schema), set by the engine once known.
    result_schema: pa.Schema | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.final_sql = self.final.sql(dialect=DIALECT, copy=False)
        self.result_schema = None


def digest_of(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _relation(alias: str, relation: str) -> exp.Table:
    return exp.Table(
        this=exp.to_identifier(relation),
        alias=exp.TableAlias(this=exp.to_identifier(alias, quoted=True)),
    )


def _replace_tables(tree: exp.Query, analysis: Analysis) -> exp.Query:
    """A copy of the query reading relation ``__sq_rN`` for the N-th table reference."""
    copy = tree.copy()
    tables = stored_tables(copy)
    for index, (node, ref) in enumerate(zip(tables, analysis.tables, strict=True)):
        node.replace(_relation(ref.alias, relation_name(index)))
    return copy


def _fragment(ref: TableRef, items: list[exp.Expr]) -> exp.Select:
    select = exp.Select(expressions=items)
    select.set("from_", exp.From(this=_relation(ref.alias, PART)))
    if ref.conjuncts:
        select.set(
            "where", exp.Where(this=exp.and_(*[c.copy() for c in ref.conjuncts], copy=False))
        )
    return select


def fragment_of(ref: TableRef) -> Callable[[list[exp.Expr]], exp.Select]:
    """A function building ``SELECT <items> FROM __sq_part AS alias WHERE <pushed>``."""
    return lambda items: _fragment(ref, items)


def _columns(ref: TableRef) -> list[exp.Expr]:
    return [exp.column(c, quoted=True) for c in ref.ordered_columns()]


def build_plan(
    analysis: Analysis,
    output_names: list[str] | None = None,
    output_types: list[str] | None = None,
) -> Plan:
    """Plan an analyzed statement; ``output_names`` and ``output_types`` are the
    statement's output columns as DuckDB names and types them (needed to keep both when
    aggregates are rewritten into partials and merges)."""
    parsed = analysis.parsed
    tree = parsed.tree
    refs = analysis.tables
    final = _replace_tables(tree, analysis)
    whole = final
    aggregation: str | None = None
    tables: list[TablePlan] = []
    single = analysis.simple and len(refs) == 1
    partial: tuple[exp.Select, exp.Select] | None = None
    if single and analysis.aggregate and not analysis.window_functions:
        assert isinstance(tree, exp.Select)
        partial = decompose(tree, fragment_of(refs[0]), output_names, output_types)
        aggregation = "partial" if partial is not None else "rows"
    elif analysis.aggregate or analysis.window_functions:
        aggregation = "rows"
    for index, ref in enumerate(refs):
        fragment: exp.Select | None = None
        top_n = False
        if partial is not None:
            fragment, final = partial
            final = _replace_tables(final, analysis)
        elif analysis.simple:
            if ref.conjuncts:
                fragment = _fragment(ref, _columns(ref))
            if single and aggregation is None:
                pushed = _push_top_n(tree, ref, fragment, refs, analysis)
                if pushed is not None:
                    fragment, top_n = pushed, True
        pushed_text = (
            exp.and_(*ref.conjuncts).sql(dialect=DIALECT, copy=False)
            if ref.conjuncts and analysis.simple
            else None
        )
        tables.append(
            TablePlan(
                ref.name,
                ref.alias,
                relation_name(index),
                tuple(ref.ordered_columns()),
                tuple(ref.terms),
                fragment,
                pushed_text,
                top_n,
                _fragment(ref, _columns(ref)) if ref.conjuncts and analysis.simple else None,
                ref.as_of,
            )
        )
    python = _python_projection(analysis) if single else None
    key_paging = (
        single
        and aggregation is None
        and isinstance(tree, exp.Select)
        and not tree.args.get("order")
        and not tree.args.get("distinct")
        and literal_int(tree, "limit") is not False
        and literal_int(tree, "offset") is not False
    )
    return Plan(
        parsed.text,
        digest_of(parsed.text),
        tuple(tables),
        final,
        len(refs) > 1,
        aggregation,
        python,
        key_paging,
        parsed.explain,
        whole,
    )


def _push_top_n(
    tree: exp.Query,
    ref: TableRef,
    fragment: exp.Select | None,
    refs: list[TableRef],
    analysis: Analysis,
) -> exp.Select | None:
    """``ORDER BY ... LIMIT n+m`` per partition when the order uses table columns only."""
    if not isinstance(tree, exp.Select) or tree.args.get("distinct"):
        return None
    limit = tree.args.get("limit")
    if limit is None:
        return None
    count = limit.expression
    offset_node = tree.args.get("offset")
    offset = offset_node.expression if offset_node is not None else exp.Literal.number(0)
    if not (isinstance(count, exp.Literal) and isinstance(offset, exp.Literal)):
        return None
    if count.is_string or offset.is_string:
        return None
    try:
        total = int(count.this) + int(offset.this)
    except ValueError:
        return None
    order = tree.args.get("order")
    keys: list[exp.Expr] = []
    if order is not None:
        for item in order.expressions:
            inner = item.this
            if isinstance(inner, exp.Literal) or inner.find(exp.AggFunc, exp.Window):
                return None
            columns = list(inner.find_all(exp.Column))
            for column in columns:
                found = resolve(column, refs)
                if found is None or found[0] is not ref:
                    return None
            keys.append(item.copy())
    select = fragment.copy() if fragment is not None else _fragment(ref, _columns(ref))
    if keys:
        select.set("order", exp.Order(expressions=keys))
    select.set("limit", exp.Limit(expression=exp.Literal.number(total)))
    return select


def _python_projection(analysis: Analysis) -> PythonProjection | None:
    tree = analysis.parsed.tree
    if not isinstance(tree, exp.Select) or analysis.aggregate or analysis.window_functions:
        return None
    for arg in ("distinct", "order", "limit", "offset", "group", "having", "qualify", "joins"):
        if tree.args.get(arg):
            return None
    ref = analysis.tables[0]
    where = tree.args.get("where")
    if where is None or not ref.consumed_all:
        return None
    if len(conjuncts(where.this)) != len(ref.conjuncts):
        return None
    items: list[tuple[str, str]] = []
    for item in tree.expressions:
        alias = None
        if isinstance(item, exp.Alias):
            alias, item = item.alias, item.this
        if isinstance(item, exp.Star):
            if any(item.args.get(a) for a in ("except_", "except", "replace", "rename")):
                return None  # * EXCLUDE / REPLACE / RENAME: DuckDB shapes the columns
            items += [(c, c) for c in ref.schema.column_names]
            continue
        if not isinstance(item, exp.Column) or isinstance(item.this, exp.Star):
            return None
        if len(item.parts) > 2 or (
            len(item.parts) == 2 and item.table.lower() != ref.alias.lower()
        ):
            return None
        found = resolve(item, analysis.tables)
        if found is None or found[0] is None:
            return None
        column = found[1]
        items.append((alias or column, column))
    whole = items == [(c, c) for c in ref.schema.column_names]
    return PythonProjection(tuple(items), ref.schema.window_column, whole)


def literal_int(tree: exp.Query, arg: str) -> int | bool | None:
    """The LIMIT/OFFSET value; None when absent, False when not a literal integer."""
    node = tree.args.get(arg)
    if node is None:
        return None
    value = node.expression
    if isinstance(value, exp.Literal) and not value.is_string and str(value.this).isdigit():
        return int(value.this)
    return False


def bare_fragment(alias: str, columns: tuple[str, ...]) -> exp.Select:
    """``SELECT <columns> FROM __sq_part AS alias``."""
    select = exp.Select(expressions=[exp.column(c, quoted=True) for c in columns])
    select.set("from_", exp.From(this=_relation(alias, PART)))
    return select


def key_page_queries(
    plan: Plan, access: KeyAccess, page_size: int, token: PageToken | None
) -> tuple[exp.Query, str, KeyAccess, int]:
    """``(final query, fragment SQL, access, rows wanted)`` of one key-ordered page.

    The fragment returns each partition's first rows after the token's key, in key order
    (``__sq_key``); the final query keeps the statement's filter and select list, orders by
    ``__sq_key`` and asks one row more than the page to learn whether more remain. The
    statement's OFFSET applies to the first page only; its LIMIT caps the pages' total.
    """
    table = plan.tables[0]
    tree = plan.final
    limit = literal_int(tree, "limit")
    offset = literal_int(tree, "offset")
    returned = token.returned if token is not None else 0
    skip = int(offset or 0) if token is None else 0
    want = page_size if limit is None or limit is False else min(page_size, int(limit) - returned)
    if want <= 0:
        return tree, "", access, 0
    lower = access.lower
    if token is not None and token.last_key is not None:
        after = token.last_key + b"\x00"  # the smallest key after the last one returned
        lower = after if lower is None else max(lower, after)
    access = replace(access, lower=lower)
    key = exp.column(KEY_COLUMN, quoted=True)
    fragment = (
        table.filter.copy()
        if table.filter is not None
        else bare_fragment(table.alias, table.columns)
    )
    fragment.set("expressions", [*fragment.expressions, key.copy()])
    fragment.set("order", exp.Order(expressions=[exp.Ordered(this=key.copy())]))
    fragment.set("limit", exp.Limit(expression=exp.Literal.number(skip + want + 1)))
    final = tree.copy()
    final.set(
        "expressions", [*final.expressions, exp.column(KEY_COLUMN, table=table.alias, quoted=True)]
    )
    final.set(
        "order",
        exp.Order(
            expressions=[exp.Ordered(this=exp.column(KEY_COLUMN, table=table.alias, quoted=True))]
        ),
    )
    final.set("limit", exp.Limit(expression=exp.Literal.number(want + 1)))
    final.set("offset", exp.Offset(expression=exp.Literal.number(skip)) if skip else None)
    return final, fragment.sql(dialect=DIALECT, copy=False), access, want


def with_versions(query: exp.Query, versions: dict[str, tuple[str, tuple[str, ...]]]) -> exp.Query:
    """``query`` with a CTE per relation read from versions: ``__sq_rN`` becomes the rows of
    ``raw`` valid at the batch in parameter ``$sq_bN`` (ahead of the statement's own CTEs,
    which may read it; see :mod:`sparkiq.sql.visible`)."""
    return with_ctes(
        query,
        {
            relation: rows_at(raw, columns, f"sq_b{relation[len('__sq_r') :]}")
            for relation, (raw, columns) in versions.items()
        },
    )
