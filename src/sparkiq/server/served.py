"""What the HTTP server serves: the node's methods it calls, as a protocol.

The server sits below the :class:`~sparkiq.Node` facade (which starts it), so it names what
it needs here instead of importing the node.
"""

from __future__ import annotations

from typing import Any, Protocol

from sparkiq.changelog.replica import ReplicaStatus
from sparkiq.cluster.nodeauth import Opened
from sparkiq.principals import Principal
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import StateQueryResult
from sparkiq.schema.types import TableSchema
from sparkiq.serving.kafka_lag import KafkaSource
from sparkiq.serving.lookup import KeyLocation
from sparkiq.serving.metadata import KeyQueryMetadata, NodeMetadata
from sparkiq.serving.writer_view import WriterView
from sparkiq.sql import SqlResult
from sparkiq.sql.push import Subscription
from sparkiq.topics.lag import TopicLag

__all__ = ["ServedNode", "no_tables_warning"]


class ServedNode(Protocol):
    """A node as the REST API, the node protocol and the metrics endpoint use it."""

    node_id: str

    @property
    def tables(self) -> list[str]: ...

    def schema(self, store: str) -> TableSchema: ...

    def partition_count(self, store: str) -> int: ...

    def locate_key(self, store: str, key: Any) -> KeyLocation: ...

    def read_located(
        self, location: KeyLocation, store: str, key: Any
    ) -> tuple[dict[str, Any] | None, Position]: ...

    def query_local(
        self, request: StateQueryRequest, *, catch_up_wait: float = ...
    ) -> StateQueryResult[Any]: ...

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]: ...

    def sql(self, text: str, **options: Any) -> SqlResult: ...

    def sql_here(self, text: str, *, page_size: int | None = None) -> SqlResult | None: ...

    @property
    def source_wait(self) -> float: ...

    def sources_read(self, store: str, bound: PositionBound) -> bool: ...

    def stream(self, text: str, **options: Any) -> Subscription: ...

    def status(self) -> list[ReplicaStatus]: ...

    def is_ready(self) -> bool: ...

    def kafka_sources(self) -> list[KafkaSource]: ...

    def followed_topics(self) -> list[TopicLag]: ...

    def writers(self) -> list[WriterView]: ...

    def metadata_for_key(self, store: str, key: Any) -> KeyQueryMetadata: ...

    def all_metadata(self) -> list[NodeMetadata]: ...

    def check_token(self, token: str | None) -> Principal | None: ...

    def principal_named(self, name: str | None) -> Principal | None: ...

    def admit_node(
        self, header: str | None, method: str, path: str, body: bytes, peer: str | None
    ) -> Opened | None: ...

    def sign_reply(self, request_mac: str | None, body: bytes) -> str | None: ...

    def on_heartbeat(self, doc: dict[str, Any]) -> dict[str, Any]: ...

    def on_probe(self, doc: dict[str, Any]) -> dict[str, Any]: ...

    def on_probe_req(self, doc: dict[str, Any]) -> dict[str, Any]: ...


def no_tables_warning(state_dir: str | None) -> str:
    """What ``sparkiq serve`` (at start, on stderr and in its log) and ``GET /readyz`` say
    while a node serves no table: most often a mistyped ``--state-dir``. Not an error: a
    writer may not have materialized its first table yet, and the node discovers it then."""
    where = f"state_dir {state_dir!r}" if state_dir else "its state_dir"
    return (
        f"no tables are served: {where} holds no materialized table (yet); check the path "
        "(it is the directory a writer's sparkiq.materialize() writes into), or start the "
        "writer: tables are discovered as they appear"
    )
