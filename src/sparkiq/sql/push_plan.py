"""Push query statements: parse and compile ``SELECT ... FROM t [WHERE ...] EMIT CHANGES``.

:func:`plan_push_query` turns a statement into a :class:`PushPlan`: the table it reads, its
output columns, and two closures over a decoded row dict, ``predicate`` (the WHERE; None
without one) and ``project`` (the SELECT list). Contracts:

* The closures are pure and thread-safe: the hub evaluates one statement once per batch and
  shares the result between the subscriptions running it, so they must be deterministic.
* The WHERE follows SQL three-valued logic: None is unknown, a comparison with NULL is
  unknown, and ``predicate(row)`` is True only for rows whose WHERE is True.
* Only what :data:`SUPPORTED` lists compiles; anything else, a malformed statement, an
  unknown column or mismatched operand types raise :class:`PushQueryError` (an
  :class:`~sparkiq.errors.InvalidQueryError`) whose message quotes the offending SQL and
  says what is supported. Compilation happens once, when the query is subscribed.

Subscriptions and the hub that runs plans are in :mod:`sparkiq.sql.subscription` and
:mod:`sparkiq.sql.push`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlglot
from sqlglot import exp

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import InvalidQueryError
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType, TableSchema
from sparkiq.sql.limits import SqlLimits
from sparkiq.sql.parse import check_nesting, too_deep
from sparkiq.sql.statement import emit_changes_at

__all__ = ["SUPPORTED", "PushPlan", "PushQueryError", "like_matcher", "plan_push_query"]

_DEFAULT_LIMITS = SqlLimits()

Row = dict[str, Any]
Fn = Callable[[Row], Any]


class PushQueryError(InvalidQueryError):
    """A push query statement is malformed or uses what push queries do not support."""

    code = ErrorCode.PUSH_QUERY_INVALID


# -- statement analysis -----------------------------------------------------------------------

SUPPORTED = (
    "a push query selects *, columns or expressions (each may be named with AS) from one "
    "table, optionally filtered by a WHERE, and ends with EMIT CHANGES, e.g. SELECT k, n * 2 "
    "AS twice FROM t WHERE n > 10 EMIT CHANGES; expressions may use comparisons, "
    "AND/OR/NOT, IN (...), BETWEEN, IS [NOT] NULL, [I]LIKE, + - * / %, ||, "
    "COALESCE/UPPER/LOWER/LENGTH/ABS and struct fields"
)
#: ISO text -> value, by the evaluator kind of dates ("date") and timestamps ("ts")
_PARSE = {k.push: k.temporal.parse for k in KINDS.values() if k.temporal and k.push}
_COMPARE: dict[type[exp.Expression], Callable[[Any, Any], bool]] = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
}


def _int_mod(a: Any, b: Any) -> Any:
    r = abs(a) % abs(b)
    return r if a >= 0 else -r


_ARITH: dict[type[exp.Expression], Callable[[Any, Any], Any]] = {
    exp.Add: lambda a, b: a + b,
    exp.Sub: lambda a, b: a - b,
    exp.Mul: lambda a, b: a * b,
    exp.Div: lambda a, b: None if b == 0 else a / b,
    exp.Mod: lambda a, b: None if b == 0 else _int_mod(a, b),
    exp.DPipe: lambda a, b: f"{a}{b}",
}
_FUNCS: dict[type[exp.Expression], Callable[[Any], Any]] = {
    exp.Upper: str.upper,
    exp.Lower: str.lower,
    exp.Length: len,
    exp.Abs: abs,
}


_MAX_NUMBER_CHARS = 100  # any SQL number type fits, with sign, point and exponent


def _truth(value: Any) -> bool | None:
    return None if value is None else bool(value)


@dataclass(frozen=True)
class PushPlan:
    """A compiled push query: ``predicate(row)`` (None: no WHERE) is True for matching
    rows; ``project(row)`` gives the output row with ``columns`` in order."""

    statement: str
    table: str
    columns: tuple[str, ...]
    predicate: Fn | None
    project: Fn


def plan_push_query(
    text: str,
    resolve: Callable[[str], tuple[str, TableSchema]],
    limits: SqlLimits | None = None,
) -> PushPlan:
    """Parse and compile ``text``; raises :class:`PushQueryError` saying what is supported.

    ``resolve(name)`` gives a table's exact name and schema (SQL names are case-insensitive).
    ``limits`` (a node's ``sql_limits``, as pull queries; default: the defaults) bounds the
    statement's length: a longer one raises :class:`~sparkiq.sql.errors.SqlLimitError`
    before it is read.
    """
    if not isinstance(text, str):
        raise PushQueryError(f"a push query is a SQL string, got {type(text).__name__}")
    (_DEFAULT_LIMITS if limits is None else limits).check_statement(text)
    emit = emit_changes_at(text)
    if emit is None:
        raise PushQueryError(
            f"not a push query: {text.strip()[:80]!r} does not end with EMIT CHANGES (for a "
            "query that returns the current rows once, run a pull query with sql())"
        )
    check_nesting(text[:emit])
    try:
        tree = sqlglot.parse_one(text[:emit])
    except RecursionError:  # deep without parentheses (NOT NOT NOT ...)
        raise too_deep() from None
    except sqlglot.errors.ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        raise PushQueryError(
            f"cannot parse push query at line {first.get('line')}, column {first.get('col')}: "
            f"{first.get('description', exc)}"
        ) from None
    if not isinstance(tree, exp.Select):
        raise PushQueryError(f"{SUPPORTED}; got a {type(tree).__name__.upper()} statement")
    source = tree.args.get("from_") or tree.args.get("from")
    extra = sorted(k for k, v in tree.args.items() if v and k not in ("expressions", "where"))
    extra = [k for k in extra if k not in ("from", "from_")]
    if extra or source is None or not isinstance(source.this, exp.Table):
        what = ", ".join(k.upper() for k in extra) or "a FROM clause naming one table"
        raise PushQueryError(f"{SUPPORTED}; this statement has {what}")
    table_node = source.this
    if table_node.args.get("db") or table_node.args.get("catalog"):
        raise PushQueryError(f"{SUPPORTED}; name the table without a schema: {table_node.sql()}")
    table, schema = resolve(table_node.name)
    names = {table.lower()} | ({table_node.alias.lower()} if table_node.alias else set())
    compiler = _Compiler(schema, names)
    where = tree.args.get("where")
    try:
        predicate = None if where is None else compiler.predicate(where.this)
        columns, project = compiler.projection(tree.expressions)
    except RecursionError:  # a chain of thousands of ANDs is a tree that deep
        raise too_deep() from None
    return PushPlan(" ".join(text.split()), table, columns, predicate, project)


class _Compiler:
    """Compiles sqlglot expressions into closures over a row dict (SQL three-valued logic:
    None is unknown; comparisons with NULL are unknown; WHERE keeps rows that are True)."""

    def __init__(self, schema: TableSchema, table_names: set[str]) -> None:
        self.schema = schema
        self.table_names = table_names
        self.columns = {n.lower(): n for n in schema.column_names}

    def projection(self, items: list[exp.Expression]) -> tuple[tuple[str, ...], Fn]:
        outputs: list[tuple[str, Fn | None]] = []
        for item in items:
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                outputs += [(n, None) for n in self.schema.column_names]
                continue
            node = item.this if isinstance(item, exp.Alias) else item
            fn, _ = self.expr(node)
            if isinstance(item, exp.Alias):
                name = item.alias
            elif isinstance(node, exp.Column):
                name = self._resolve(node)[1][-1]
            else:
                name = node.sql()
            outputs.append((name, fn))
        columns = tuple(n for n, _ in outputs)
        dupes = sorted({n for n in columns if columns.count(n) > 1})
        if dupes:
            raise PushQueryError(f"duplicate output column names {dupes}: give them aliases")
        if columns == self.schema.column_names and all(f is None for _, f in outputs):
            return columns, dict
        getters = [(n, f if f is not None else _getter(n)) for n, f in outputs]
        return columns, lambda row: {n: f(row) for n, f in getters}

    def predicate(self, node: exp.Expression) -> Fn:
        fn, _ = self.expr(node)
        return lambda row: fn(row) is True

    def _resolve(self, node: exp.Column) -> tuple[DataType, list[str]]:
        parts = [p.name for p in node.parts]
        if len(parts) > 1 and parts[0].lower() in self.table_names:
            parts = parts[1:]
        column = self.columns.get(parts[0].lower())
        if column is None:
            raise PushQueryError(
                f"unknown column {node.sql()!r}; columns are {list(self.schema.column_names)}"
            )
        dtype, path = self.schema.field(column).type, [column]
        for name in parts[1:]:
            found = [f for f in dtype.fields if f.name.lower() == name.lower()]
            if not found:
                raise PushQueryError(f"{'.'.join(path)!r} has no field {name!r} ({node.sql()})")
            dtype = found[0].type
            path.append(found[0].name)
        return dtype, path

    def expr(self, node: exp.Expression) -> tuple[Fn, str | None]:
        """``(closure, kind)``; kind is str/num/bool/date/ts/bytes, or None when unknown."""
        if isinstance(node, exp.Paren):
            return self.expr(node.this)
        if isinstance(node, exp.Column):
            dtype, path = self._resolve(node)
            spark = KINDS.get(dtype.name)
            return _path_getter(path), None if spark is None else spark.push
        if isinstance(node, exp.Literal | exp.Boolean | exp.Null | exp.Cast):
            value, kind = _constant(node)
            return (lambda row: value), kind
        if type(node) in _COMPARE:
            return self._compare(node, _COMPARE[type(node)]), "bool"
        if isinstance(node, exp.And | exp.Or):
            return self._logic(node), "bool"
        if isinstance(node, exp.Not):
            inner, _ = self.expr(node.this)

            def negate(row: Row) -> Any:
                value = _truth(inner(row))
                return None if value is None else not value

            return negate, "bool"
        if isinstance(node, exp.Is):
            left, _ = self.expr(node.this)
            right, _ = self.expr(node.expression)
            return (lambda row: left(row) is right(row)), "bool"
        if isinstance(node, exp.In):
            return self._in(node), "bool"
        if isinstance(node, exp.Between):
            low = exp.GTE(this=node.this, expression=node.args["low"])
            high = exp.LTE(this=node.this, expression=node.args["high"])
            return self._logic(exp.And(this=low, expression=high)), "bool"
        if isinstance(node, exp.Like | exp.ILike):
            return self._like(node), "bool"
        if type(node) in _ARITH:
            return self._arith(node, _ARITH[type(node)])
        if isinstance(node, exp.Neg):
            inner, kind = self.expr(node.this)
            return (lambda row: None if (v := inner(row)) is None else -v), kind
        if type(node) in _FUNCS:
            inner, kind = self.expr(node.this)
            func = _FUNCS[type(node)]
            return _null_safe(inner, func), ("num" if isinstance(node, exp.Length) else kind)
        if isinstance(node, exp.Coalesce):
            fns = [self.expr(n)[0] for n in [node.this, *node.expressions]]
            return (lambda row: next((v for f in fns if (v := f(row)) is not None), None)), None
        raise PushQueryError(f"{node.sql()!r} is not supported: {SUPPORTED}")

    def _operands(self, node: exp.Expression) -> tuple[Fn, Fn]:
        (left, lk), (right, rk) = self.expr(node.this), self.expr(node.expression)
        if lk in ("date", "ts") and rk == "str" and isinstance(node.expression, exp.Literal):
            right, rk = _temporal(node.expression, lk)
        if rk in ("date", "ts") and lk == "str" and isinstance(node.this, exp.Literal):
            left, lk = _temporal(node.this, rk)
        if lk and rk and lk != rk and not {lk, rk} <= {"date", "ts"}:
            raise PushQueryError(
                f"cannot compare {node.this.sql()} ({lk}) with {node.expression.sql()} ({rk}) "
                f"in {node.sql()!r}: cast or quote one side"
            )
        return left, right

    def _compare(self, node: exp.Expression, op: Callable[[Any, Any], bool]) -> Fn:
        left, right = self._operands(node)

        def compare(row: Row) -> Any:
            a, b = left(row), right(row)
            if a is None or b is None:
                return None
            try:
                return op(a, b)
            except TypeError:  # e.g. date vs timestamp: unknown, the row does not match
                return None

        return compare

    def _logic(self, node: exp.And | exp.Or) -> Fn:
        (left, _), (right, _) = self.expr(node.this), self.expr(node.expression)
        stop = not isinstance(node, exp.And)  # AND stops at False, OR at True

        def logic(row: Row) -> Any:
            a = _truth(left(row))
            if a is stop:
                return stop
            b = _truth(right(row))
            if b is stop:
                return stop
            return None if a is None or b is None else not stop

        return logic

    def _in(self, node: exp.In) -> Fn:
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            raise PushQueryError(f"IN takes a list of values in push queries: {node.sql()!r}")
        left, _ = self.expr(node.this)
        options = [
            self._operands(exp.EQ(this=node.this, expression=o))[1] for o in node.expressions
        ]

        def member(row: Row) -> Any:
            value = left(row)
            if value is None:
                return None
            found = [o(row) for o in options]
            return True if value in found else (None if None in found else False)

        return member

    def _like(self, node: exp.Like | exp.ILike) -> Fn:
        pattern = node.expression
        if not (isinstance(pattern, exp.Literal) and pattern.is_string):
            raise PushQueryError(f"LIKE takes a string literal pattern: {node.sql()!r}")
        fold = isinstance(node, exp.ILike)
        matches = like_matcher(pattern.this.lower() if fold else pattern.this)
        left, _ = self.expr(node.this)
        if fold:
            return _null_safe(left, lambda v: matches(str(v).lower()))
        return _null_safe(left, lambda v: matches(str(v)))

    def _arith(self, node: exp.Expression, op: Callable[[Any, Any], Any]) -> tuple[Fn, str | None]:
        (left, lk), (right, rk) = self.expr(node.this), self.expr(node.expression)
        if isinstance(node, exp.DPipe):
            return _null_safe2(left, right, op), "str"
        if {lk, rk} - {"num", None}:
            raise PushQueryError(f"arithmetic needs numbers: {node.sql()!r} ({lk}, {rk})")
        return _null_safe2(left, right, op), "num"


def like_matcher(pattern: str) -> Callable[[str], bool]:
    """A function telling whether a whole string matches the LIKE ``pattern`` (``%`` any
    run of characters, ``_`` one character, everything else itself), without backtracking.

    A pattern without ``_`` splits at ``%`` into literal pieces: the first must start the
    string, the last end it, and the middle ones are found leftmost-first in order, which
    is exact for ``%`` and reads the string once (``str.find`` does not backtrack). With
    ``_``, the pattern runs as a bit-parallel automaton (one bit per pattern position, all
    positions advanced together per character): ``O(len(value) * len(pattern) / 64)``.
    Either way the cost is bounded by the lengths, never exponential as a regex from
    ``%a%a%a%a%b`` would be.
    """
    while "%%" in pattern:
        pattern = pattern.replace("%%", "%")
    if "_" in pattern:
        return _like_automaton(pattern)
    pieces = pattern.split("%")
    if len(pieces) == 1:
        return lambda value: value == pattern
    first, middle, last = pieces[0], pieces[1:-1], pieces[-1]
    fixed = len(first) + len(last)

    def matches(value: str) -> bool:
        if len(value) < fixed or not value.startswith(first) or not value.endswith(last):
            return False
        at, end = len(first), len(value) - len(last)
        for piece in middle:
            found = value.find(piece, at, end)
            if found < 0:
                return False
            at = found + len(piece)
        return True

    return matches


def _like_automaton(pattern: str) -> Callable[[str], bool]:
    """Shift-And over the pattern's positions: bit ``i`` set means the first ``i`` tokens
    match the text read so far. A ``%`` token (never two in a row) may match nothing, so
    a state before it also enters the state after it; after a ``%`` the state stays put on
    any character."""
    size = len(pattern)
    any_char = 0  # bit i + 1 for each '_' token i
    percent = 0  # bit i + 1 for each '%' token i
    by_char: dict[str, int] = {}
    for i, token in enumerate(pattern):
        bit = 1 << (i + 1)
        if token == "_":
            any_char |= bit
        elif token == "%":
            percent |= bit
        else:
            by_char[token] = by_char.get(token, 0) | bit
    masks = {c: m | any_char for c, m in by_char.items()}
    accept = 1 << size

    def closure(states: int) -> int:
        return states | ((states << 1) & percent)

    start = closure(1)

    def matches(value: str) -> bool:
        states = start
        for char in value:
            states = closure(((states << 1) & masks.get(char, any_char)) | (states & percent))
            if not states:
                return False
        return bool(states & accept)

    return matches


def _getter(name: str) -> Fn:
    return lambda row: row[name]


def _path_getter(path: list[str]) -> Fn:
    if len(path) == 1:
        return _getter(path[0])

    def get(row: Row) -> Any:
        value: Any = row
        for name in path:
            if value is None:
                return None
            value = value[name]
        return value

    return get


def _null_safe(fn: Fn, op: Callable[[Any], Any]) -> Fn:
    return lambda row: None if (v := fn(row)) is None else op(v)


def _null_safe2(left: Fn, right: Fn, op: Callable[[Any, Any], Any]) -> Fn:
    def apply(row: Row) -> Any:
        a, b = left(row), right(row)
        return None if a is None or b is None else op(a, b)

    return apply


def _constant(node: exp.Expression) -> tuple[Any, str | None]:
    if isinstance(node, exp.Null):
        return None, None
    if isinstance(node, exp.Boolean):
        return bool(node.this), "bool"
    if isinstance(node, exp.Literal):
        if node.is_string:
            return node.this, "str"
        text = str(node.this)
        if len(text) > _MAX_NUMBER_CHARS:  # before int(), whose cost grows with the digits
            raise PushQueryError(
                f"the number {text[:20]}... has {len(text)} characters; push queries take "
                f"numbers of at most {_MAX_NUMBER_CHARS}"
            )
        return (int(text) if text.lstrip("-").isdigit() else float(text)), "num"
    if isinstance(node, exp.Cast) and isinstance(node.this, exp.Literal) and node.this.is_string:
        for kind, name in (("date", "date"), ("ts", "timestamp")):
            if node.to.is_type(name):
                return _temporal(node.this, kind)[0]({}), kind
    raise PushQueryError(f"{node.sql()!r} is not supported: {SUPPORTED}")


def _temporal(literal: exp.Literal, kind: str) -> tuple[Fn, str]:
    try:
        value = _PARSE[kind](literal.this)
    except ValueError:
        raise PushQueryError(f"{literal.sql()} is not an ISO {kind} literal") from None
    return (lambda row: value), kind
