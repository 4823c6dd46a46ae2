"""The Arrow Flight SQL endpoint: ADBC, JDBC and other Flight SQL clients run pull queries
on a node and get Arrow record batches with their types (docs/flight.md).

``server`` answers the calls (queries, prepared statements, catalog commands), ``auth``
says who a call comes from, ``tickets`` holds results until their ``DoGet``, ``catalog``
builds the metadata answers, ``params`` binds a prepared statement's parameters,
``errors`` makes the Flight errors and ``protocol`` holds the Flight SQL messages.
"""

from __future__ import annotations

from sparkiq.server.flight.server import FlightSqlServer

__all__ = ["FlightSqlServer"]
