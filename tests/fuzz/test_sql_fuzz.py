"""Grammar-based SQL fuzzing of a real node (``tests.fuzz.sqlgen``): a fixed seed, a few
hundred statements, about a minute at most. No answer is a 5xx, no error leaks a path or a
class name, generated statements answer like DuckDB on the ground truth, and key lookups
on another connection keep answering meanwhile. ``bench/fuzz.py`` runs the long version.
"""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pytest

from tests.cluster.cluster_helpers import start_http_cluster
from tests.fuzz.harness import sql_fuzz
from tests.server.test_hostile import TOKEN, Hostile, Probe
from tests.sql.tables import build_world, truth_tables

pytestmark = pytest.mark.timeout(300)

SEED = 20261124
CASES = 300
BUDGET = 60.0  # seconds of fuzzing; on a loaded machine fewer cases run, never longer


@pytest.fixture(scope="module")
def fuzzed(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Hostile, duckdb.DuckDBPyConnection]]:
    state_dir = str(tmp_path_factory.mktemp("fuzz"))
    truth = build_world(state_dir)
    (node,) = start_http_cluster(state_dir, 1, token=TOKEN)
    ground = duckdb.connect(":memory:")
    for name, table in truth_tables(truth).items():
        ground.register(name, table)
    yield Hostile(node, state_dir), ground
    ground.close()
    node.stop()


def test_sql_fuzz_finds_no_server_error_leak_or_wrong_answer(
    fuzzed: tuple[Hostile, duckdb.DuckDBPyConnection],
) -> None:
    h, ground = fuzzed
    with Probe(h):
        report = sql_fuzz(
            h.node.url or "", TOKEN, ground, seed=SEED, cases=CASES, budget_seconds=BUDGET
        )
    assert report.cases >= 50, f"only {report.cases} cases ran in {BUDGET} s"
    assert not report.problems, "\n".join(report.problems[:10])
    # the grammar reaches both sides: answers compared with DuckDB, and refusals
    assert report.compared >= report.cases // 5, report.statuses
    assert report.statuses[400] >= report.cases // 10, report.statuses
