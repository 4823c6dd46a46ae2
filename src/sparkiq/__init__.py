"""sparkiq: interactive queries over the live state of PySpark Structured Streaming pipelines.

The public API is what this module exports (see ``__all__``); everything else is private.
Importing sparkiq has no side effects and does not start a JVM.
"""

from __future__ import annotations

from sparkiq._version import __version__
from sparkiq.client import Client
from sparkiq.cluster.follower import Follower, follow
from sparkiq.cluster.metadata import HostInfo, KeyQueryMetadata, NodeMetadata
from sparkiq.cluster.node import Node
from sparkiq.errors import (
    AuthenticationError,
    ChangelogError,
    ConfigError,
    CorruptSegmentError,
    InvalidQueryError,
    LayoutMismatchError,
    NodeUnreachableError,
    ReadOnlyError,
    SchemaError,
    SparkiqError,
    StoreError,
    UnknownStoreError,
)
from sparkiq.query import (
    FailureReason,
    KeyQuery,
    Position,
    PositionBound,
    Query,
    QueryResult,
    RangeQuery,
    ResultOrder,
    RowIterator,
    StateQueryRequest,
    StateQueryResult,
    WindowKeyQuery,
    WindowRangeQuery,
)
from sparkiq.schema.partitioner import partition_for, spark_hash
from sparkiq.spark.app import App, Table
from sparkiq.sql import SqlError, SqlLimits, SqlResult
from sparkiq.stores.dispatch import QueryContext, register

__all__ = [
    "App",
    "AuthenticationError",
    "Client",
    "ChangelogError",
    "ConfigError",
    "CorruptSegmentError",
    "FailureReason",
    "Follower",
    "HostInfo",
    "InvalidQueryError",
    "KeyQuery",
    "KeyQueryMetadata",
    "LayoutMismatchError",
    "Node",
    "NodeMetadata",
    "NodeUnreachableError",
    "Position",
    "PositionBound",
    "Query",
    "QueryContext",
    "QueryResult",
    "RangeQuery",
    "ReadOnlyError",
    "ResultOrder",
    "RowIterator",
    "SchemaError",
    "SparkiqError",
    "SqlError",
    "SqlLimits",
    "SqlResult",
    "StateQueryRequest",
    "StateQueryResult",
    "StoreError",
    "Table",
    "UnknownStoreError",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "__version__",
    "follow",
    "partition_for",
    "register",
    "spark_hash",
]
