"""Tables of every key kind, written by :func:`sparkiq.testing.write_table` (no Spark), with
their ground truth.

``build_world(state_dir)`` writes:

- ``t``: the helpers' string-keyed table (k string, n long), three batches with updates
  and deletions;
- ``w``: the helpers' wide table (string, long, double, date, struct with an array);
- ``ck``: a composite key (region string, id int) with amount decimal(10,2) and ts timestamp;
- ``ik`` (int key), ``dk`` (date key), ``tk`` (timestamp key), ``xk`` (decimal key),
  ``lk`` (long key), each with a value column ``v`` long;
- ``win``: a windowed table (k string, window struct<start,end>, clicks long).

and returns the ground truth: table name -> (Arrow schema, list of row dicts as PySpark
returns them), to load into DuckDB directly.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa

from sparkiq.testing import write_table
from tests.changelog.helpers import (
    WIDE_ARROW,
    apply_changes,
    expected_rows,
    make_table,
    make_wide_table,
    write_batch,
    write_rows,
)

Truth = dict[str, tuple[pa.Schema, list[dict[str, Any]]]]

T_HISTORY: list[dict[str, int | None]] = [
    {f"k{i:03d}": i for i in range(200)},
    {f"k{i:03d}": i * 10 for i in range(0, 200, 3)},
    {f"k{i:03d}": None for i in range(0, 200, 7)} | {"new": 1},
]

WINDOW_TYPE = pa.struct([("start", pa.timestamp("us")), ("end", pa.timestamp("us"))])


CK_ARROW = pa.schema(
    [
        ("region", pa.string()),
        ("id", pa.int32()),
        ("amount", pa.decimal128(10, 2)),
        ("ts", pa.timestamp("us")),
    ]
)
WIN_ARROW = pa.schema([("k", pa.string()), ("window", WINDOW_TYPE), ("clicks", pa.int64())])
BASE = dt.datetime(2024, 3, 1, 0, 0)


def _wide_history() -> list[dict[Any, dict[str, Any] | None]]:
    first: dict[Any, dict[str, Any] | None] = {}
    for i in range(120):
        key = f"w{i:03d}"
        first[key] = {
            "k": key,
            "n": i if i % 11 else None,
            "tag": ["red", "green", "blue", None][i % 4],
            "price": round(i * 1.25, 2),
            "day": dt.date(2024, 1, 1) + dt.timedelta(days=i % 40),
            "info": {"a": i % 5, "tags": [f"x{i % 3}"]},
        }
    second: dict[Any, dict[str, Any] | None] = {f"w{i:03d}": None for i in range(0, 120, 10)}
    return [first, second]


def build_world(state_dir: str) -> Truth:
    truth: Truth = {}
    changelog = make_table(state_dir, "t")
    for batch_id, rows in enumerate(T_HISTORY):
        write_batch(changelog, batch_id, rows)
    t_schema = pa.schema([("k", pa.string()), ("n", pa.int64())])
    truth["t"] = (t_schema, list(expected_rows(T_HISTORY).values()))

    wide = make_wide_table(state_dir, "w")
    history = _wide_history()
    for batch_id, changes in enumerate(history):
        write_rows(wide, batch_id, changes)
    truth["w"] = (WIDE_ARROW, list(apply_changes(history).values()))

    ck_rows = [
        {
            "region": region,
            "id": i,
            "amount": Decimal(f"{i * 3 + r}.{(i * 7) % 100:02d}"),
            "ts": BASE + dt.timedelta(hours=i * 5 + r),
        }
        for r, region in enumerate(["eu", "us", "apac", "eu-west"])
        for i in range(-5, 40)
    ]
    write_table(state_dir, "ck", ck_rows, key=["region", "id"], schema=CK_ARROW)
    truth["ck"] = (CK_ARROW, ck_rows)

    singles: dict[str, tuple[pa.DataType, list[Any]]] = {
        "ik": (pa.int32(), list(range(-50, 150, 3))),
        "lk": (pa.int64(), [i * 10_000_000_019 for i in range(-20, 60)]),
        "dk": (pa.date32(), [dt.date(2023, 12, 1) + dt.timedelta(days=i) for i in range(90)]),
        "tk": (pa.timestamp("us"), [BASE + dt.timedelta(minutes=37 * i) for i in range(120)]),
        "xk": (pa.decimal128(12, 3), [Decimal(i * 7 - 100) / 8 for i in range(80)]),
    }
    for name, (key_type, values) in singles.items():
        arrow = pa.schema([("key", key_type), ("v", pa.int64())])
        if name == "xk":
            values = [v.quantize(Decimal("0.001")) for v in values]
        rows = [{"key": value, "v": i} for i, value in enumerate(values)]
        write_table(state_dir, name, rows, key="key", schema=arrow)
        truth[name] = (arrow, rows)

    win_rows = []
    for key in ["a", "b", "c", "d", "e"]:
        for h in range(0, 24, 2):
            start = BASE + dt.timedelta(hours=h)
            window = {"start": start, "end": start + dt.timedelta(hours=2)}
            win_rows.append({"k": key, "window": window, "clicks": h * 10 + ord(key)})
    win = write_table(state_dir, "win", win_rows, key="k", window="window", schema=WIN_ARROW)
    gone = [r for r in win_rows if r["k"] == "e" and r["window"]["start"].hour % 4 == 0]
    win.write(deletes=[(r["k"], r["window"]["start"]) for r in gone])
    win_truth = [r for r in win_rows if r not in gone]
    truth["win"] = (WIN_ARROW, win_truth)
    return truth


def truth_tables(truth: Truth) -> dict[str, pa.Table]:
    """Ground truth as Arrow tables (windowed ones with WINDOWSTART/WINDOWEND)."""
    tables = {}
    for name, (schema, rows) in truth.items():
        table = pa.Table.from_pylist(rows, schema=schema)
        if "window" in schema.names:
            window = table.column("window")
            table = table.append_column(
                "WINDOWSTART", pa.chunked_array([c.field("start") for c in window.chunks])
            ).append_column("WINDOWEND", pa.chunked_array([c.field("end") for c in window.chunks]))
        tables[name] = table
    return tables
