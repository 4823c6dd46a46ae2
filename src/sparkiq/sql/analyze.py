"""Analysis: which tables a query reads, which of their columns, and which predicates can go
down to the stores.

A *simple* query is one ``SELECT`` over materialized tables joined with ``JOIN`` (no CTEs,
subqueries, set operations or lambdas). For simple queries every column is resolved here
(unknown names are refused with the closest candidates and their position), each table gets
the ``WHERE`` conjuncts that touch only it (never for the null-supplying side of an outer
join) and the key and window predicates among those become :class:`Term` values for the
planner. Other queries read every referenced table whole and let DuckDB resolve the rest.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlglot import exp

from sparkiq.error_codes import ErrorCode
from sparkiq.query.instant import instant_problem
from sparkiq.schema.arrowrows import PSEUDO_COLUMNS
from sparkiq.schema.types import TableSchema
from sparkiq.sql.errors import SqlUnknownNameError, SqlUnsupportedError, closest, snippet_at
from sparkiq.sql.parse import Parsed
from sparkiq.sql.source import QuerySource

__all__ = [
    "Analysis",
    "TableRef",
    "Term",
    "analyze",
    "conjuncts",
    "literal_like",
    "resolve",
    "stored_tables",
]

_COMPARE: dict[type[exp.Expr], str] = {
    exp.EQ: "=",
    exp.GT: ">",
    exp.GTE: ">=",
    exp.LT: "<",
    exp.LTE: "<=",
}
_FLIP = {"=": "=", ">": "<", ">=": "<=", "<": ">", "<=": ">="}


@dataclass(frozen=True, slots=True)
class Term:
    """A predicate on one key column (or window pseudo-column) with literal operands.

    ``op`` is ``=``, ``in``, ``>``, ``>=``, ``<`` or ``<=``; ``values`` are literal nodes
    (or ``:sqN`` placeholders); ``whole`` says the term (with its BETWEEN twin) is its
    entire conjunct, so a statement whose conjuncts are all whole terms is answered by the
    store access alone.
    """

    column: str
    op: str
    values: tuple[exp.Expr, ...]
    whole: bool


@dataclass(slots=True)
class TableRef:
    """One table reference of the query."""

    name: str
    alias: str
    schema: TableSchema
    node: exp.Table
    preserved: bool = True
    columns: set[str] = field(default_factory=set)
    conjuncts: list[exp.Expr] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    consumed_all: bool = False
    #: ``AS OF``: a batch id, a time (naive: local), or TEMPLATE_AS_OF for a shape's slot.
    as_of: int | dt.datetime | str | None = None

    def ordered_columns(self) -> list[str]:
        """Needed columns in schema order, then pseudo-columns; never empty."""
        names = [c for c in self.schema.column_names if c in self.columns]
        names += [p for p in PSEUDO_COLUMNS if p in self.columns]
        return names or [self.schema.key_columns[0]]


@dataclass(slots=True)
class Analysis:
    """What the planner needs to know about a parsed statement."""

    parsed: Parsed
    simple: bool
    tables: list[TableRef]
    aggregate: bool = False
    window_functions: bool = False
    output_aliases: set[str] = field(default_factory=set)


def literal_like(node: exp.Expr) -> bool:
    """A literal, a negated number, a boolean, a cast literal or a ``:sqN`` placeholder."""
    if isinstance(node, exp.Literal | exp.Boolean | exp.Placeholder):
        return True
    if isinstance(node, exp.Neg):
        return isinstance(node.this, exp.Literal | exp.Placeholder)
    if isinstance(node, exp.Cast):
        return isinstance(node.this, exp.Literal | exp.Placeholder)
    return False


def _from_table(select: exp.Select) -> exp.Expr | None:
    source = select.args.get("from_") or select.args.get("from")
    return source.this if source is not None else None


def _is_simple(tree: exp.Query) -> bool:
    if not isinstance(tree, exp.Select) or tree.args.get("with_") or tree.args.get("with"):
        return False
    if not isinstance(_from_table(tree), exp.Table):
        return False
    for join in tree.args.get("joins") or ():
        if not isinstance(join.this, exp.Table) or join.args.get("using"):
            return False
    for node in tree.walk():
        if node is not tree and isinstance(node, exp.Query | exp.Lambda | exp.Unnest):
            return False
        if isinstance(node, exp.Lateral | exp.Pivot):
            return False
    return True


def stored_tables(tree: exp.Expr) -> list[exp.Table]:
    """The table references of ``tree`` that DuckDB resolves in its catalog, in
    ``find_all`` order: every ``Table`` except those naming a CTE visible where they stand.

    This is the sandbox's name resolution: each of these must be a materialized table, so
    it has to agree with DuckDB exactly where that matters. A CTE is visible in the body of
    its query (subqueries included) and in the CTEs after it in the same ``WITH``, never
    outside its query, nor in itself, nor in earlier CTEs; a ``WITH RECURSIVE`` CTE whose
    body is a ``UNION [ALL]`` also sees itself in the recursive term, the union's last
    operand (its anchor, an ``EXCEPT`` or an ``INTERSECT`` read the catalog: measured on
    DuckDB). The nearest ``WITH`` is asked first, so inner CTEs shadow outer ones. Doubt
    errs towards "a table": an unknown table is refused, never read from the catalog.
    """
    return [t for t in tree.find_all(exp.Table) if not _names_visible_cte(t)]


def _names_visible_cte(table: exp.Table) -> bool:
    name = table.name.lower()
    path: set[int] = set()  # ids of the nodes from ``table`` up to the current one
    child: exp.Expr = table
    node = table.parent
    while node is not None:
        path.add(id(child))
        if isinstance(node, exp.With):
            ctes = node.expressions
            index = next(i for i, c in enumerate(ctes) if c is child)
            if any(c.alias_or_name.lower() == name for c in ctes[:index]):
                return True
            own = ctes[index]
            body = own.this
            if (
                node.args.get("recursive")
                and own.alias_or_name.lower() == name
                and type(body) is exp.Union
                and id(body.expression) in path
            ):
                return True
        elif not isinstance(node, exp.CTE):
            clause = node.args.get("with_") or node.args.get("with")
            if (
                isinstance(clause, exp.With)
                and child is not clause
                and any(c.alias_or_name.lower() == name for c in clause.expressions)
            ):
                return True
        child, node = node, node.parent
    return False


def analyze(parsed: Parsed, source: QuerySource, tables: Iterable[str]) -> Analysis:
    """Resolve tables and columns of ``parsed`` against ``source`` (see module doc)."""
    tree = parsed.tree
    known = list(tables)
    lowered = {t.lower(): t for t in known}
    refs: list[TableRef] = []
    for node in stored_tables(tree):
        name = node.name
        actual = lowered.get(name.lower())
        if actual is None:
            ident = node.this
            line, column = _position(ident)
            raise SqlUnknownNameError(
                f"unknown table {name!r}; tables: {sorted(known)}",
                code=ErrorCode.UNKNOWN_TABLE,
                field=name,
                candidates=closest(name, known),
                line=line,
                column=column,
                snippet=snippet_at(parsed.text, line, column),
            )
        ref = TableRef(actual, node.alias_or_name, source.schema(actual), node)
        ref.as_of = _as_of(node, parsed.text)
        refs.append(ref)
    stored = {id(r.node) for r in refs}
    for node in tree.find_all(exp.Table):
        if node.args.get("version") is not None and id(node) not in stored:
            raise SqlUnsupportedError(
                f"AS OF applies to materialized tables; {node.name!r} is not one",
                code=ErrorCode.UNSUPPORTED_AS_OF,
                field=node.name,
            )
    simple = _is_simple(tree)
    analysis = Analysis(parsed, simple, refs)
    if not simple:
        for ref in refs:
            ref.columns = set(ref.schema.column_names)
            if ref.schema.window_column is not None:
                ref.columns |= set(PSEUDO_COLUMNS)
        return analysis
    assert isinstance(tree, exp.Select)
    _mark_preserved(tree, refs)
    analysis.output_aliases = {
        e.alias.lower() for e in tree.expressions if isinstance(e, exp.Alias) and e.alias
    }
    _resolve_columns(tree, refs, analysis, parsed.text)
    analysis.window_functions = any(True for _ in tree.find_all(exp.Window))
    analysis.aggregate = bool(tree.args.get("group")) or any(
        not isinstance(a.parent, exp.Window) for a in tree.find_all(exp.AggFunc)
    )
    where = tree.args.get("where")
    if where is not None:
        for conjunct in conjuncts(where.this):
            owner = _owner(conjunct, refs, analysis)
            if owner is not None and owner.preserved:
                owner.conjuncts.append(conjunct)
                owner.terms.extend(_terms(conjunct, owner, refs))
    for ref in refs:
        ref.consumed_all = where is not None and all(
            any(t.whole for t in _terms(c, ref, refs)) for c in ref.conjuncts
        )
    return analysis


#: The ``as_of`` of a table in a statement shape: its batch is a literal bound later.
TEMPLATE_AS_OF = "template"


def _as_of(node: exp.Table, text: str) -> int | dt.datetime | str | None:
    """The batch or time of ``node``'s ``AS OF`` (None without one)."""
    version = node.args.get("version")
    if version is None:
        return None
    value = version.expression
    usage = (
        f"AS OF on {node.name!r} takes a batch id (AS OF 12) or a time "
        "(AS OF TIMESTAMP '2026-01-31 12:00:00')"
    )
    if str(version.args.get("kind", "")).upper() != "AS OF":
        raise SqlUnsupportedError(usage, code=ErrorCode.UNSUPPORTED_AS_OF, field=node.name)
    if isinstance(value, exp.Placeholder):
        return TEMPLATE_AS_OF
    if isinstance(value, exp.Literal) and not value.is_string:
        text_value = str(value.this)
        if not text_value.isdigit() or len(text_value) > 18:
            raise SqlUnsupportedError(
                f"{usage}; {text_value!r} is not a batch id",
                code=ErrorCode.BAD_AS_OF,
                field=node.name,
            )
        return int(text_value)
    if isinstance(value, exp.Cast) and isinstance(value.this, exp.Literal):
        if isinstance(value.this.this, exp.Placeholder):
            return TEMPLATE_AS_OF
        stamp = str(value.this.this)
        try:
            when = dt.datetime.fromisoformat(stamp)
        except ValueError:
            raise SqlUnsupportedError(
                f"{usage}; {stamp!r} is not a time (write it as 'YYYY-MM-DD HH:MM:SS')",
                code=ErrorCode.BAD_AS_OF,
                field=node.name,
            ) from None
        problem = instant_problem(when)
        if problem is not None:
            raise SqlUnsupportedError(
                f"AS OF on {node.name!r}: {problem}", code=ErrorCode.BAD_AS_OF, field=node.name
            )
        return when
    if isinstance(value, exp.Cast) and isinstance(value.this, exp.Placeholder):
        return TEMPLATE_AS_OF
    raise SqlUnsupportedError(usage, code=ErrorCode.UNSUPPORTED_AS_OF, field=node.name)


def _position(node: exp.Expr | None) -> tuple[int | None, int | None]:
    meta = node.meta if isinstance(node, exp.Identifier) else {}
    line, col = meta.get("line"), meta.get("col")
    if isinstance(col, int) and isinstance(node, exp.Identifier):
        col = col - len(node.name) + 1
    return line, col


def _mark_preserved(select: exp.Select, refs: list[TableRef]) -> None:
    """Tables on the null-supplying side of an outer join cannot take pushed predicates."""
    by_node = {id(r.node): r for r in refs}
    seen: list[TableRef] = []
    base = _from_table(select)
    if base is not None and id(base) in by_node:
        seen.append(by_node[id(base)])
    for join in select.args.get("joins") or ():
        ref = by_node.get(id(join.this))
        side = (join.side or "").upper()
        if side in ("RIGHT", "FULL"):
            for earlier in seen:
                earlier.preserved = False
        if ref is not None:
            ref.preserved = side not in ("LEFT", "FULL")
            seen.append(ref)


def _lookup(refs: list[TableRef], alias: str) -> TableRef | None:
    for ref in refs:
        if ref.alias.lower() == alias.lower():
            return ref
    return None


def _column_of(ref: TableRef, name: str) -> str | None:
    lowered = name.lower()
    for column in ref.schema.column_names:
        if column.lower() == lowered:
            return column
    if ref.schema.window_column is not None:
        for pseudo in PSEUDO_COLUMNS:
            if pseudo.lower() == lowered:
                return pseudo
    return None


def resolve(
    column: exp.Column, refs: list[TableRef]
) -> tuple[TableRef, str] | tuple[None, str] | None:
    """``(table, column name)`` for a column reference; ``(None, qualifier)`` when it is
    qualified by an unknown table; None when no table has it."""
    parts = [p.name for p in column.parts]
    if len(parts) > 1:
        ref = _lookup(refs, parts[0])
        if ref is not None:
            found = _column_of(ref, parts[1])
            return (ref, found) if found is not None else None
    for ref in refs:
        found = _column_of(ref, parts[0])
        if found is not None:
            return ref, found
    if len(parts) > 1 and len(parts) == 2:
        return None, parts[0]
    return None


def _resolve_columns(
    select: exp.Select, refs: list[TableRef], analysis: Analysis, text: str
) -> None:
    for item in select.expressions:
        star = item if isinstance(item, exp.Star) else None
        if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
            ref = _lookup(refs, item.table)
            if ref is not None:
                ref.columns |= set(ref.schema.column_names)
            continue
        if star is not None:
            for ref in refs:
                ref.columns |= set(ref.schema.column_names)
    for column in select.find_all(exp.Column):
        if isinstance(column.this, exp.Star):
            continue
        found = resolve(column, refs)
        if found is not None and found[0] is not None:
            found[0].columns.add(found[1])
            continue
        if column.name.lower() in analysis.output_aliases and not column.table:
            continue
        ident = column.this if isinstance(column.this, exp.Identifier) else None
        line, col = _position(ident)
        if found is not None:
            qualifier = found[1]
            names = [r.alias for r in refs]
            raise SqlUnknownNameError(
                f"unknown table or alias {qualifier!r} in {column.sql()}; the query names {names}",
                code=ErrorCode.UNKNOWN_TABLE,
                field=qualifier,
                candidates=closest(qualifier, names),
                line=line,
                column=col,
                snippet=snippet_at(text, line, col),
            )
        pool = [c for r in refs for c in r.schema.column_names]
        pool += [p for r in refs if r.schema.window_column for p in PSEUDO_COLUMNS]
        where = f" of {refs[0].name!r}" if len(refs) == 1 else ""
        raise SqlUnknownNameError(
            f"unknown column {column.sql()!r}; columns{where}: {pool}",
            code=ErrorCode.UNKNOWN_COLUMN,
            field=column.name,
            candidates=closest(column.name, pool + sorted(analysis.output_aliases)),
            line=line,
            column=col,
            snippet=snippet_at(text, line, col),
        )


def conjuncts(node: exp.Expr) -> list[exp.Expr]:
    """The operands of a tree of ``AND`` (parentheses looked through), left to right.

    Iterative: ``a AND b AND ...`` parses as a left-deep tree as deep as the statement is
    long, so recursion would fail on a few thousand conjuncts."""
    found: list[exp.Expr] = []
    pending = [node]
    while pending:
        current = pending.pop()
        if isinstance(current, exp.And):
            pending += [current.expression, current.this]
        elif isinstance(current, exp.Paren):
            pending.append(current.this)
        else:
            found.append(current)
    return found


def _owner(conjunct: exp.Expr, refs: list[TableRef], analysis: Analysis) -> TableRef | None:
    """The one table all columns of ``conjunct`` belong to, if it can be pushed there."""
    if any(conjunct.find_all(exp.AggFunc, exp.Window, exp.Query)):
        return None
    owner: TableRef | None = None
    for column in conjunct.find_all(exp.Column):
        found = resolve(column, refs)
        if found is None or found[0] is None:
            return None  # an output alias: only the final query knows it
        if owner is not None and found[0] is not owner:
            return None
        owner = found[0]
    if owner is None and len(refs) == 1:
        owner = refs[0]
    return owner


def _terms(conjunct: exp.Expr, ref: TableRef, refs: list[TableRef]) -> list[Term]:
    keyish = set(ref.schema.key_columns)
    if ref.schema.window_column is not None:
        keyish |= set(PSEUDO_COLUMNS)

    def key_column(node: exp.Expr) -> str | None:
        if not isinstance(node, exp.Column):
            return None
        found = resolve(node, refs)
        if found is None or found[0] is not ref or found[1] not in keyish:
            return None
        return found[1]

    for kind, op in _COMPARE.items():
        if type(conjunct) is kind:
            left, right = conjunct.this, conjunct.expression
            column = key_column(left)
            if column is not None and literal_like(right):
                return [Term(column, op, (right,), True)]
            column = key_column(right)
            if column is not None and literal_like(left):
                return [Term(column, _FLIP[op], (left,), True)]
            return []
    if isinstance(conjunct, exp.In) and not conjunct.args.get("query"):
        column = key_column(conjunct.this)
        values = tuple(conjunct.expressions)
        if column is not None and values and all(literal_like(v) for v in values):
            return [Term(column, "in", values, True)]
    if isinstance(conjunct, exp.Between):
        column = key_column(conjunct.this)
        low, high = conjunct.args.get("low"), conjunct.args.get("high")
        if (
            column is not None
            and low is not None
            and high is not None
            and literal_like(low)
            and literal_like(high)
        ):
            return [Term(column, ">=", (low,), True), Term(column, "<=", (high,), True)]
    return []
