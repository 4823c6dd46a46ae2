"""Output column names as Postgres gives them, for select items the statement leaves unnamed.

DuckDB names an unaliased expression after its text (``count_star()``, ``sum(n)``,
``CAST(n AS INTEGER)``, ``(n + 1)``); psql, BI tools and dataframes expect Postgres' names,
and the Postgres endpoint serves the names ``Node.sql`` returns. So every ``SELECT`` of a
statement (subqueries and CTEs too: ``SELECT * FROM (SELECT count(*) FROM t)`` is named
``count`` in Postgres) gets an explicit alias on each item that is not a plain column, a
star or already aliased, following Postgres' rules (``FigureColname``):

===============================================  ======================================
item                                             name
===============================================  ======================================
a function or aggregate call (``count(*)``,      the function's name as written,
``sum(n)``, ``upper(k)``), also under ``OVER``   lowercased: ``count``, ``sum``, ``upper``
a cast (``n::int``, ``CAST(n AS INTEGER)``)      the name of what is cast (``n``); of a
                                                 literal, the type (``'1'::int`` ->
                                                 ``int4``, ``DATE '...'`` -> ``date``)
a subscript (``tags[1]``)                        the subscripted item's name
``CASE``, ``EXISTS``, ``ARRAY[...]``             ``case``, ``exists``, ``array``
a scalar subquery                                its one output column's name
anything else (literals, operators ``n + 1``)    ``?column?``
===============================================  ======================================

Postgres allows duplicate output names; a result here is rows of dicts, so a generated name
that repeats an earlier output name gets a suffix (``count``, ``count_1``). Names the
statement gives (columns, aliases) are never changed. The rules depend on the tree alone, so
a statement and its shape (literals as placeholders) are named alike.
"""

from __future__ import annotations

import re

from sqlglot import exp

__all__ = ["UNNAMED", "name_outputs", "output_name"]

#: Postgres' name for an item it cannot name.
UNNAMED = "?column?"

_LEADING_NAME = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(")
# What Postgres names the types a literal is cast to (its internal type names)
_TYPE_NAMES = {
    "INT": "int4", "INTEGER": "int4", "BIGINT": "int8", "SMALLINT": "int2", "TINYINT": "int2",
    "DOUBLE": "float8", "FLOAT": "float4", "REAL": "float4", "DECIMAL": "numeric",
    "BOOLEAN": "bool", "VARCHAR": "varchar", "TEXT": "text", "TIMESTAMPTZ": "timestamptz",
}  # fmt: skip
# Postgres' own names of functions sqlglot renames on the way through
_FUNCTION_NAMES = {"substring": "substr"}


def name_outputs(tree: exp.Expr) -> None:
    """Alias, in place, every unnamed non-column item of every ``SELECT`` in ``tree``."""
    for select in list(tree.find_all(exp.Select)):
        taken = {_given_name(item) for item in select.expressions} - {None}
        items = []
        changed = False
        for item in select.expressions:
            star = isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            )
            if star or _given_name(item) is not None:  # t.* is a star too
                items.append(item)
                continue
            base = output_name(item)
            name, n = base, 0
            while name.lower() in taken:
                n += 1
                name = f"{base}_{n}"
            taken.add(name.lower())
            items.append(exp.alias_(item, name, quoted=True))
            changed = True
        if changed:
            select.set("expressions", items)


def _given_name(item: exp.Expr) -> str | None:
    """The name the statement itself gives ``item`` (an alias or a column), lowercased."""
    if isinstance(item, exp.Alias):
        return item.alias.lower()
    if isinstance(item, exp.Column) and not isinstance(item.this, exp.Star):
        return item.name.lower()
    return None


def output_name(item: exp.Expr) -> str:
    """Postgres' name for the select item ``item`` (see the module doc)."""
    name = _figure(item)
    return name if name is not None else UNNAMED


def _figure(node: exp.Expr) -> str | None:
    """The name of ``node``, or None when Postgres would fall back to ``?column?``."""
    if isinstance(node, exp.Alias):
        return node.alias
    if isinstance(node, exp.Column):
        return node.name if not isinstance(node.this, exp.Star) else None
    if isinstance(node, exp.Paren):
        return _figure(node.this)
    if isinstance(node, exp.Cast):  # TryCast too
        inner = _figure(node.this)
        if inner is not None:
            return inner
        kind = node.to.this
        text = kind.value if isinstance(kind, exp.DataType.Type) else str(kind)
        return _TYPE_NAMES.get(text.upper(), text.lower())
    if isinstance(node, exp.Bracket):
        return _figure(node.this)
    if isinstance(node, exp.Window | exp.Filter | exp.IgnoreNulls | exp.RespectNulls):
        return _figure(node.this)
    if isinstance(node, exp.WithinGroup):
        return _figure(node.this)
    if isinstance(node, exp.Subquery):
        inner = node.this
        if isinstance(inner, exp.Select) and len(inner.expressions) == 1:
            return _figure(inner.expressions[0])
        return None
    if isinstance(node, exp.Case):
        return "case"
    if isinstance(node, exp.Exists):
        return "exists"
    if isinstance(node, exp.Array):
        return "array"
    if isinstance(node, exp.Anonymous):
        return str(node.name).lower()
    if isinstance(node, exp.Func):
        return _function_name(node)
    return None


def _function_name(node: exp.Func) -> str:
    """A known function's name: as DuckDB spells it back (sqlglot keeps no trace of the
    spelling written, and DuckDB's spelling is the one its users write), else sqlglot's."""
    found = _LEADING_NAME.match(node.sql(dialect="duckdb"))
    name = found.group(1).lower() if found is not None else node.sql_name().lower()
    return _FUNCTION_NAMES.get(name, name)
