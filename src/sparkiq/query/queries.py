"""The typed queries a store can answer.

Each query is a small immutable value built with a named constructor
(``KeyQuery.with_key("AA")``). A store answers a query through the handler registered for
the query's type (see :mod:`sparkiq.stores.dispatch`), so new query types can be added
without touching existing ones: subclass :class:`Query` and register a handler.

Keys are Python values as PySpark returns them: a scalar for a one-column key, a tuple in
key-column order for a composite key. Range bounds are inclusive and ordered by the key's
natural order (numbers numerically, strings by code point, nulls first), never by bytes.
"""

from __future__ import annotations

import datetime as dt
import enum
from dataclasses import dataclass, replace
from typing import Any

__all__ = [
    "KeyQuery",
    "Query",
    "RangeQuery",
    "ResultOrder",
    "WindowKeyQuery",
    "WindowRangeQuery",
]


class ResultOrder(enum.Enum):
    """Order of a range query's results by key."""

    ANY = "any"
    ASCENDING = "ascending"
    DESCENDING = "descending"


class Query:
    """Base of every query type. Subclasses must be immutable and hashable values.

    ``single_key`` says whether a query addresses exactly one key, which lets a router send
    it to that key's partition only; :meth:`routing_key` returns the key then. ``combine``
    says whether a node may answer several partitions of it together (one answer, carried by
    the first of them: :func:`~sparkiq.stores.dispatch.register_combiner`), which lets a
    router send one sub-request per node instead of one per partition.
    """

    __slots__ = ()

    single_key: bool = False
    combine: bool = False

    def routing_key(self) -> Any:
        raise TypeError(f"{type(self).__name__} does not address a single key")


@dataclass(frozen=True, slots=True)
class KeyQuery(Query):
    """The current row of one key, or ``None`` when the key is absent."""

    key: Any

    single_key = True

    @staticmethod
    def with_key(key: Any) -> KeyQuery:
        return KeyQuery(key)

    def routing_key(self) -> Any:
        return self.key


@dataclass(frozen=True, slots=True)
class RangeQuery(Query):
    """``(key, row)`` pairs with ``lower <= key <= upper``; a ``None`` bound is open.

    Results are an iterator that must be consumed or closed; with ``ResultOrder.ANY`` (the
    default) each partition's results are ascending, but partitions are not interleaved.
    """

    lower: Any = None
    upper: Any = None
    has_lower: bool = False
    has_upper: bool = False
    order: ResultOrder = ResultOrder.ANY

    @staticmethod
    def with_range(lower: Any, upper: Any) -> RangeQuery:
        return RangeQuery(lower, upper, True, True)

    @staticmethod
    def with_lower_bound(lower: Any) -> RangeQuery:
        return RangeQuery(lower, None, True, False)

    @staticmethod
    def with_upper_bound(upper: Any) -> RangeQuery:
        return RangeQuery(None, upper, False, True)

    @staticmethod
    def with_no_bounds() -> RangeQuery:
        return RangeQuery()

    def with_result_order(self, order: ResultOrder) -> RangeQuery:
        if not isinstance(order, ResultOrder):
            raise TypeError(f"with_result_order() takes a ResultOrder, got {order!r}")
        return replace(self, order=order)


@dataclass(frozen=True, slots=True)
class WindowKeyQuery(Query):
    """Every window of one key whose start lies in ``[time_from, time_to]`` (inclusive).

    Only windowed tables answer it; results are ``((key, window_start), row)`` pairs in
    ascending window start order.
    """

    key: Any
    time_from: dt.datetime | None = None
    time_to: dt.datetime | None = None

    single_key = True

    def __post_init__(self) -> None:
        _check_window_starts(self.time_from, self.time_to)

    @staticmethod
    def with_key_and_window_starts(
        key: Any, time_from: dt.datetime | None, time_to: dt.datetime | None
    ) -> WindowKeyQuery:
        return WindowKeyQuery(key, time_from, time_to)

    @staticmethod
    def with_key(key: Any) -> WindowKeyQuery:
        return WindowKeyQuery(key)

    def routing_key(self) -> Any:
        return self.key


@dataclass(frozen=True, slots=True)
class WindowRangeQuery(Query):
    """Every window of every key (optionally of one key) whose start is in the time range.

    Results are ``((key, window_start), row)`` pairs, ascending by key then window start
    within a partition.
    """

    time_from: dt.datetime | None = None
    time_to: dt.datetime | None = None

    def __post_init__(self) -> None:
        _check_window_starts(self.time_from, self.time_to)

    @staticmethod
    def with_window_starts(
        time_from: dt.datetime | None, time_to: dt.datetime | None
    ) -> WindowRangeQuery:
        return WindowRangeQuery(time_from, time_to)


def _check_window_starts(*bounds: object) -> None:
    """Window bounds are datetimes (queries also arrive from the network)."""
    for name, bound in zip(("time_from", "time_to"), bounds, strict=True):
        if bound is not None and not isinstance(bound, dt.datetime):
            shown = repr(bound)
            raise TypeError(
                f"{name} must be a datetime.datetime or None, got {type(bound).__name__} "
                f"{shown if len(shown) <= 40 else shown[:37] + '...'}"
            )
