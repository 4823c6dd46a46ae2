"""Postgres array values in catalog queries, as DuckDB lists.

Tools pass a set of values to a catalog query as one array: pgcli binds a Python list
(``c.relkind = ANY(%s)``), pgspecial inlines it as ``ANY('{r,p,f}')``, others write
``'{r,v}'::text[]`` or ``ARRAY['r', 'v']``. Postgres reads the text form ``{a,b,"c d"}``
by the type the context wants; DuckDB knows only its list literal ``['a', 'b']`` and
cannot cast a string to a list. So:

- a text-format parameter whose declared type is an array (:data:`ARRAY_ELEMENTS`) is
  bound as ``'{...}'::ELEMENT[]`` (:func:`array_parameter`), as a client would write it;
- :func:`list_literals` turns ``'{...}'::TYPE[]`` and ``ANY('{...}')`` in a catalog query
  into DuckDB list literals (``ARRAY[...]`` DuckDB reads itself).
"""

from __future__ import annotations

import re

__all__ = ["ARRAY_ELEMENTS", "array_parameter", "list_literals"]

#: Array type OIDs a client may declare for a parameter -> the element type's name.
ARRAY_ELEMENTS = {
    1000: "bool",
    1002: "char",
    1003: "name",
    1005: "int2",
    1007: "int4",
    1009: "text",
    1014: "bpchar",
    1015: "varchar",
    1016: "int8",
    1021: "float4",
    1022: "float8",
    1028: "oid",
    1231: "numeric",
}
_NUMBERS = frozenset({"int2", "int4", "int8", "oid", "float4", "float8", "numeric", "smallint"})
_NUMBERS |= {"integer", "int", "bigint", "real", "double precision", "regclass", "regtype"}


def array_parameter(text: str, oid: int) -> str:
    """The literal of a text-format array parameter of type ``oid`` (an ``ARRAY_ELEMENTS``
    key): ``{r,p}`` -> ``'{r,p}'::text[]``."""
    return "'" + text.replace("'", "''") + f"'::{ARRAY_ELEMENTS[oid]}[]"


# '{...}'::TYPE[] (TYPE may be qualified or quoted: "char") and ANY('{...}') (untyped:
# Postgres takes the element type from the other side; strings compare with DuckDB's).
_TYPED = re.compile(
    r"'(\{(?:[^']|'')*\})'\s*::\s*(?:pg_catalog\s*\.\s*)?(\"?[A-Za-z_][A-Za-z0-9_ ]*?\"?)"
    r"\s*\[\s*\]",
    re.I,
)
_ANY = re.compile(r"\b(ANY|ALL)\s*\(\s*'(\{(?:[^']|'')*\})'\s*\)", re.I)
_ELEMENT = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([^,]+))')
_UNQUOTE = re.compile(r"\\(.)")


def _elements(body: str) -> list[str | None]:
    """The elements of a one-dimensional array's text form ``{...}`` (NULL is None)."""
    out: list[str | None] = []
    for match in _ELEMENT.finditer(body[1:-1].replace("''", "'")):
        if match[1] is not None:
            out.append(_UNQUOTE.sub(r"\1", match[1]))
        elif (item := match[2].strip()).upper() == "NULL":
            out.append(None)
        else:
            out.append(item)
    return out


def _list(body: str, element_type: str) -> str:
    """``{a,b}`` as a DuckDB list literal of ``element_type``'s values."""
    number = element_type.strip('"').lower() in _NUMBERS
    items = []
    for item in _elements(body):
        if item is None:
            items.append("NULL")
        elif number and re.fullmatch(r"[-+]?[0-9.eE+-]+", item):
            items.append(item)
        else:
            items.append("'" + item.replace("'", "''") + "'")
    return "[" + ", ".join(items) + "]"


def list_literals(text: str) -> str:
    """``text`` with Postgres array literals written as DuckDB lists (see the module)."""
    text = _TYPED.sub(lambda m: _list(m[1], m[2]), text)
    return _ANY.sub(lambda m: f"{m[1]}({_list(m[2], 'text')})", text)
