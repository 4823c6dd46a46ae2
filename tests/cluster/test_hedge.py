"""The hedge delay learned from latencies, and the first-byte limit that uses it."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from sparkiq.cluster.hedge import MIN_SAMPLES, HedgeDelay
from sparkiq.cluster.httppool import HttpPool, NodeTimeoutError


def test_no_delay_before_enough_latencies() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    for _ in range(MIN_SAMPLES - 1):
        delays.record("KeyQuery", 0.01)
    assert delays.delay("KeyQuery") is None


def test_three_times_p99_within_floor_and_ceiling() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    latencies = [0.001 * i for i in range(1, 101)]  # p99 of these is 0.1 s
    for seconds in latencies:
        delays.record("fast", seconds)
        delays.record("faster", seconds / 100)
    ordered = sorted(latencies)
    # 100 samples: recomputed at the 96th (every 16), so the p99 is of the first 96
    p99 = sorted(ordered[:96])[int(0.99 * 96)]
    assert delays.delay("fast") == pytest.approx(3 * p99)
    assert delays.delay("faster") == 0.1  # the floor


def test_the_ceiling_bounds_a_fast_kind_with_a_slow_tail() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    for i in range(32):
        delays.record("k", 2.0 if i % 10 == 0 else 0.01)
    assert delays.delay("k") == 1.0


def test_a_heavy_kind_gets_no_delay_and_a_cold_kind_the_ceiling() -> None:
    delays = HedgeDelay(floor=0.1, ceiling=1.0)
    for _ in range(32):
        delays.record("sql", 3.0)  # median above the ceiling: cannot tell dead from busy
        delays.record("get", 0.01)
        delays.record("get", 0.01)
    assert delays.delay("sql") is None
    assert delays.delay("range") == 1.0  # never seen; the kinds together are fast


def test_bad_limits_are_refused() -> None:
    with pytest.raises(ValueError, match="floor <= ceiling"):
        HedgeDelay(floor=2.0, ceiling=1.0)


def test_first_byte_limit_gives_up_on_a_silent_server() -> None:
    """A server that accepts and never answers (a blackholed node) costs ``first_byte``,
    not the pool's timeout."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        accepted: list[socket.socket] = []
        thread = threading.Thread(target=lambda: accepted.append(server.accept()[0]))
        thread.start()
        pool = HttpPool(timeout=30.0)
        url = f"http://127.0.0.1:{server.getsockname()[1]}"
        started = time.monotonic()
        with pytest.raises(NodeTimeoutError, match="did not answer in time"):
            pool.request(url, "POST", "/internal/query", b"x", {}, first_byte=0.3)
        took = time.monotonic() - started
        thread.join()
        for conn in accepted:
            conn.close()
        pool.close()
    assert 0.3 <= took < 10.0  # gave up at the limit; far below the 30 s timeout
