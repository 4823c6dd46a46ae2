"""What the HTTP server counts on every request, as plain numbers read at scrape time.

Requests by route and status (``sparkiq_http_requests``), their latency by route
(``sparkiq_http_request_seconds``, a histogram) and the queries of each table
(``sparkiq_queries``) are counted by :class:`RequestCounts` in ints and floats under one lock,
and a Prometheus scrape reads them through its ``collect`` (a custom collector), with the
names, labels, buckets and ``_created`` samples that ``prometheus_client``'s ``Counter`` and
``Histogram`` export for the same counts.

Why not those classes: every ``inc`` and ``observe`` takes a lock of its own and goes through
a few layers of wrappers (a key lookup took four of them: 2 us, a fifth of what the node
spends on the request in Python); here a request costs one lock and a few dict updates.

Thread-safe: ``_lock`` guards every count (the event loop counts, a scrape may read from a
thread).
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import cast

from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

#: how prometheus_client writes a bucket's bound ("0.0005", "+Inf"); it has no annotations
_bound_text = cast(Callable[[float], str], floatToGoString)

__all__ = ["LATENCY_BUCKETS", "RequestCounts"]

#: Upper bounds (seconds) of the latency histogram's buckets; ``+Inf`` follows them.
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class RequestCounts:
    """The HTTP server's per-request counts (see the module docstring); register it in a
    ``CollectorRegistry`` to export them."""

    def __init__(self, buckets: Sequence[float] = LATENCY_BUCKETS) -> None:
        self._bounds = (*sorted(float(b) for b in buckets), float("inf"))
        self._lock = threading.Lock()
        # (route, status) -> requests; route -> [count per bucket..., sum of seconds];
        # store -> queries; and when each series was first counted (its _created sample)
        self._requests: dict[tuple[str, int], int] = {}
        self._latency: dict[str, list[float]] = {}
        self._queries: dict[str, int] = {}
        self._created: dict[object, float] = {}

    def request(self, route: str, status: int, seconds: float) -> None:
        """Count one answered request of ``route`` that took ``seconds``."""
        key = (route, status)
        with self._lock:
            requests = self._requests
            count = requests.get(key)
            if count is None:
                count = 0
                self._created[key] = time.time()
            requests[key] = count + 1
            histogram = self._latency.get(route)
            if histogram is None:
                histogram = self._latency[route] = [0.0] * (len(self._bounds) + 1)
                self._created[route] = time.time()
            histogram[bisect.bisect_left(self._bounds, seconds)] += 1
            histogram[-1] += seconds

    def queried(self, stores: Iterable[str]) -> None:
        """Count one query that read each of ``stores``."""
        with self._lock:
            queries = self._queries
            for store in stores:
                count = queries.get(store)
                if count is None:
                    count = 0
                    self._created[("store", store)] = time.time()
                queries[store] = count + 1

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            requests = dict(self._requests)
            latency = {route: list(counts) for route, counts in self._latency.items()}
            queries = dict(self._queries)
            created = dict(self._created)
        family = CounterMetricFamily(
            "sparkiq_queries",
            "Queries of each table from HTTP clients (a SQL statement counts once per table)",
            labels=["store"],
        )
        for store, count in queries.items():
            family.add_metric([store], float(count), created=created[("store", store)])
        yield family
        family = CounterMetricFamily(
            "sparkiq_http_requests", "HTTP requests by route and status", labels=["route", "status"]
        )
        for (route, status), count in requests.items():
            family.add_metric([route, str(status)], float(count), created=created[(route, status)])
        yield family
        yield self._histogram(latency, created)

    def _histogram(self, latency: dict[str, list[float]], created: dict[object, float]) -> Metric:
        family = HistogramMetricFamily(
            "sparkiq_http_request_seconds", "HTTP request latency by route", labels=["route"]
        )
        bounds = [_bound_text(b) for b in self._bounds]
        for route, counts in latency.items():
            cumulative, total = [], 0.0
            for bound, count in zip(bounds, counts, strict=False):
                total += count
                cumulative.append((bound, total))
            family.add_metric([route], cumulative, counts[-1])
            # prometheus_client's Histogram exports when the series began, as its Counter
            family.samples.append(
                Sample(f"{family.name}_created", {"route": route}, created[route], None, None)
            )
        return family
