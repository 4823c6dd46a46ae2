"""ElasticPool: threads start with the work, end when idle, and never exceed the bound."""

from __future__ import annotations

import threading
import time
from concurrent.futures import CancelledError

import pytest

from sparkiq.pools import ElasticPool, pool_limits

# A bound on how long a thread may take to notice what it should do (a loaded machine can
# hold a thread off the CPU for a while); the tests never wait for it when things work.
HANG = 30.0


def _until(condition: object, what: str) -> None:
    deadline = time.monotonic() + HANG
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"still not {what} after {HANG} s"
        time.sleep(0.01)


def test_threads_start_with_the_work_up_to_the_bound_and_queue_beyond_it() -> None:
    pool = ElasticPool("test-grow", 3)
    release = threading.Event()
    running = threading.Semaphore(0)

    def blocked(n: int) -> int:
        running.release()
        release.wait(HANG)
        return n

    try:
        futures = [pool.submit(blocked, n) for n in range(5)]
        for _ in range(3):
            assert running.acquire(timeout=HANG)
        assert pool.threads == 3
        assert not running.acquire(timeout=0.2)  # the 4th and 5th wait for a thread
        names = {t.name for t in threading.enumerate() if t.name.startswith("test-grow_")}
        assert names == {"test-grow_1", "test-grow_2", "test-grow_3"}
        release.set()
        assert [f.result(HANG) for f in futures] == [0, 1, 2, 3, 4]
        assert pool.threads == 3  # reused, none added
    finally:
        release.set()
        pool.shutdown()


def test_idle_threads_end_and_the_pool_grows_again() -> None:
    pool = ElasticPool("test-idle", 4, idle_seconds=0.2)
    try:
        barrier = threading.Barrier(4, timeout=HANG)
        assert [f.result(HANG) for f in [pool.submit(barrier.wait) for _ in range(4)]]
        assert pool.threads == 4
        _until(lambda: pool.threads == 0, "idle threads ended")
        assert not [t for t in threading.enumerate() if t.name.startswith("test-idle_")]
        assert pool.submit(lambda: "again").result(HANG) == "again"
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_steady_work_keeps_one_thread() -> None:
    """One caller at a time never needs a second thread: a thread counts itself idle before
    its caller hears the result, so the caller's next work finds it."""
    pool = ElasticPool("test-steady", 8)
    try:
        for n in range(500):
            assert pool.submit(lambda n=n: n * 2).result(HANG) == n * 2
        assert pool.threads == 1
    finally:
        pool.shutdown()


def test_no_work_is_stranded_when_threads_end_as_it_arrives() -> None:
    """Threads ending on their idle timeout while work is submitted: every future completes."""
    pool = ElasticPool("test-race", 2, idle_seconds=0.001)
    try:
        for burst in range(300):
            futures = [pool.submit(lambda b=burst: b) for _ in range(3)]
            assert [f.result(HANG) for f in futures] == [burst] * 3
            if burst % 7 == 0:
                time.sleep(0.002)  # let the threads time out between some bursts
    finally:
        pool.shutdown()


def test_exceptions_reach_the_caller_and_the_thread_survives() -> None:
    pool = ElasticPool("test-raise", 1)
    try:
        with pytest.raises(ZeroDivisionError):
            pool.submit(lambda: 1 / 0).result(HANG)
        assert pool.submit(lambda: "still here").result(HANG) == "still here"
    finally:
        pool.shutdown()


def test_shutdown_cancels_queued_work_refuses_new_and_waits_for_running() -> None:
    pool = ElasticPool("test-shut", 1)
    started, release = threading.Event(), threading.Event()

    def slow() -> str:
        started.set()
        release.wait(HANG)
        return "done"

    running = pool.submit(slow)
    assert started.wait(HANG)
    queued = pool.submit(lambda: "never")
    pool.shutdown(wait=False, cancel_futures=True)
    with pytest.raises(CancelledError):
        queued.result(HANG)
    with pytest.raises(RuntimeError, match="'test-shut' is shut down"):
        pool.submit(lambda: None)
    release.set()
    pool.shutdown(wait=True)  # returns once the running work ended
    assert running.result(0) == "done" and pool.threads == 0


def test_shutdown_without_cancel_runs_what_is_queued() -> None:
    pool = ElasticPool("test-drain", 1)
    gate = threading.Event()
    futures = [pool.submit(gate.wait, HANG), pool.submit(lambda: "queued")]
    pool.shutdown(wait=False)
    gate.set()
    assert futures[1].result(HANG) == "queued"
    _until(lambda: pool.threads == 0, "the pool's thread ended")


def test_limits_sum_the_live_pools_of_a_name() -> None:
    first, second = ElasticPool("test-limits", 3), ElasticPool("test-limits", 5)
    assert pool_limits()["test-limits"] == 8
    first.shutdown()
    assert pool_limits()["test-limits"] == 5
    second.shutdown()
    assert "test-limits" not in pool_limits()


def test_a_pool_needs_a_thread() -> None:
    with pytest.raises(ValueError, match="at least one thread"):
        ElasticPool("test-empty", 0)


def test_a_pool_thread_cannot_wait_for_its_own_pool() -> None:
    pool = ElasticPool("test-self", 2)
    try:
        with pytest.raises(RuntimeError, match="cannot wait for its shutdown"):
            pool.submit(pool.shutdown).result(HANG)
    finally:
        pool.shutdown()
