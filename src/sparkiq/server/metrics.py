"""Prometheus metrics of one node (its own registry, so several nodes fit in one process)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from sparkiq.server.served import ServedNode

__all__ = ["Metrics"]


class _ReplicaCollector:
    """Per-partition replica state, read from the node at scrape time."""

    def __init__(self, node: ServedNode) -> None:
        self._node = node

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
            yield from (members, forwarded, hedged)


class Metrics:
    def __init__(self, node: ServedNode) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "sparkiq_http_requests",
            "HTTP requests by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "sparkiq_http_request_seconds",
            "HTTP request latency by route",
            ["route"],
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=self.registry,
        )
        self.registry.register(_ReplicaCollector(node))

    def observe(self, route: str, status: int, seconds: float) -> None:
        self.requests.labels(route, str(status)).inc()
        self.latency.labels(route).observe(seconds)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
