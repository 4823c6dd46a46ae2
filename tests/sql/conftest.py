"""One state directory with every kind of table, served by a started node, per session."""

from __future__ import annotations

from collections.abc import Iterator

import duckdb
import pyarrow as pa
import pytest

from sparkiq import Node
from tests.sql.tables import Truth, build_world, truth_tables


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, Truth]:
    root = tmp_path_factory.mktemp("sqlworld")
    truth = build_world(str(root))
    return str(root), truth


@pytest.fixture(scope="session")
def truth(world_dir: tuple[str, Truth]) -> Truth:
    return world_dir[1]


@pytest.fixture(scope="session")
def node(world_dir: tuple[str, Truth]) -> Iterator[Node]:
    with Node(world_dir[0], store="rocksdb", node_id="sqltests") as started:
        started.poll_once()
        yield started


@pytest.fixture(scope="session")
def ground(truth: Truth) -> Iterator[duckdb.DuckDBPyConnection]:
    """DuckDB directly over the ground-truth rows: the reference answers."""
    con = duckdb.connect(":memory:")
    tables: dict[str, pa.Table] = truth_tables(truth)
    for name, table in tables.items():
        con.register(name, table)
    yield con
    con.close()
