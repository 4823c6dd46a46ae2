"""The Postgres wire protocol endpoint: psql, psycopg, pg8000, asyncpg and BI tools run pull
queries on a node (docs/postgres.md).

``listener`` accepts connections (and routes cancel requests), ``session`` speaks the
protocol of one (framing by the ``pygwire`` codec), ``catalog`` decides what a statement
is answered with, ``pgcatalog`` is the emulated ``pg_catalog``/``information_schema``,
``translate`` turns a client's catalog query into one on it (and walls it in), ``types``
maps result columns to Postgres types, ``statements`` splits and reads statement text,
``parameters`` binds a Bind's values into it and ``errors`` gives SQLSTATE codes. What a
client may cost is :class:`~sparkiq.limits.PgLimits` (a node's ``pg_limits``).
"""

from __future__ import annotations

from sparkiq.server.pg.listener import PgServer

__all__ = ["PgServer"]
