"""Prometheus metrics of one node (its own registry, so several nodes fit in one process),
the recent query rate per table (:class:`QueryRate`) and the recent history of its gauges
(:class:`~sparkiq.server.history.GaugeHistory`) that the console charts."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sparkiq.pools import pool_limits
from sparkiq.server.history import GaugeHistory, gauges_of
from sparkiq.server.process_memory import process_memory
from sparkiq.server.request_counts import RequestCounts
from sparkiq.server.served import ServedNode
from sparkiq.sql.watchdog import statement_counts
from sparkiq.stores.rocksdb_options import rocksdb_memory

__all__ = ["Metrics", "QueryRate"]


def _pool(thread_name: str) -> str:
    """The pool a thread belongs to: its name without a pool's ``_<n>`` suffix."""
    head, _, tail = thread_name.rpartition("_")
    return head if head and tail.isdigit() else thread_name


class _ReplicaCollector:
    """Per-partition replica state, read from the node at scrape time."""

    def __init__(self, node: ServedNode, membership_bytes: dict[str, int]) -> None:
        self._node = node
        self._membership_bytes = membership_bytes  # Metrics.membership_message's counts

    def collect(self) -> Iterator[Metric]:
        batch = GaugeMetricFamily(
            "sparkiq_replica_batch_id", "Last batch applied", labels=["store", "partition"]
        )
        lag = GaugeMetricFamily(
            "sparkiq_replica_lag_batches",
            "Committed batches not applied yet",
            labels=["store", "partition"],
        )
        lag_s = GaugeMetricFamily(
            "sparkiq_replica_lag_seconds",
            "Age of the newest committed batch not applied yet",
            labels=["store", "partition"],
        )
        state = GaugeMetricFamily(
            "sparkiq_replica_state",
            "1 for the partition's current state (live, restoring, error)",
            labels=["store", "partition", "state"],
        )
        for s in self._node.status():
            labels = [s.table, str(s.partition)]
            batch.add_metric(labels, s.batch_id)
            lag.add_metric(labels, s.lag_batches)
            lag_s.add_metric(labels, s.lag_seconds)
            state.add_metric([*labels, s.state], 1)
        yield from (batch, lag, lag_s, state)
        threads = GaugeMetricFamily(
            "sparkiq_threads",
            "Live threads of this process by pool (a pool's threads end with _<n>)",
            labels=["pool"],
        )
        pools: dict[str, int] = {}
        for thread in threading.enumerate():
            pools[_pool(thread.name)] = pools.get(_pool(thread.name), 0) + 1
        for pool, count in sorted(pools.items()):
            threads.add_metric([pool], count)
        yield threads
        limits = GaugeMetricFamily(
            "sparkiq_thread_pool_limit",
            "Most threads a pool may have (its idle threads end after a while)",
            labels=["pool"],
        )
        for pool, limit in sorted(pool_limits().items()):
            limits.add_metric([pool], limit)
        yield limits
        memory = GaugeMetricFamily(
            "sparkiq_rocksdb_memory_bytes",
            "Memory the replicas' RocksDB stores hold, of memory they share (all stores of the"
            " process share one block cache and one memtable budget)",
            labels=["part"],
        )
        memory_limit = GaugeMetricFamily(
            "sparkiq_rocksdb_memory_limit_bytes",
            "The bound of each part of sparkiq_rocksdb_memory_bytes",
            labels=["part"],
        )
        for part, (used, limit) in sorted(rocksdb_memory().items()):
            memory.add_metric([part], used)
            memory_limit.add_metric([part], limit)
        yield from (memory, memory_limit)
        process = GaugeMetricFamily(
            "sparkiq_process_memory_bytes",
            "This process's memory by part: resident (RSS), malloc_in_use and malloc_free_held"
            " (the C allocator's chunks in use, and freed ones it keeps), arrow (Arrow's pool)",
            labels=["part"],
        )
        for part, size in sorted(process_memory().items()):
            process.add_metric([part], size)
        yield process
        running, interrupted = statement_counts()
        statements = GaugeMetricFamily(
            "sparkiq_sql_statements_running", "DuckDB statements (SQL and fragments) running"
        )
        statements.add_metric([], running)
        stopped = CounterMetricFamily(
            "sparkiq_sql_statements_interrupted",
            "DuckDB statements interrupted: past the statement timeout, over the memory "
            "budget, or canceled because their caller left",
            labels=["reason"],
        )
        for reason, count in sorted(interrupted.items()):
            stopped.add_metric([reason], count)
        yield from (statements, stopped)
        coordinator = getattr(self._node, "coordinator", None)
        if coordinator is not None:
            members = GaugeMetricFamily("sparkiq_cluster_live_members", "Live members seen")
            members.add_metric([], len(coordinator.membership.live()))
            forwarded = GaugeMetricFamily(
                "sparkiq_router_forwarded", "Sub-requests sent to other nodes since start"
            )
            forwarded.add_metric([], coordinator.router.forwarded)
            hedged = GaugeMetricFamily(
                "sparkiq_router_hedged",
                "Sub-requests also sent to another replica because the first was silent",
            )
            hedged.add_metric([], coordinator.router.hedged)
            beats = CounterMetricFamily(
                "sparkiq_heartbeats",
                "Membership heartbeats since start, by direction (sent; received and answered)",
                labels=["direction"],
            )
            beats.add_metric(["sent"], coordinator.heartbeats_sent)
            beats.add_metric(["received"], coordinator.heartbeats_answered)
            # sent: requests this node sent and replies it gave; received: the other two
            served = self._membership_bytes
            transport = coordinator.transport
            traffic = CounterMetricFamily(
                "sparkiq_membership_bytes",
                "Bytes of membership messages (heartbeats or gossip) since start, packed "
                "documents without HTTP headers, by direction (sent: requests sent and "
                "replies given; received: requests answered and replies read)",
                labels=["direction"],
            )
            traffic.add_metric(
                ["sent"], served["sent"] + getattr(transport, "membership_bytes_sent", 0)
            )
            traffic.add_metric(
                ["received"],
                served["received"] + getattr(transport, "membership_bytes_received", 0),
            )
            yield from (members, forwarded, hedged, beats, traffic)


class _KafkaCollector:
    """Per table, the Kafka topics it reads: offsets applied here, the broker's end offsets
    and the lag between them (sparkiq.serving.kafka_lag), read from the node's cache."""

    def __init__(self, node: ServedNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        labels = ["store", "topic", "partition"]
        applied = GaugeMetricFamily(
            "sparkiq_kafka_applied_offset",
            "Next offset of the topic partition after what this node applied (the least "
            "advanced hosted partition of the table)",
            labels=labels,
        )
        end = GaugeMetricFamily(
            "sparkiq_kafka_end_offset",
            "End offset of the topic partition on the broker (the last fetch that succeeded; "
            "only with --kafka-bootstrap)",
            labels=labels,
        )
        lag = GaugeMetricFamily(
            "sparkiq_kafka_lag_records",
            "Records of the topic partition not applied yet (end offset - applied offset)",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "sparkiq_kafka_end_offsets_age_seconds",
            "Age of the end offsets of the topic (the last fetch that succeeded)",
            labels=["topic"],
        )
        up = GaugeMetricFamily(
            "sparkiq_kafka_broker_up",
            "1 when the last fetch of the topic's end offsets succeeded, 0 when it failed",
            labels=["topic"],
        )
        now, topics = time.time(), set[str]()
        for source in self._node.kafka_sources():
            for p in source.partitions:
                names = [source.table, source.topic, str(p.partition)]
                if p.applied is not None:
                    applied.add_metric(names, p.applied)
                if p.end is not None:
                    end.add_metric(names, p.end)
                if p.lag is not None:
                    lag.add_metric(names, p.lag)
            if source.topic in topics or source.broker in ("none", "pending"):
                continue
            topics.add(source.topic)
            up.add_metric([source.topic], 1 if source.broker == "ok" else 0)
            if source.ends_fetched_at is not None:
                age.add_metric([source.topic], max(0.0, now - source.ends_fetched_at))
        yield from (applied, end, lag, age, up)
        yield from self._followed()

    def _followed(self) -> Iterator[Metric]:
        """The topics followed as tables (sparkiq.topics.lag): end offsets as the follower's
        consumer last fetched them, so fresher than ``sparkiq_kafka_end_offset``."""
        labels = ["store", "topic", "partition"]
        lag = GaugeMetricFamily(
            "sparkiq_topic_lag_records",
            "Records of a followed topic's partition not applied yet (end offset as the "
            "follower last fetched it - applied offset)",
            labels=labels,
        )
        behind = GaugeMetricFamily(
            "sparkiq_topic_lag_seconds",
            "Seconds since the followed topic's partition was last applied to its end (0: current)",
            labels=labels,
        )
        counts = {
            name: CounterMetricFamily(f"sparkiq_topic_{name}_records", text, labels=labels[:2])
            for name, text in (
                ("read", "Records of the followed topic read since the node opened it"),
                ("malformed", "Records of the followed topic skipped as malformed (logged)"),
                ("misplaced", "Records read from another partition than their key's"),
            )
        }
        for topic in self._node.followed_topics():
            for p in topic.partitions:
                names = [topic.table, topic.topic, str(p.partition)]
                if p.lag is not None:
                    lag.add_metric(names, p.lag)
                if p.seconds_behind is not None:
                    behind.add_metric(names, p.seconds_behind)
            counts["read"].add_metric([topic.table, topic.topic], topic.records)
            counts["malformed"].add_metric([topic.table, topic.topic], topic.malformed)
            counts["misplaced"].add_metric([topic.table, topic.topic], topic.misplaced)
        yield from (lag, behind, *counts.values())


class _WriterCollector:
    """Per table, its writer (the Spark query), from the writer status records the node
    caches (sparkiq.serving.writer_view). A table without a record (writer unknown) has no
    samples."""

    def __init__(self, node: ServedNode) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily(
            "sparkiq_writer_up",
            "1 when the table's Spark query runs and its driver wrote its status lately; 0 when "
            "it failed, was stopped or went silent",
            labels=["store"],
        )
        state = GaugeMetricFamily(
            "sparkiq_writer_state",
            "1 for the writer's current state (running, failed, stopped, silent)",
            labels=["store", "state"],
        )
        commit_age = GaugeMetricFamily(
            "sparkiq_writer_last_commit_age_seconds",
            "Age of the newest batch the writer committed (by its commit time)",
            labels=["store"],
        )
        heartbeat_age = GaugeMetricFamily(
            "sparkiq_writer_heartbeat_age_seconds",
            "Age of the writer's status record (a running writer rewrites it every few seconds)",
            labels=["store"],
        )
        duration = GaugeMetricFamily(
            "sparkiq_writer_batch_duration_seconds",
            "Duration of the writer's last micro-batch (Spark's triggerExecution)",
            labels=["store"],
        )
        input_rate = GaugeMetricFamily(
            "sparkiq_writer_input_rows_per_second",
            "Input rows per second of the writer's last micro-batch",
            labels=["store"],
        )
        processed_rate = GaugeMetricFamily(
            "sparkiq_writer_processed_rows_per_second",
            "Rows processed per second in the writer's last micro-batch",
            labels=["store"],
        )
        for w in self._node.writers():
            if w.state == "unknown":
                continue
            labels = [w.table]
            up.add_metric(labels, 1 if w.state == "running" else 0)
            state.add_metric([w.table, w.state], 1)
            if w.last_commit_age_seconds is not None:
                commit_age.add_metric(labels, w.last_commit_age_seconds)
            if w.heartbeat_age_seconds is not None:
                heartbeat_age.add_metric(labels, w.heartbeat_age_seconds)
            if w.batch_duration_ms is not None:
                duration.add_metric(labels, w.batch_duration_ms / 1000.0)
            if w.input_rows_per_second is not None:
                input_rate.add_metric(labels, w.input_rows_per_second)
            if w.processed_rows_per_second is not None:
                processed_rate.add_metric(labels, w.processed_rows_per_second)
        yield from (up, state, commit_age, heartbeat_age, duration, input_rate, processed_rate)
        yield from _publishing_metrics(self._node.writers())


def _publishing_metrics(writers: list[Any]) -> Iterator[Metric]:
    """Per table and Kafka topic it is published to by its writer's driver, the publisher's
    lag behind the table's changelog (sparkiq.publish)."""
    up = GaugeMetricFamily(
        "sparkiq_publish_up",
        "1 while the table's publisher to the Kafka topic runs (publishing or caught up); 0 "
        "when it failed, was fenced, retries a fault or was stopped",
        labels=["store", "topic"],
    )
    batches = GaugeMetricFamily(
        "sparkiq_publish_lag_batches",
        "Committed batches of the table the topic does not hold yet",
        labels=["store", "topic"],
    )
    rows = GaugeMetricFamily(
        "sparkiq_publish_lag_rows",
        "Changed rows of the committed batches the topic does not hold yet",
        labels=["store", "topic"],
    )
    for w in writers:
        for p in w.publishing:
            labels = [w.table, str(p.get("topic"))]
            up.add_metric(labels, 1 if p.get("state") in ("publishing", "caught_up") else 0)
            batches.add_metric(labels, float(p.get("batches_behind") or 0))
            rows.add_metric(labels, float(p.get("rows_behind") or 0))
    yield from (up, batches, rows)


class QueryRate:
    """Queries per table over the last ``buckets * interval`` seconds, counted in buckets of
    ``interval`` seconds of wall-clock time (bucket ``i`` covers ``[i * interval, (i + 1) *
    interval)``), so nothing has to sample on a timer: a bucket nobody counted in is zero.

    Thread-safe: ``_lock`` guards ``_buckets`` (counts arrive from the event loop and from the
    request threads; :meth:`series` reads them from either).
    """

    def __init__(
        self,
        interval: float = 5.0,
        buckets: int = 120,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0 or buckets < 1:
            raise ValueError("interval must be > 0 and buckets >= 1")
        self.interval = interval
        self.buckets = buckets
        self._clock = clock
        self._lock = threading.Lock()
        self._buckets: dict[int, dict[str, int]] = {}

    def count(self, stores: Iterable[str]) -> None:
        """One query that read each of ``stores`` (a store named twice counts twice)."""
        index = int(self._clock() // self.interval)
        with self._lock:
            bucket = self._buckets.get(index)
            if bucket is None:
                bucket = self._buckets[index] = {}
                for old in [i for i in self._buckets if i <= index - self.buckets]:
                    del self._buckets[old]
            for store in stores:
                bucket[store] = bucket.get(store, 0) + 1

    def series(
        self, stores: Iterable[str] | None = None, now: float | None = None
    ) -> dict[str, Any]:
        """``{"interval_seconds", "end", "queries": {store: [count, ...]}}``: one count per
        bucket, oldest first, the last one the bucket in progress (it ends at ``end``, Unix
        seconds) at ``now`` (default: the clock's time). ``stores`` are listed, and only
        they (a caller learns nothing of tables it may not read); ``None`` lists every
        store queried in the window."""
        now = self._clock() if now is None else now
        newest = int(now // self.interval)
        first = newest - self.buckets + 1
        with self._lock:
            window = {i: dict(b) for i, b in self._buckets.items() if i >= first}
        names = set(stores) if stores is not None else set().union(*window.values())
        queries = {
            name: [window.get(i, {}).get(name, 0) for i in range(first, newest + 1)]
            for name in sorted(names)
        }
        return {
            "interval_seconds": self.interval,
            "end": (newest + 1) * self.interval,
            "queries": queries,
        }


class Metrics:
    def __init__(self, node: ServedNode) -> None:
        self._node = node
        self.registry = CollectorRegistry()
        # sparkiq_queries, sparkiq_http_requests and sparkiq_http_request_seconds: counted
        # in plain numbers, exported at scrape time (sparkiq.server.request_counts)
        self.counts = RequestCounts()
        self.registry.register(self.counts)
        self.query_rate = QueryRate()
        self.gauges = GaugeHistory(self.query_rate.interval, self.query_rate.buckets)
        #: Bytes of membership messages this node's HTTP server read and answered.
        self._membership_bytes = {"sent": 0, "received": 0}
        self.registry.register(_ReplicaCollector(node, self._membership_bytes))
        self.registry.register(_KafkaCollector(node))
        self.registry.register(_WriterCollector(node))

    def membership_message(self, received: int, sent: int) -> None:
        """Count a membership message this node answered: its body and the reply's bytes
        (unlocked, as the heartbeat counts: a lost count is noise in a rate)."""
        self._membership_bytes["received"] += received
        self._membership_bytes["sent"] += sent

    def queried(self, *stores: str) -> None:
        """Count one client query that read ``stores``."""
        self.counts.queried(stores)
        self.query_rate.count(stores)

    def sample(self) -> None:
        """Sample the node's gauges into :attr:`gauges` (at most once a second: a reader of
        /stats, /metrics or a chart calls this each time)."""
        if self.gauges.due():
            self.gauges.record(gauges_of(self._node))

    def render(self) -> tuple[bytes, str]:
        self.sample()  # a Prometheus scrape keeps the console's history going too
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
