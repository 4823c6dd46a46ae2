"""Spellings of push and pull statements that every push-query judge must agree on: the
pull engine (``Node.sql``), push subscriptions (``Node.stream``), ``POST /query`` and DDL.

Each is a template over ``{columns}`` (one or more column names) and ``{table}``."""

from __future__ import annotations

PUSH = [
    "SELECT {columns} FROM {table} EMIT CHANGES",
    "SELECT {columns} FROM {table} EMIT  CHANGES",
    "SELECT {columns} FROM {table}\tEMIT\tCHANGES",
    "SELECT {columns} FROM {table}\nEMIT\n\n  CHANGES\n",
    "select {columns} from {table} emit changes;",
    "SELECT {columns} FROM {table} Emit Changes ;  \n",
    "SELECT {columns} FROM {table} EMIT CHANGES; -- live",
    "SELECT {columns} FROM {table} EMIT CHANGES -- live\n",
    "SELECT {columns} FROM {table} EMIT /* every change */ CHANGES",
    "SELECT {columns} FROM {table} EMIT CHANGES /* done */ ;",
    "SELECT {columns}, 'EMIT CHANGES' AS note FROM {table} EMIT CHANGES",
]

PULL = [
    "SELECT {columns} FROM {table}",
    "SELECT {columns} FROM {table};",
    "SELECT {columns} FROM {table} -- EMIT CHANGES",
    "SELECT {columns} FROM {table} /* EMIT CHANGES */",
    "SELECT {columns} FROM {table} -- EMIT\n",
    "SELECT {columns}, 'EMIT CHANGES' AS note FROM {table}",
    "SELECT {columns}, 'x EMIT CHANGES' AS emit FROM {table}",
]


def spell(template: str, columns: str, table: str) -> str:
    return template.format(columns=columns, table=table)
