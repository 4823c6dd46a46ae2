"""Aggregates as per-partition partials merged by the coordinator.

Aggregates decompose into per-partition partials merged by the final query: ``COUNT``
(``COUNT(*)``, ``COUNT(x)``) and ``SUM`` merge by ``SUM``, ``MIN``/``MAX`` by themselves,
``AVG`` ships ``SUM`` and ``COUNT``. Any other aggregate (``COUNT(DISTINCT)``, ``MEDIAN``,
``STDDEV``, ``STRING_AGG``, ``LIST``, ``BOOL_AND``...), ``GROUPING SETS``/``ROLLUP``/``CUBE``,
``QUALIFY`` and window functions make the fragments ship the filtered rows (only the
needed columns) and the final query aggregate them.

Merged outputs are cast back to the type the statement has over the rows themselves
(``SUM`` over partial ``SUM``s would widen ``HUGEINT`` to ``DECIMAL``), and keep their
output names, so a rewritten statement answers exactly like the original.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from sqlglot import exp

from sparkiq.sql.parse import DIALECT

__all__ = ["decompose"]

_SCALAR_TYPE = re.compile(r"^[A-Z]+( ?\(\d+, ?\d+\))?$")
_MERGE = {exp.Count: "SUM", exp.Sum: "SUM", exp.Min: "MIN", exp.Max: "MAX"}


def _group_expressions(select: exp.Select) -> list[exp.Expr] | None:
    group = select.args.get("group")
    if group is None:
        return []
    if any(group.args.get(k) for k in ("grouping_sets", "cube", "rollup", "totals")):
        return None
    aliases = {e.alias.lower(): e.this for e in select.expressions if isinstance(e, exp.Alias)}
    found: list[exp.Expr] = []
    for item in group.expressions:
        if isinstance(item, exp.Literal) and not item.is_string:
            position = int(item.this) - 1
            if not 0 <= position < len(select.expressions):
                return None
            target = select.expressions[position]
            found.append(target.this if isinstance(target, exp.Alias) else target)
        elif isinstance(item, exp.Column) and not item.table and item.name.lower() in aliases:
            found.append(aliases[item.name.lower()])
        else:
            found.append(item)
    return found


def decompose(
    select: exp.Select,
    fragment_for: Callable[[list[exp.Expr]], exp.Select],
    output_names: list[str] | None,
    output_types: list[str] | None,
) -> tuple[exp.Select, exp.Select] | None:
    """``(partial fragment, final query)`` for decomposable aggregates, else None."""
    if output_names is None or len(output_names) != len(select.expressions):
        return None
    if output_types is None or len(output_types) != len(output_names):
        return None
    groups = _group_expressions(select)
    if groups is None or select.args.get("qualify"):
        return None
    group_names = {g.sql(dialect=DIALECT): f"__g{i}" for i, g in enumerate(groups)}
    partials: list[exp.Expr] = [
        exp.alias_(g.copy(), name, quoted=True)
        for g, name in zip(groups, group_names.values(), strict=True)
    ]
    merges: dict[str, exp.Expr] = {}
    for agg in select.find_all(exp.AggFunc):
        text = agg.sql(dialect=DIALECT)
        if text in merges:
            continue
        if any(isinstance(n, exp.AggFunc) for n in agg.walk() if n is not agg):
            return None
        argument = agg.this
        if isinstance(argument, exp.Distinct) or agg.args.get("distinct"):
            return None
        name = f"__a{len(partials)}"
        if type(agg) in _MERGE:
            partials.append(exp.alias_(agg.copy(), name, quoted=True))
            merged: exp.Expr = exp.func(_MERGE[type(agg)], exp.column(name, quoted=True))
            if isinstance(agg, exp.Count):
                merged = exp.func("COALESCE", merged, exp.Literal.number(0))
                merged = exp.cast(merged, exp.DataType.build("BIGINT"))
        elif isinstance(agg, exp.Avg) and len(list(agg.expressions)) == 0:
            count = f"__a{len(partials) + 1}"
            partials.append(exp.alias_(exp.func("SUM", argument.copy()), name, quoted=True))
            partials.append(exp.alias_(exp.func("COUNT", argument.copy()), count, quoted=True))
            merged = exp.Div(
                this=exp.cast(
                    exp.func("SUM", exp.column(name, quoted=True)), exp.DataType.build("DOUBLE")
                ),
                expression=exp.func(
                    "NULLIF", exp.func("SUM", exp.column(count, quoted=True)), exp.Literal.number(0)
                ),
            )
        else:
            return None
        merges[text] = merged

    def rewrite(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.AggFunc):
            return merges[node.sql(dialect=DIALECT)].copy()
        if isinstance(node, exp.Expr) and not isinstance(node, exp.Alias | exp.Ordered):
            name = group_names.get(node.sql(dialect=DIALECT))
            if name is not None and not isinstance(node, exp.Literal):
                return exp.column(name, quoted=True)
        return node

    fragment = fragment_for(partials)
    if groups:
        fragment.set("group", exp.Group(expressions=[g.copy() for g in groups]))
    final = select.copy()
    final.set("where", None)
    items = []
    for item, wanted, kind in zip(final.expressions, output_names, output_types, strict=True):
        inner = item.this if isinstance(item, exp.Alias) else item
        if isinstance(inner, exp.Star):
            return None
        rewritten = inner.transform(rewrite)
        if rewritten.find(exp.AggFunc) is not None and _SCALAR_TYPE.match(kind):
            # merging partials can widen a type (SUM of HUGEINT partials is DECIMAL):
            # answer with the type the statement has over the rows themselves
            rewritten = exp.cast(rewritten, exp.DataType.build(kind, dialect=DIALECT))
        items.append(exp.alias_(rewritten, wanted, quoted=True))
    final.set("expressions", items)
    if groups:
        final.set(
            "group",
            exp.Group(expressions=[exp.column(n, quoted=True) for n in group_names.values()]),
        )
    for arg in ("having", "order"):
        node = final.args.get(arg)
        if node is not None:
            final.set(arg, node.transform(rewrite))
    if any(
        c.name not in set(group_names.values()) | {f"__a{i}" for i in range(len(partials))}
        and c.name.lower() not in {w.lower() for w in output_names}
        for c in final.find_all(exp.Column)
    ):
        return None  # a column outside aggregates and groups: let DuckDB judge the original
    return fragment, final
