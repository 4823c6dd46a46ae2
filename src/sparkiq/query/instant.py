"""Times a query reads at (``as_of``, ``AS OF TIMESTAMP``, version ranges): which datetimes
are instants a node can place.

A datetime names an instant once its offset is applied (a naive one is local time, as
PySpark shows timestamps). Nodes place an instant among commit times as a POSIX timestamp,
and back as a UTC datetime, so an instant must survive both: its UTC form must fall within
years 1 to 9999 (``0001-01-01 00:00:00+14:00`` is in year 0 in UTC, ``9999-12-31
23:59:59-14:00`` in year 10000). Callers check at parse (REST, SQL) and when a query object
is built, so an out-of-range time is the caller's error with a message, never a fault
deep in a lookup.
"""

from __future__ import annotations

import datetime as dt

__all__ = ["instant_problem"]


def instant_problem(when: dt.datetime) -> str | None:
    """Why ``when`` is no instant a node can place, or None when it is one."""
    try:
        utc = when.astimezone(dt.UTC)
        dt.datetime.fromtimestamp(utc.timestamp(), dt.UTC)
    except (OverflowError, ValueError, OSError):
        offset = "its offset" if when.tzinfo is not None else "the node's time zone"
        return (
            f"{when.isoformat()} is out of range: a time must fall between "
            f"0001-01-01 and 9999-12-31 in UTC once {offset} is applied"
        )
    return None
