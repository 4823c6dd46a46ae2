"""What ``GET /stats`` and ``GET /stores`` report: documents built from the node's own state,
limited to the tables the caller may read (their JSON shapes are in docs/rest.md)."""

from __future__ import annotations

import time
from typing import Any

from sparkiq.principals import readable
from sparkiq.server.metrics import Metrics
from sparkiq.server.scrub import scrub
from sparkiq.server.served import ServedNode

__all__ = ["stats_document", "stores_document"]


def stats_document(node: ServedNode, metrics: Metrics, roots: tuple[str, ...]) -> dict[str, Any]:
    """``GET /stats``: what the console's query-rate charts, restore bars, Kafka sources
    and writers show."""
    doc: dict[str, Any] = {"node_id": node.node_id}
    visible = set(readable(node.tables))
    metrics.sample()
    now = time.time()  # one clock reading: the queries' and the gauges' buckets are the same
    doc.update(metrics.query_rate.series(visible, now=now))
    # the charts' other series, per table and bucket: lag, freshness, the writer's input rate
    doc["gauges"] = metrics.gauges.series(visible, now=now)["tables"]
    doc["partitions"] = [
        {
            "store": s.table,
            "partition": s.partition,
            "state": s.state,
            "batch_id": s.batch_id,
            "latest_batch_id": s.latest_batch_id,
            "lag_batches": s.lag_batches,
            "lag_seconds": s.lag_seconds,
            "restored_rows": s.restored_rows,
            "restored_bytes": s.restored_bytes,
            "eta_seconds": s.eta_seconds,
            "error": None if s.error is None else scrub(s.error, roots),
        }
        for s in node.status()
        if s.table in visible
    ]
    # the table view's Kafka sources: a cache the node's Kafka thread refreshes
    doc["kafka"] = [k.to_dict() for k in node.kafka_sources() if k.table in visible]
    # the table view's followed topic: its lag and malformed records, never blocking
    doc["topics"] = [t.to_dict() for t in node.followed_topics() if t.table in visible]
    # the table view's writer: each table's writer status record, from the node's cache
    doc["writers"] = [w.to_dict() for w in node.writers() if w.table in visible]
    return doc


def stores_document(node: ServedNode) -> dict[str, Any]:
    """``GET /stores``: the tables the caller may read, their keys, schemas, partitions and
    history."""
    out = []
    for name in readable(node.tables):  # a principal learns only of what it may read
        schema = node.schema(name)
        out.append(
            {
                "name": name,
                "key_columns": list(schema.key_columns),
                "window_column": schema.window_column,
                "partitions": node.partition_count(name),
                "schema": schema.spark_json(),
            }
        )
        history = getattr(node, "history", None)  # followers and nodes; not in tests' fakes
        if history is not None:
            out[-1]["history"] = history(name)
    return {"stores": out}
