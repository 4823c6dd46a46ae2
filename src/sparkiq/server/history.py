"""The recent history of a node's per-table gauges (lag, freshness, the writer's input rate)
that the console charts, kept in buckets of wall-clock time as :class:`QueryRate` keeps the
query counts.

A gauge has no events to count: it is *sampled* (:func:`gauges_of`) whenever someone reads
the node's state (``GET /stats``, ``GET /metrics``, a chart), at most once a second, and a
bucket keeps the highest value sampled in it (a lag spike between two samples of the same
bucket is not averaged away). A bucket nobody sampled in is ``None``: the charts show a gap
there, never an invented zero. So the history covers the time something watched the node
(the console refreshes every 2 seconds, Prometheus scrapes on its own schedule), and it
outlives a page: a console opened again sees the minutes before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from sparkiq.server.served import ServedNode

__all__ = ["GAUGES", "GaugeHistory", "gauges_of"]

#: The gauges kept per table: the most batches any active partition of the table is behind,
#: cluster-wide (``lag_batches`` of ``GET /metadata``); the most seconds a partition this node
#: hosts is behind the newest committed batch (``sparkiq_replica_lag_seconds``); the input
#: rows per second of the writer's last micro-batch, while it runs
#: (``sparkiq_writer_input_rows_per_second``).
GAUGES = ("lag_batches", "lag_seconds", "input_rows_per_second")


def gauges_of(node: ServedNode) -> dict[str, dict[str, float]]:
    """``{table: {gauge: value}}`` now, for every table of ``node`` (no principal's view:
    the history is the node's, and its readers are filtered when it is served). A gauge
    without a value now (no active partition known, no running writer) is left out."""
    out: dict[str, dict[str, float]] = {table: {} for table in node.tables}
    for meta in node.all_metadata():
        for table, parts in meta.hosted.items():
            active = meta.active.get(table, ())
            for partition, (_, _, lag) in parts.items():
                if partition in active and table in out:
                    gauges = out[table]
                    gauges["lag_batches"] = max(gauges.get("lag_batches", 0.0), float(lag))
    for s in node.status():
        if s.table in out:
            gauges = out[s.table]
            gauges["lag_seconds"] = max(gauges.get("lag_seconds", 0.0), float(s.lag_seconds))
    for w in node.writers():
        if w.table in out and w.state == "running" and w.input_rows_per_second is not None:
            out[w.table]["input_rows_per_second"] = float(w.input_rows_per_second)
    return out


class GaugeHistory:
    """Per table and gauge, the highest value sampled in each ``interval``-second bucket of
    the last ``buckets`` (bucket ``i`` covers ``[i * interval, (i + 1) * interval)`` Unix
    seconds, the same buckets as :class:`~sparkiq.server.metrics.QueryRate`).

    Thread-safe: ``_lock`` guards ``_buckets`` and ``_sampled`` (samples come from the event
    loop and from request threads).
    """

    def __init__(
        self,
        interval: float = 5.0,
        buckets: int = 120,
        clock: Callable[[], float] = time.time,
        min_gap: float = 1.0,
    ) -> None:
        if interval <= 0 or buckets < 1 or min_gap < 0:
            raise ValueError("interval must be > 0, buckets >= 1 and min_gap >= 0")
        self.interval = interval
        self.buckets = buckets
        self._clock = clock
        self._min_gap = min_gap
        self._lock = threading.Lock()
        self._buckets: dict[int, dict[str, dict[str, float]]] = {}
        self._sampled = float("-inf")

    def due(self) -> bool:
        """Whether a sample now would be kept: ``min_gap`` seconds passed since the last.
        Lets a caller skip reading the node's state when it would be thrown away."""
        with self._lock:
            return self._clock() - self._sampled >= self._min_gap

    def record(self, values: Mapping[str, Mapping[str, float]]) -> bool:
        """Record ``{table: {gauge: value}}`` sampled now; False (nothing kept) if the last
        sample is less than ``min_gap`` seconds old."""
        now = self._clock()
        index = int(now // self.interval)
        with self._lock:
            if now - self._sampled < self._min_gap:
                return False
            self._sampled = now
            bucket = self._buckets.get(index)
            if bucket is None:
                bucket = self._buckets[index] = {}
                for old in [i for i in self._buckets if i <= index - self.buckets]:
                    del self._buckets[old]
            for table, gauges in values.items():
                kept = bucket.setdefault(table, {})
                for gauge, value in gauges.items():
                    kept[gauge] = max(kept.get(gauge, value), value)
        return True

    def series(self, stores: Iterable[str], now: float | None = None) -> dict[str, Any]:
        """``{"interval_seconds", "end", "tables": {store: {gauge: [value or None, ...]}}}``
        for each of ``stores``: one value per bucket, oldest first, the last one the bucket in
        progress (it ends at ``end``, Unix seconds) at ``now`` (default: the clock's time)."""
        now = self._clock() if now is None else now
        newest = int(now // self.interval)
        first = newest - self.buckets + 1
        with self._lock:
            window = {
                i: {t: dict(g) for t, g in bucket.items()}
                for i, bucket in self._buckets.items()
                if i >= first
            }
        indexes = range(first, newest + 1)
        tables = {
            store: {
                gauge: [window.get(i, {}).get(store, {}).get(gauge) for i in indexes]
                for gauge in GAUGES
            }
            for store in sorted(set(stores))
        }
        end = (newest + 1) * self.interval
        return {"interval_seconds": self.interval, "end": end, "tables": tables}
