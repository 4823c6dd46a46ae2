"""Client load around one fault, and the verdict: the history checker's anomalies (none
allowed), failures after the cluster settled (none allowed), and optionally how long a client
session went without an answer, scaled by how loaded the machine was while the fault held.

Shared by tests/faults (a cluster behind TCP proxies) and tests/hosts (hosts in network
namespaces): anything with ``start_load``, ``loaders`` (each with ``ops``), ``stop_load`` and
``verdict`` as :class:`~tests.faults.harness.FaultCluster` has them.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable

from tests.cluster.cluster_helpers import wait_until
from tests.faults.checker import Fault, Window, windows
from tests.faults.harness import FaultCluster

#: The longest a client session may go without an answer while a node is partitioned away.
UNAVAILABLE_S = 2.0
#: Answers each session has before the fault: clients and routers learn how long to wait
#: for one node before asking another from their own latencies (sparkiq.cluster.hedge).
WARM_OPS = 30


def slowdown() -> float:
    """How much slower than its own CPU time a 20 ms computation runs on the wall clock."""
    started, cpu = time.monotonic(), time.thread_time()
    total = 0
    while time.thread_time() - cpu < 0.02:
        total += sum(range(1000))
    return (time.monotonic() - started) / max(time.thread_time() - cpu, 1e-3)


class Slowdown(threading.Thread):
    """Samples :func:`slowdown` every 0.5 s while a fault holds; :meth:`factor` is the
    median sample (never below 1), to scale a bound by: on a machine at load 30 the nodes
    themselves stall for seconds, and a bound measured once, before the fault, misses it."""

    def __init__(self) -> None:
        super().__init__(daemon=True, name="slowdown")
        self.samples: list[float] = []
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.wait(0.5):
            self.samples.append(slowdown())

    def factor(self) -> float:
        self.stop_event.set()
        if self.is_alive():
            self.join()
        return max(1.0, statistics.median(self.samples or [slowdown()]))


def under_load(
    cluster: FaultCluster,
    inject: Callable[[], Fault],
    unavailable: float | None = None,
    *,
    report: list[str],
) -> Window:
    """Load, one fault, the checker's verdict. ``unavailable``: the longest a client session
    may go without an answer (scaled by the machine's load while the fault held). The
    window's line goes to ``report``."""
    cluster.start_load()
    load = Slowdown()
    try:
        warm = lambda: all(sum(o.ok for o in lo.ops) >= WARM_OPS  # noqa: E731
                           for lo in cluster.loaders)  # fmt: skip
        wait_until(warm, 60, "the sessions answered too little before the fault")
        load.start()
        fault = inject()
        settled_ops = lambda: min(sum(o.start > fault.settled for o in lo.ops)  # noqa: E731
                                  for lo in cluster.loaders)  # fmt: skip
        wait_until(lambda: settled_ops() >= 5, 60, "no answers after the fault settled")
    finally:
        ops = cluster.stop_load()
        factor = load.factor()
    anomalies, _ = cluster.verdict(ops)
    (window,) = windows(ops, [fault])
    report.append(f"{window}; errors: {window.errors[:2]}; slowdown x{factor:.1f}")
    print(window)
    assert anomalies == [], "\n".join(str(a) for a in anomalies[:10])
    assert window.failed_after_settle == 0, window
    assert sum(o.ok for o in ops if o.start > fault.settled) > 0
    if unavailable is not None:
        limit = unavailable * factor
        assert window.client_gap <= limit, f"{window} (limit {limit:.2f} s)"
    return window
