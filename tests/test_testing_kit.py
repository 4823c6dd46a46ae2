"""sparkiq.testing without Spark: tables written from Python rows, an in-process cluster, SQL
answers compared in any order, and the guide's example of them, run with pyspark unimportable.

The ground truth of every table is a dict model of its batches, computed here; what the
nodes serve must equal it key by key and through SQL.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys
import textwrap
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkiq import Node
from sparkiq.errors import LayoutMismatchError
from sparkiq.testing import (
    assert_sql_rows,
    start_cluster,
    table_rows,
    write_table,
)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"
T0 = dt.datetime(2024, 3, 1, 12, 0)


def _window(minutes: int) -> dict[str, dt.datetime]:
    start = T0 + dt.timedelta(minutes=minutes)
    return {"start": start, "end": start + dt.timedelta(minutes=5)}


def test_batches_of_upserts_and_deletes_are_served_as_the_model_says(tmp_path: Path) -> None:
    state = str(tmp_path)
    model: dict[Any, dict[str, Any]] = {}
    batches = [
        [
            {
                "k": f"k{i}",
                "n": i,
                "price": i / 4,
                "day": dt.date(2024, 1, 1 + i % 28),
                "info": {"a": i, "tags": [f"t{i % 3}"]},
                "amount": Decimal(f"{i}.25"),
            }
            for i in range(40)
        ],
        [
            {
                "k": f"k{i}",
                "n": -i,
                "price": None,
                "day": None,
                "info": None,
                "amount": Decimal("0.00"),
            }
            for i in range(0, 40, 3)
        ],
    ]
    deletes = [[], [f"k{i}" for i in range(1, 40, 5)] + ["never-written"]]
    writer = None
    for rows, gone in zip(batches, deletes, strict=True):
        writer = write_table(state, "t", rows, key="k", deletes=gone, partitions=3)
        model.update({row["k"]: row for row in rows})
        for key in gone:
            model.pop(key, None)
    assert writer is not None and writer.changelog.committed_batch_ids() == [0, 1]
    types = {f.name: f.type.simple_string() for f in writer.manifest.schema.fields}
    assert types == {
        "k": "string",
        "n": "bigint",
        "price": "double",
        "day": "date",
        "info": "struct<a:bigint,tags:array<string>>",
        "amount": "decimal(4,2)",
    }
    # composite keys, from an Arrow schema; windowed keys, deleted by (key, window start)
    pairs = pa.schema([("region", pa.string()), ("id", pa.int32()), ("v", pa.float64())])
    write_table(
        state,
        "pairs",
        [{"region": "eu", "id": i, "v": i * 1.5} for i in range(6)],
        key=["region", "id"],
        schema=pairs,
        partitions=2,
    )
    write_table(state, "pairs", deletes=[("eu", 0), ("eu", 5)])
    win = write_table(
        state,
        "win",
        [{"k": k, "window": _window(m), "clicks": m} for k in "ab" for m in (0, 5, 10)],
        key="k",
        window="window",
    )
    win.write([{"k": "a", "window": _window(5), "clicks": 99}], deletes=[("b", T0)])

    with Node(state) as node:
        node.poll_once()
        assert table_rows(node, "t") == model
        assert table_rows(node, "pairs") == {
            ("eu", i): {"region": "eu", "id": i, "v": i * 1.5} for i in range(1, 5)
        }
        windows = table_rows(node, "win")
        assert sorted(windows) == sorted(
            (k, T0 + dt.timedelta(minutes=m))
            for k in "ab"
            for m in (0, 5, 10)
            if (k, m) != ("b", 0)
        )
        assert windows[("a", T0 + dt.timedelta(minutes=5))]["clicks"] == 99
        assert node.get("t", "k3") == model["k3"]
        assert_sql_rows(
            node,
            "SELECT k, n FROM t WHERE n < 0",
            [{"k": r["k"], "n": r["n"]} for r in model.values() if r["n"] < 0],
        )


def test_a_batch_left_uncommitted_is_not_served_and_batch_ids_follow(tmp_path: Path) -> None:
    state = str(tmp_path)
    writer = write_table(state, "t", [{"k": "a", "n": 1}], key="k")
    record = writer.write([{"k": "a", "n": 2}], commit=False)
    assert record.batch_id == 1 and writer.changelog.committed_batch_ids() == [0]
    with Node(state) as node:
        node.poll_once()
        assert node.get("t", "a") == {"k": "a", "n": 1}
    again = write_table(state, "t", [{"k": "a", "n": 3}], batch_id=1)  # the re-run commits
    assert again.changelog.committed_batch_ids() == [0, 1]
    assert write_table(state, "t", [{"k": "b", "n": 0}]).changelog.committed_batch_ids()[-1] == 2


def test_bad_input_is_refused_naming_the_problem(tmp_path: Path) -> None:
    state = str(tmp_path)
    with pytest.raises(ValueError, match=r"give key="):
        write_table(state, "t", [{"k": "a"}])
    with pytest.raises(ValueError, match=r"column 'n' is None in every row: pass schema="):
        write_table(state, "t", [{"k": "a", "n": None}], key="k")
    with pytest.raises(ValueError, match=r"give schema= or rows"):
        write_table(state, "t", key="k")
    write_table(state, "t", [{"k": "a", "n": 1}], key="k", partitions=2)
    with pytest.raises(LayoutMismatchError, match=r"partitions"):
        write_table(state, "t", [{"k": "a", "n": 1}], partitions=3)
    with pytest.raises(ValueError, match=r"columns \['x'\] the table does not have"):
        write_table(state, "t", [{"k": "a", "x": 1}])
    with pytest.raises(ValueError, match=r"do not fit its columns \(k string, n bigint\)"):
        write_table(state, "t", [{"k": "a", "n": "many"}])
    win = write_table(
        state, "w", [{"k": "a", "window": _window(0), "n": 1}], key="k", window="window"
    )
    with pytest.raises(ValueError, match=r"windowed: delete \(key, window start\) pairs"):
        win.write(deletes=["a"])
    with pytest.raises(ValueError, match=r"at least one node"):
        start_cluster(state, nodes=0)


class _Answers:
    """A source whose SQL answer is fixed: assert_sql_rows' comparison alone."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self.rows = rows

    def sql(self, text: str) -> _Answers:
        return self


def test_sql_rows_are_compared_as_a_multiset_or_in_order() -> None:
    rows = [
        {"k": "a", "n": 1, "tags": ["x"]},
        {"k": "b", "n": 2, "tags": []},
        {"k": "b", "n": 2, "tags": []},
    ]
    answers = _Answers(rows)
    assert_sql_rows(answers, "q", [rows[2], {"n": 1, "tags": ["x"], "k": "a"}, rows[1]])
    with pytest.raises(
        AssertionError, match=r"1 missing, 1 unexpected\n  missing    \{'k': 'a', 'n': 2"
    ):
        assert_sql_rows(answers, "q", [{"k": "a", "n": 2, "tags": ["x"]}, rows[1], rows[2]])
    with pytest.raises(AssertionError, match=r"0 missing, 1 unexpected"):  # duplicates count
        assert_sql_rows(answers, "q", rows[:2])
    assert_sql_rows(answers, "q", rows, ordered=True)
    with pytest.raises(AssertionError, match=r"first difference at row 0"):
        assert_sql_rows(answers, "q", [rows[1], rows[0], rows[2]], ordered=True)
    assert_sql_rows(answers, "q", [{"k": r["k"]} for r in rows], normalize=lambda r: {"k": r["k"]})


def test_a_cluster_without_sockets_routes_and_refuses_a_client(tmp_path: Path) -> None:
    state = str(tmp_path)
    write_table(state, "t", [{"k": f"k{i}", "n": i} for i in range(30)], key="k", partitions=4)
    with start_cluster(state, nodes=2, http=False, standbys=0) as cluster:
        assert len(cluster) == 2 and cluster.urls == []
        hosted = [set(node.replica("t").partitions) for node in cluster]
        assert hosted[0] | hosted[1] == {0, 1, 2, 3} and not hosted[0] & hosted[1]
        for node in cluster:  # each answers every key, half of them routed to the other
            assert table_rows(node, "t") == {f"k{i}": {"k": f"k{i}", "n": i} for i in range(30)}
        with pytest.raises(RuntimeError, match=r"start_cluster\(\.\.\., http=True\)"):
            cluster.client()


def guide_example() -> str:
    text = GUIDE.read_text()
    section = text[text.index("### Testing what serves tables, without Spark") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the guide's section on testing without Spark has a python example"
    return match.group(1)


def test_the_guides_example_runs_as_written_with_pyspark_unimportable() -> None:
    """In a fresh interpreter where ``import pyspark`` fails: no JVM and no pyspark needed."""
    code = textwrap.dedent(
        """
        import sys
        sys.modules["pyspark"] = None  # any import of pyspark now raises ImportError
        namespace = {"__name__": "guide_example"}
        exec(compile(sys.stdin.read(), "guide.md", "exec", dont_inherit=True), namespace)
        assert namespace["served"] == [{"n": 2}], namespace["served"]
        assert sys.modules["pyspark"] is None and "py4j" not in sys.modules
        print("ok")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=guide_example(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


def test_naive_datetimes_are_local_time_as_in_pyspark(tmp_path: Path) -> None:
    """Under a zone that is not UTC, a naive timestamp (a column, a key, a window start)
    comes back as written and finds its key: it was stored as the local time it names."""
    code = textwrap.dedent(
        f"""
        import datetime as dt
        from sparkiq import Node
        from sparkiq.testing import table_rows, write_table
        t = dt.datetime(2024, 3, 10, 1, 30)
        write_table({str(tmp_path)!r}, "at", [{{"ts": t, "n": 1}}], key="ts")
        write_table({str(tmp_path)!r}, "w", [{{"k": "a", "window": {{"start": t, "end": t}}}}],
                    key="k", window="window")
        with Node({str(tmp_path)!r}) as node:
            node.poll_once()
            assert node.get("at", t) == {{"ts": t, "n": 1}}, node.get("at", t)
            assert list(table_rows(node, "w")) == [("a", t)], table_rows(node, "w")
            assert node.sql("SELECT ts FROM at").rows == [{{"ts": t}}]
        """
    )
    env = {**os.environ, "TZ": "America/New_York"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
