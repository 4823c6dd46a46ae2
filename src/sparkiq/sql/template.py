"""Plan templates: one plan per statement *shape*, bound to each statement's literals.

A shape is a statement with its literals replaced by ``:sqN`` placeholders
(:func:`~sparkiq.sql.parse.shape_of`). The engine plans a shape once and, for every later
statement of that shape, binds the literals into the template instead of parsing and
planning again. Binding puts each literal back where it was, as a literal of the same text,
so the bound plan is the statement's own plan.

A template is only kept when binding it to the literals of the statement it was made from
reproduces that statement's plan exactly (final SQL, every fragment, projection, paging).
Shapes whose placeholders would change meaning or pushdown (``LIMIT``/``OFFSET`` values
pushed as top-N, ``GROUP BY 1``, aggregates whose output names depend on literals, type
parameters) fail that check, and statements of those shapes are planned from their text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from decimal import Decimal
from typing import Any

from sqlglot import exp

from sparkiq.sql.plan import Plan, digest_of

__all__ = ["bind_template", "same_plan"]


def _literal(value: Any) -> exp.Expr:
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, int | Decimal) and not isinstance(value, bool):
        return exp.Literal.number(str(value))
    raise TypeError(f"not a shape literal: {value!r}")


def _bind_tree(tree: Any, params: Sequence[Any]) -> Any:
    if tree is None:
        return None

    def put(node: exp.Expr) -> exp.Expr:
        if isinstance(node, exp.Placeholder):
            return _literal(params[int(str(node.name)[2:])])
        return node

    return tree.transform(put)


def bind_template(template: Plan, params: Sequence[Any], text: str) -> Plan:
    """The plan of ``text``, a statement of the template's shape with literals ``params``."""
    tables = tuple(
        replace(t, fragment=_bind_tree(t.fragment, params), filter=_bind_tree(t.filter, params))
        for t in template.tables
    )
    return Plan(
        text,
        digest_of(text),
        tables,
        _bind_tree(template.final, params),
        template.joins,
        template.aggregation,
        template.python,
        template.key_paging,
        template.explain,
        _bind_tree(template.whole, params),
    )


def same_plan(bound: Plan, plan: Plan) -> bool:
    """Whether a bound template and a statement's own plan are the same plan."""
    if (bound.final_sql, bound.python, bound.key_paging, bound.joins, bound.aggregation) != (
        plan.final_sql,
        plan.python,
        plan.key_paging,
        plan.joins,
        plan.aggregation,
    ) or len(bound.tables) != len(plan.tables):
        return False
    for mine, theirs in zip(bound.tables, plan.tables, strict=True):
        if (mine.name, mine.alias, mine.columns, mine.top_n) != (
            theirs.name,
            theirs.alias,
            theirs.columns,
            theirs.top_n,
        ):
            return False
        if mine.fragment_sql != theirs.fragment_sql:
            return False
        filters = [None if t.filter is None else t.filter.sql() for t in (mine, theirs)]
        if filters[0] != filters[1] or len(mine.terms) != len(theirs.terms):
            return False
    return True
