"""A 100k-row SQL result through ``POST /query``: Arrow IPC stream vs JSON, on one node.

A table of 100k rows in 8 partitions (a string key, a long, a double, a ``decimal(12,2)``, a
``timestamp`` and a short string) is written by hand (no Spark) and served by one
:class:`~sparkiq.Node` (RocksDB) on 127.0.0.1. ``SELECT * FROM wide`` is fetched, until the
caller holds the data in its usual form, by:

* the floor: ``node.sql`` in the node's own process (computing the result, no HTTP);
* REST JSON: ``POST /query`` with httpx, body parsed with orjson (a list of dicts);
* REST Arrow: the same with ``Accept: application/vnd.apache.arrow.stream``, body read as
  a ``pyarrow.Table``;
* ``Client.sql(text)`` (rows, MessagePack) and ``Client.sql(text, format="arrow")
  .to_arrow()``;
* pandas: ``pd.DataFrame(Client.sql(text).rows)`` vs ``Client.sql(..., format="arrow")
  .to_pandas()``.

Methods take turns, so drift on the shared machine hits every method alike; each call is
timed on its own and reported as a median. Client and node share one process and the two
cores: the figures are one caller's latency, not the node's capacity.

Run: ``python -m bench.arrow [--quick | --smoke]``.
"""

from __future__ import annotations

import datetime as dt
import random
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any

import httpx
import orjson
import pandas as pd
import pyarrow as pa

from bench._common import Report, Scale, entry_point, median, scratch_dir, timed_in_turns
from sparkiq import Client, Node
from sparkiq.changelog import Changelog, CommitRecord, TableManifest
from sparkiq.schema.arrowtypes import arrow_type
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.wire import arrowipc

TABLE = "wide"
PARTITIONS = 8
SQL = f"SELECT * FROM {TABLE}"
PANDAS_ROWS = "pandas: DataFrame(Client.sql(...).rows)"
PANDAS_ARROW = 'pandas: Client.sql(..., format="arrow").to_pandas()'
_COLUMNS = [
    ("k", "string"),
    ("n", "long"),
    ("total", "double"),
    ("amount", "decimal(12,2)"),
    ("seen", "timestamp"),
    ("tag", "string"),
]


def _build(state_dir: str, rows: int) -> None:
    """Write ``rows`` rows as batch 0, encoded and partitioned as the sink does."""
    doc = {
        "type": "struct",
        "fields": [{"name": n, "type": t, "nullable": True, "metadata": {}} for n, t in _COLUMNS],
    }
    schema = TableSchema.from_spark_json(doc, ["k"])
    changelog = Changelog(state_dir, TABLE)
    TableManifest(name=TABLE, schema=schema, partitions=PARTITIONS).ensure_written(
        changelog.storage, changelog.manifest_path
    )
    rng = random.Random(5)
    start = dt.datetime(2025, 1, 1)
    keys = [f"key-{i:08d}" for i in range(rows)]
    table = pa.table(
        {
            "k": keys,
            "n": [rng.randrange(1, 10_000) for _ in keys],
            "total": [rng.random() * 1000 for _ in keys],
            "amount": [Decimal(rng.randrange(-(10**8), 10**8)) / 100 for _ in keys],
            "seen": [start + dt.timedelta(seconds=rng.randrange(10**7)) for _ in keys],
            "tag": [rng.choice(["red", "green", "blue", None]) for _ in keys],
        },
        schema=pa.schema([(f.name, arrow_type(f.type, timestamp_tz=None)) for f in schema.fields]),
    )
    key_codec, row_codec = KeyCodec(schema), RowCodec(schema)
    partitioner = Partitioner(schema.key_types, PARTITIONS)
    changes: dict[int, dict[bytes, bytes | None]] = {}
    for key, encoded, value in zip(
        keys, key_codec.encode_arrow(table), row_codec.encode_arrow(table), strict=True
    ):
        changes.setdefault(partitioner(key_codec.to_internal(key)), {})[encoded] = value
    segments = {p: changelog.write_segment(p, 0, c) for p, c in changes.items()}
    changelog.write_commit(
        CommitRecord(
            table=TABLE, batch_id=0, mode="update", segments=segments, committed_at=time.time()
        )
    )


def run(scale: Scale = Scale.FULL) -> Report:
    rows, rounds = scale.pick((100_000, 7), (20_000, 3), (500, 1))
    with scratch_dir("arrow") as state_dir:
        _build(state_dir, rows)
        node = Node(state_dir, listen="127.0.0.1:0")
        node.start()
        try:
            node.poll_once()
            assert node.url is not None
            http = httpx.Client(base_url=node.url, timeout=120)
            client = Client(node.url)
            sizes: dict[str, int] = {}

            def floor() -> int:
                return len(node.sql(SQL).rows)

            def rest_json() -> int:
                answer = http.post("/query", json={"sql": SQL})
                assert answer.status_code == 200, answer.text
                sizes["json"] = len(answer.content)
                return len(orjson.loads(answer.content)["rows"])

            def rest_arrow() -> int:
                answer = http.post(
                    "/query", json={"sql": SQL}, headers={"accept": arrowipc.CONTENT_TYPE}
                )
                assert answer.status_code == 200, answer.text
                sizes["arrow"] = len(answer.content)
                count: int = arrowipc.read_table(answer.content).num_rows
                return count

            def client_rows() -> int:
                return len(client.sql(SQL).rows)

            def client_arrow() -> int:
                count: int = client.sql(SQL, format="arrow").to_arrow().num_rows
                return count

            def pandas_rows() -> int:
                return len(pd.DataFrame(client.sql(SQL).rows))

            def pandas_arrow() -> int:
                return len(client.sql(SQL, format="arrow").to_pandas())

            methods: dict[str, Callable[[], int]] = {
                "floor: node.sql in-process": floor,
                "REST: POST /query, JSON (orjson.loads)": rest_json,
                "REST: POST /query, Arrow IPC (pyarrow table)": rest_arrow,
                "Client.sql(...).rows (MessagePack)": client_rows,
                'Client.sql(..., format="arrow").to_arrow()': client_arrow,
                PANDAS_ROWS: pandas_rows,
                PANDAS_ARROW: pandas_arrow,
            }
            times = timed_in_turns(methods, rounds, rows)
            http.close()
            client.close()
        finally:
            node.stop()
    report = Report(
        name="arrow",
        title="SQL results as Arrow vs JSON: a 100k-row result over HTTP",
        measures=f"`{SQL}` ({rows:,} rows of 6 columns: string key, long, double, "
        "decimal(12,2), timestamp, string; 8 partitions, RocksDB), from the request until "
        f"the caller holds the data; {rounds} calls per method after one warm-up, methods "
        "taking turns; client and node in one process",
        baseline="floor: `node.sql` of the same statement in the node's process (the result "
        "every method first computes); JSON through the same `POST /query`",
        target="none (a comparison)",
        columns=["method", "median ms", "vs floor", "vs JSON"],
        scale=scale,
    )
    medians = {name: median(values) for name, values in times.items()}
    base = medians["floor: node.sql in-process"]
    json_ms = medians["REST: POST /query, JSON (orjson.loads)"]
    for name, value in medians.items():
        report.rows.append(
            [name, f"{value * 1e3:,.0f}", f"{value / base:.2f}x", f"{value / json_ms:.2f}x"]
        )
    arrow_ms = medians["REST: POST /query, Arrow IPC (pyarrow table)"]
    client_rows_ms = medians["Client.sql(...).rows (MessagePack)"]
    client_arrow_ms = medians['Client.sql(..., format="arrow").to_arrow()']
    report.readings.append(
        f"{rows:,} rows through POST /query: Arrow {arrow_ms * 1e3:,.0f} ms vs JSON "
        f"{json_ms * 1e3:,.0f} ms ({arrow_ms / json_ms:.2f}x JSON's time, "
        f"{sizes['arrow'] / sizes['json']:.2f}x its bytes), of which node.sql "
        f"{base * 1e3:,.0f} ms; Client: to_arrow {client_arrow_ms * 1e3:,.0f} ms vs rows "
        f"{client_rows_ms * 1e3:,.0f} ms ({client_rows_ms / client_arrow_ms:.1f}x faster), "
        f"to_pandas {medians[PANDAS_ARROW] * 1e3:,.0f} ms vs DataFrame(rows) "
        f"{medians[PANDAS_ROWS] * 1e3:,.0f} ms"
    )
    report.notes.append(
        f"response bodies: Arrow IPC {sizes['arrow']:,} bytes, JSON {sizes['json']:,} bytes"
    )
    report.figures = {"median_s": medians, "bytes": sizes}
    return report


main: Callable[..., dict[str, Any]] = entry_point(run, __doc__)

if __name__ == "__main__":
    main()
