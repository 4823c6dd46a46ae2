"""A bound no replica can meet costs its caller nothing and others nothing: a bound beyond
the changelog's newest commit is refused at once instead of held on a thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sparkiq import Node, Position, PositionBound, RangeQuery, StateQueryRequest
from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.cluster_helpers import start_http_cluster
from tests.cluster.serve_processes import ServeProcess, free_port
from tests.server.test_hostile import bound

TOKEN = "clients-token"
HEADERS = {"authorization": f"Bearer {TOKEN}", "content-type": "application/json"}
FAR = Position.from_map({"t": {0: 10**6}})


@pytest.fixture(scope="module")
def nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Node]]:
    state_dir = str(tmp_path_factory.mktemp("bounds"))
    changelog = make_table(state_dir, partitions=4)
    write_batch(changelog, 0, {f"k{i}": i for i in range(20)})
    started = start_http_cluster(state_dir, 2, token=TOKEN)
    yield started
    for node in started:
        node.stop()


def test_a_bound_beyond_the_changelog_fails_at_once_in_process(nodes: list[Node]) -> None:
    request = (
        StateQueryRequest.in_store("t")
        .with_query(RangeQuery.with_no_bounds())
        .with_position_bound(PositionBound.at(FAR))
    )
    started = time.monotonic()
    result = nodes[0].query(request)
    took = time.monotonic() - started
    assert set(result.partition_results) == {0, 1, 2, 3}
    for partial in result.partition_results.values():
        assert partial.failure_reason is not None
        assert partial.failure_reason.name == "NOT_UP_TO_BOUND"
        assert "newest committed batch is 0" in (partial.failure_message or "")
    # the old path waited for the batch on every replica, then again after a fresh round
    assert took < 1.5, took


@pytest.fixture
def serving(tmp_path: Path) -> Iterator[ServeProcess]:
    """A ``sparkiq serve`` process: the callers' threads below must not share its GIL."""
    state_dir = str(tmp_path / "state")
    changelog = make_table(state_dir, partitions=4)
    write_batch(changelog, 0, {f"k{i}": i for i in range(20)})
    node = ServeProcess(state_dir, "n0", free_port(), [], str(tmp_path)).start(token=TOKEN)
    try:
        node.wait_up()
        yield node
    finally:
        node.stop()


def test_far_bounds_do_not_hold_the_threads_other_callers_need(serving: ServeProcess) -> None:
    """64 callers with a far-future bound at once, against a node with 32 HTTP threads,
    while a prober reads the whole table: the prober is never held up for a second (each
    bounded caller used to hold a thread for seconds, waiting for the batch)."""
    url = serving.url
    body = {"query": {"type": "range"}}
    bounded = body | {"bound": FAR.to_token()}
    stop, ready = threading.Event(), threading.Event()
    worst = [0.0]

    def probe() -> None:
        with http_calls.new_client(headers=HEADERS, timeout=60) as client:
            client.post(f"{url}/stores/t/query", json=body)  # the first one warms up
            ready.set()
            while not stop.is_set():
                started = time.monotonic()
                answer = client.post(f"{url}/stores/t/query", json=body)
                assert answer.status_code == 200, answer.text
                worst[0] = max(worst[0], time.monotonic() - started)
                time.sleep(0.01)

    def far(_: int) -> str:
        with http_calls.new_client(headers=HEADERS, timeout=120) as client:
            answer = client.post(f"{url}/stores/t/query", json=bounded)
            assert answer.status_code == 200, answer.text
            return answer.text

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        ready.wait(60)
        with ThreadPoolExecutor(64) as pool:
            answers = list(pool.map(far, range(64)))
    finally:
        stop.set()
        prober.join()
    limit = bound()  # 1 s, scaled by how much slower than its CPU time the machine runs now
    assert worst[0] < limit, f"the prober waited {worst[0]:.2f} s behind the bounded callers"
    for answer in answers:
        assert "NOT_UP_TO_BOUND" in answer and "newest committed batch is 0" in answer
