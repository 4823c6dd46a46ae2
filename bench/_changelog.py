"""The table the benchmarks that do not measure Spark build, through the testing kit.

:func:`open_table` is :func:`sparkiq.testing.write_table` for a typical aggregation table
(a string key, a count and a sum); its :class:`~sparkiq.testing.TableWriter` encodes rows
with the table's own codecs and partitions them as the sink's ``pmod(hash(key), P)`` does, so
a :class:`~sparkiq.Node` reads them exactly as it reads a Spark-written changelog.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pyarrow as pa

from sparkiq import Node
from sparkiq.testing import TableWriter, write_table

#: A typical aggregation row: a string key, a count and a sum.
SCHEMA_JSON = {
    "type": "struct",
    "fields": [
        {"name": "k", "type": "string", "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
        {"name": "total", "type": "double", "nullable": True, "metadata": {}},
    ],
}

#: Encoded changes of a batch, by partition (what ``TableWriter.changes`` returns).
Changes = dict[int, dict[bytes, bytes | None]]


def key_name(i: int) -> str:
    return f"key-{i:08d}"


def open_table(state_dir: str, name: str, partitions: int = 8) -> TableWriter:
    """The table ``name`` (``k string`` key, ``n long``, ``total double``) in ``state_dir``,
    created when new."""
    return write_table(state_dir, name, key="k", schema=SCHEMA_JSON, partitions=partitions)


def as_arrow(keys: Sequence[str], ns: Sequence[int], totals: Sequence[float]) -> pa.Table:
    """The rows ``(k, n, total)`` as an Arrow table (cheaper to build than dicts)."""
    return pa.table(
        {
            "k": pa.array(keys, pa.string()),
            "n": pa.array(ns, pa.int64()),
            "total": pa.array(totals, pa.float64()),
        }
    )


@contextlib.contextmanager
def caught_up_node(state_dir: str, partitions: int) -> Iterator[Node]:
    """A :class:`~sparkiq.Node` over the tables in ``state_dir`` that has applied every
    committed batch (checked: one poll applied ``partitions`` partitions); stopped on exit."""
    node = Node(state_dir)
    try:
        node.refresh_tables()
        applied = node.poll_once()
        assert applied == partitions, (applied, partitions)
        yield node
    finally:
        node.stop()
