"""The Postgres wire protocol endpoint: psql, psycopg, pg8000, asyncpg and BI tools run pull
queries on a node (docs/postgres.md).

``listener`` accepts connections, ``session`` speaks the protocol of one (framing by the
``pygwire`` codec), ``catalog`` decides what a statement is answered with, ``types`` maps
result columns to Postgres types, ``statements`` splits and binds statement text and
``errors`` gives SQLSTATE codes.
"""

from __future__ import annotations

from sparkiq.server.pg.listener import PgServer

__all__ = ["PgServer"]
