"""One statement whose answer is a single enormous value must not stall a node: ``SELECT
list_sort(list(a.k || b.k)) FROM t a, t b`` builds one list of ``|t|**2`` strings inside
DuckDB, and turning it into Python objects held the GIL for seconds (8 s seen on a loaded
machine: peers declared the node gone). Against a real ``sparkiq serve`` process, while a
prober on its own connection looks a key up every 10 ms: the statement is refused or
answered, and the prober's longest wait between two answers stays under a second of an
idle core (scaled by how loaded the machine is now, tests.server.test_hostile.bound)."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator

import pytest

from tests import http_calls
from tests.changelog.helpers import make_table, write_batch
from tests.cluster.serve_processes import ServeProcess, free_port
from tests.server.test_hostile import bound

pytestmark = pytest.mark.timeout(300)

KEYS = 3000  # the list holds 9 million strings (about 200 MB as Arrow)
JSON = {"content-type": "application/json"}
CROSS = "SELECT list_sort(list(a.k || b.k)) AS l FROM t a, t b"


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServeProcess]:
    state_dir = tmp_path_factory.mktemp("stall")
    write_batch(make_table(str(state_dir), partitions=4), 0, {f"{i:05d}": i for i in range(KEYS)})
    process = ServeProcess(
        str(state_dir),
        "n0",
        free_port(),
        [],
        str(state_dir),
        # room for DuckDB to build the list: the statement then fails on its result's size
        SPARKIQ_SQL_MEMORY_LIMIT="2GB",
        SPARKIQ_SQL_TIMEOUT_SECONDS="120",
    ).start()
    try:
        process.wait_ready()
        yield process
    finally:
        process.stop()


class Prober:
    """Key lookups 10 ms apart on one connection; ``worst`` is the longest time between
    two answers (or from the start to the first) while it ran."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.answers: list[float] = []
        self.failures: list[str] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with http_calls.new_client(timeout=60) as client:
            while not self.done.is_set():
                response = client.get(f"{self.url}/stores/t/keys/00017")
                if response.status_code != 200 or response.json()["row"]["n"] != 17:
                    self.failures.append(response.text[:200])
                self.answers.append(time.monotonic())
                self.done.wait(0.01)  # a stall is seconds; back to back took a core from it

    def __enter__(self) -> Prober:
        self.thread.start()
        while not self.answers:
            time.sleep(0.01)
        self.started = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # one more answer after the statement's
        self.done.set()
        self.thread.join(60)
        times = [self.started, *(t for t in self.answers if t > self.started)]
        self.worst = max(b - a for a, b in itertools.pairwise(times))


def test_a_huge_single_value_is_refused_without_stalling_the_node(node: ServeProcess) -> None:
    with Prober(node.url) as prober:
        response = http_calls.post(
            f"{node.url}/query", json={"sql": CROSS}, headers=JSON, timeout=200
        )
    assert response.status_code == 400, response.text[:300]
    error = response.json()["error"]
    assert error["code"] == "result_too_large" and "max_result_bytes" in error["message"]
    assert not prober.failures, prober.failures[:3]
    limit = bound()
    assert prober.worst < limit, f"a lookup waited {prober.worst:.2f} s (limit {limit:.2f} s)"


def test_a_large_single_value_is_answered_without_stalling_the_node(node: ServeProcess) -> None:
    keys = 1200  # 1.44 million strings, about 25 MB of JSON
    sql = f"{CROSS} WHERE a.n < {keys} AND b.n < {keys}"
    with Prober(node.url) as prober:
        response = http_calls.post(
            f"{node.url}/query", json={"sql": sql}, headers=JSON, timeout=200
        )
    assert response.status_code == 200, response.text[:300]
    (row,) = response.json()["rows"]
    values = row["l"]
    assert len(values) == keys * keys
    assert values[:2] == ["0000000000", "0000000001"] and values[-1] == "0119901199"
    assert values == sorted(values)
    limit = bound()
    assert prober.worst < limit, f"a lookup waited {prober.worst:.2f} s (limit {limit:.2f} s)"
