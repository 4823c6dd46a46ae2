"""Read-your-writes over the Postgres endpoint: session settings that bound every read.

A client that cannot put a bound in a request sets it on its connection instead:

* ``SET sparkiq.after = 'orders:3:1041'``: the records a producer sent, as
  ``topic:partition:offset`` items separated by commas (see
  :meth:`~sparkiq.PositionBound.after`); each later statement waits, bounded, until the
  tables it reads have applied them, or fails with ``NOT_UP_TO_BOUND``;
* ``SET sparkiq.bound = 'p1....'``: a position token from an earlier answer (REST, Client).

Both hold until ``RESET`` (or another ``SET``) and combine when both are set. Values are
checked when set, so a typo fails the ``SET``, not a later query.
"""

from __future__ import annotations

from collections.abc import Mapping

from sparkiq.error_codes import ErrorCode
from sparkiq.query.position import Position, PositionBound
from sparkiq.sql.errors import SqlError

__all__ = ["AFTER", "BOUND", "check_setting", "session_bound"]

AFTER = "sparkiq.after"
BOUND = "sparkiq.bound"

# A producer's batch, not a log: the highest offset of each partition is enough.
_MAX_AFTER_ITEMS = 10_000


def check_setting(name: str, value: str) -> None:
    """Refuse a ``sparkiq.*`` setting this endpoint does not know, or a value it cannot
    read (:class:`~sparkiq.sql.errors.SqlError` naming the setting and the form)."""
    if name == AFTER:
        _after(value)
    elif name == BOUND:
        _bound(value)
    elif name.startswith("sparkiq."):
        raise SqlError(
            f'unrecognized configuration parameter "{name}": sparkiq knows {AFTER} '
            f"('topic:partition:offset,...') and {BOUND} (a position token)",
            code=ErrorCode.UNKNOWN_SETTING,
        )


def session_bound(settings: Mapping[str, str]) -> PositionBound | None:
    """The bound a connection's settings put on its reads (None: unbounded)."""
    after, token = settings.get(AFTER), settings.get(BOUND)
    bound = None if not token else _bound(token)
    if after:
        produced = _after(after)
        bound = produced if bound is None else bound.merge(produced)
    return bound


def _after(value: str) -> PositionBound:
    items = [item.strip() for item in value.split(",") if item.strip()]
    form = f"expected {AFTER} = 'topic:partition:offset[,topic:partition:offset...]'"
    if not items:
        raise SqlError(f"{form}, got an empty value", code=ErrorCode.INVALID_PARAMETER_VALUE)
    if len(items) > _MAX_AFTER_ITEMS:
        raise SqlError(
            f"{AFTER} names {len(items)} records; at most {_MAX_AFTER_ITEMS} (the highest "
            "offset of each partition is enough)",
            code=ErrorCode.INVALID_PARAMETER_VALUE,
        )
    acks = []
    for item in items:
        topic, _, rest = item.rpartition(":")
        topic, _, partition = topic.rpartition(":")
        if not topic or not partition.isdigit() or not rest.isdigit():
            raise SqlError(f"{form}, got {item!r}", code=ErrorCode.INVALID_PARAMETER_VALUE)
        acks.append((topic, int(partition), int(rest)))
    return PositionBound.after(*acks)


def _bound(token: str) -> PositionBound:
    try:
        return PositionBound.at(Position.from_token(token))
    except ValueError as exc:
        raise SqlError(f"{BOUND}: {exc}", code=ErrorCode.INVALID_PARAMETER_VALUE) from None
