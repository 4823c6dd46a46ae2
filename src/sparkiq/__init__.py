"""sparkiq: interactive queries over the live state of PySpark Structured Streaming pipelines.

The public API is what this module exports (see ``__all__``) and :mod:`sparkiq.testing`;
every other module is private and may change. Importing sparkiq has no side effects, starts
no JVM and does not import pyspark.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sparkiq._version import __version__
from sparkiq.exports import lazy_exports

#: Where each public name lives; importing sparkiq imports none of these modules (see
#: sparkiq.exports): ``sparkiq --help`` or a client-only script loads only what it uses.
_HOMES: dict[str, tuple[str, ...]] = {
    "sparkiq.client": ("Client",),
    "sparkiq.serving.attach": ("Attached", "attach"),
    "sparkiq.serving.config": ("NodeConfig",),
    "sparkiq.serving.follower": ("Follower", "follow"),
    "sparkiq.serving.topic": ("FollowedTopic", "follow_topic"),
    "sparkiq.serving.metadata": ("HostInfo", "KeyQueryMetadata", "NodeMetadata"),
    "sparkiq.errors": (
        "AuthenticationError",
        "ChangelogError",
        "ConfigError",
        "CorruptSegmentError",
        "ErrorCode",
        "ForbiddenError",
        "InvalidQueryError",
        "LayoutMismatchError",
        "NodeUnreachableError",
        "ReadOnlyError",
        "SchemaError",
        "SparkiqError",
        "StoreError",
        "UnknownStoreError",
    ),
    "sparkiq.limits": ("AuthPolicy", "HttpLimits", "PgLimits"),
    "sparkiq.node": ("Node",),
    "sparkiq.query": (
        "FailureReason",
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
    ),
    "sparkiq.schema.partitioner": ("partition_for", "spark_hash"),
    "sparkiq.spark": ("register_data_source",),
    "sparkiq.spark.app": ("App", "Table"),
    "sparkiq.spark.lookup": ("enrich",),
    "sparkiq.sql": (
        "QuerySource",
        "SqlEngine",
        "SqlError",
        "SqlLimitError",
        "SqlLimits",
        "SqlPartitionError",
        "SqlResult",
        "SqlSyntaxError",
        "SqlUnknownNameError",
        "SqlUnsupportedError",
    ),
    "sparkiq.sql.change": ("Change",),
    "sparkiq.sql.push": ("SubscriptionHub",),
    "sparkiq.stores.dispatch": ("QueryContext", "register"),
    "sparkiq.stores.partition": ("PartitionStore",),
}
__all__ = [
    "App",
    "Attached",
    "AuthPolicy",
    "AuthenticationError",
    "Change",
    "ChangelogError",
    "Client",
    "ConfigError",
    "CorruptSegmentError",
    "ErrorCode",
    "FailureReason",
    "ForbiddenError",
    "FollowedTopic",
    "Follower",
    "HostInfo",
    "HttpLimits",
    "InvalidQueryError",
    "KeyQuery",
    "KeyQueryMetadata",
    "LayoutMismatchError",
    "MultiVersionedKeyQuery",
    "Node",
    "NodeConfig",
    "NodeMetadata",
    "NodeUnreachableError",
    "PartitionStore",
    "PgLimits",
    "Position",
    "PositionBound",
    "Query",
    "QueryContext",
    "QueryResult",
    "QuerySource",
    "RangeQuery",
    "ReadOnlyError",
    "ResultOrder",
    "RowIterator",
    "SchemaError",
    "SparkiqError",
    "SqlEngine",
    "SqlError",
    "SqlLimitError",
    "SqlLimits",
    "SqlPartitionError",
    "SqlResult",
    "SqlSyntaxError",
    "SqlUnknownNameError",
    "SqlUnsupportedError",
    "StateQueryRequest",
    "StateQueryResult",
    "StoreError",
    "SubscriptionHub",
    "Table",
    "UnknownStoreError",
    "VersionedKeyQuery",
    "VersionedRecord",
    "WindowKeyQuery",
    "WindowRangeQuery",
    "__version__",
    "attach",
    "enrich",
    "follow",
    "follow_topic",
    "partition_for",
    "register",
    "register_data_source",
    "spark_hash",
]

if TYPE_CHECKING:
    # What type checkers and editors see; tests/test_package.py keeps these imports,
    # _HOMES and __all__ naming the same things.
    from sparkiq.client import Client
    from sparkiq.errors import (
        AuthenticationError,
        ChangelogError,
        ConfigError,
        CorruptSegmentError,
        ErrorCode,
        ForbiddenError,
        InvalidQueryError,
        LayoutMismatchError,
        NodeUnreachableError,
        ReadOnlyError,
        SchemaError,
        SparkiqError,
        StoreError,
        UnknownStoreError,
    )
    from sparkiq.limits import AuthPolicy, HttpLimits, PgLimits
    from sparkiq.node import Node
    from sparkiq.query import (
        FailureReason,
        KeyQuery,
        MultiVersionedKeyQuery,
        Position,
        PositionBound,
        Query,
        QueryResult,
        RangeQuery,
        ResultOrder,
        RowIterator,
        StateQueryRequest,
        StateQueryResult,
        VersionedKeyQuery,
        VersionedRecord,
        WindowKeyQuery,
        WindowRangeQuery,
    )
    from sparkiq.schema.partitioner import partition_for, spark_hash
    from sparkiq.serving.attach import Attached, attach
    from sparkiq.serving.config import NodeConfig
    from sparkiq.serving.follower import Follower, follow
    from sparkiq.serving.metadata import HostInfo, KeyQueryMetadata, NodeMetadata
    from sparkiq.serving.topic import FollowedTopic, follow_topic
    from sparkiq.spark import register_data_source
    from sparkiq.spark.app import App, Table
    from sparkiq.spark.lookup import enrich
    from sparkiq.sql import (
        QuerySource,
        SqlEngine,
        SqlError,
        SqlLimitError,
        SqlLimits,
        SqlPartitionError,
        SqlResult,
        SqlSyntaxError,
        SqlUnknownNameError,
        SqlUnsupportedError,
    )
    from sparkiq.sql.change import Change
    from sparkiq.sql.push import SubscriptionHub
    from sparkiq.stores.dispatch import QueryContext, register
    from sparkiq.stores.partition import PartitionStore
else:
    __getattr__, __dir__ = lazy_exports(__name__, _HOMES)
