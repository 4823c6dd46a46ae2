"""The query model: typed queries, requests, per-partition results and positions.

Pure Python; imports nothing from the rest of sparkiq except :mod:`sparkiq.errors`.
"""

from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import (
    KeyQuery,
    Query,
    RangeQuery,
    ResultOrder,
    WindowKeyQuery,
    WindowRangeQuery,
)
from sparkiq.query.request import InStore, StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, RowIterator, StateQueryResult
from sparkiq.query.versioned import MultiVersionedKeyQuery, VersionedKeyQuery, VersionedRecord

__all__ = [
    "FailureReason",
    "InStore",
    "KeyQuery",
    "MultiVersionedKeyQuery",
    "Position",
    "PositionBound",
    "Query",
    "QueryResult",
    "RangeQuery",
    "ResultOrder",
    "RowIterator",
    "StateQueryRequest",
    "StateQueryResult",
    "VersionedKeyQuery",
    "VersionedRecord",
    "WindowKeyQuery",
    "WindowRangeQuery",
]
