"""Whether a micro-batch already sits in the table's partitions, so the sink need not shuffle.

A streaming aggregation's output is hash-partitioned by its grouping columns into the
state's partitions: Spark requires its stateful operators' input to be distributed as
``pmod(murmur3(grouping columns), N)`` with ``N`` the state's partition count
(``spark.sql.streaming.statefulOperator.useStrictDistribution``), and a projection after
the operator keeps that placement. That is exactly the sink's own tag
``pmod(hash(key columns), P)`` (Spark's ``hash`` is Murmur3 with the same seed) when the key
columns are the grouping columns in the same order and ``P == N``. Then task ``i`` of the
batch holds exactly the rows of partition ``i``, and each task can write its own partition's
segment where it is, without a shuffle.

:func:`batch_layout` decides this on the driver from what Spark writes into the query's
checkpoint before it runs a batch, the same with a classic and a Spark Connect session:

* ``state/`` holds exactly one stateful operator, and its metadata
  (``state/0/_metadata/metadata``: JSON after a version line) names a streaming aggregation
  (``stateStoreSave``) with one store of ``N`` partitions;
* the state's key schema (``state/0/0/_metadata/schema``: Spark's schema file, which holds
  the key schema as the first JSON struct) lists exactly the key columns, in order.

Anything else - another operator (deduplication, joins, ``flatMapGroupsWithState``), several
operators, a windowed aggregation (its state key adds the window), a missing or unreadable
file - means the general path: tag, shuffle, write. The decision is only a guess about
Spark's plan, so the write task checks it for every row (see :mod:`sparkiq.spark.sink`):
a row whose tag is not the task's partition fails the batch before the task writes
anything, and nothing is committed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sparkiq.changelog.storage import Storage
from sparkiq.errors import ChangelogError

__all__ = ["AGGREGATION_OPERATOR", "BatchLayout", "batch_layout"]

#: Spark's operator name for a streaming aggregation's state (``StateStoreSaveExec``).
AGGREGATION_OPERATOR = "stateStoreSave"


@dataclass(frozen=True, slots=True)
class BatchLayout:
    """The sink's decision for a query: ``in_place`` when every batch's task ``i`` holds
    exactly the rows of partition ``i`` (write without a shuffle); ``reason`` says why or
    why not, for logs and errors."""

    in_place: bool
    reason: str
    #: True when decided from the stateful operator's files, which stay as they are for the
    #: checkpoint's life (its partitions and key cannot change): the decision can be kept.
    settled: bool = False


def batch_layout(checkpoint: Storage, key_columns: tuple[str, ...], partitions: int) -> BatchLayout:
    """Decide from the query's checkpoint (``checkpoint``: its root) whether its batches are
    partitioned like the table (key ``key_columns``, ``partitions`` partitions); see the
    module docstring. Never raises for what it finds: anything unexpected is the general
    path, with the reason."""
    state = checkpoint.path("state")
    try:
        operators = sorted(n for n in checkpoint.list_names(state) if n.isdigit())
    except (OSError, ChangelogError):
        operators = []
    if not operators:
        return BatchLayout(False, "the query has no stateful operator")
    if operators != ["0"]:
        return BatchLayout(False, f"the query has {len(operators)} stateful operators", True)
    metadata = _json_after_version(
        checkpoint, checkpoint.path("state", "0", "_metadata", "metadata")
    )
    if metadata is None:
        return BatchLayout(False, "the state operator's metadata is missing or unreadable")
    info, stores = metadata.get("operatorInfo"), metadata.get("stateStoreInfo")
    operator = str(info.get("operatorName", "")) if isinstance(info, dict) else ""
    if (
        operator != AGGREGATION_OPERATOR
        or not isinstance(stores, list)
        or len(stores) != 1
        or not isinstance(stores[0], dict)
    ):
        return BatchLayout(
            False, f"the stateful operator is {operator!r}, not an aggregation", True
        )
    state_partitions = stores[0].get("numPartitions")
    if state_partitions != partitions:
        return BatchLayout(
            False,
            f"the aggregation's state has {state_partitions} partitions, the table {partitions}",
            True,
        )
    key_schema = _first_json_struct(
        checkpoint, checkpoint.path("state", "0", "0", "_metadata", "schema")
    )
    if key_schema is None:
        return BatchLayout(False, "the aggregation's state key schema is missing or unreadable")
    grouping = tuple(str(f.get("name")) for f in key_schema.get("fields", []))
    if grouping != tuple(key_columns):
        return BatchLayout(
            False,
            f"the aggregation groups by {list(grouping)}, the table's key is {list(key_columns)}",
            True,
        )
    return BatchLayout(
        True,
        f"an aggregation by the key {list(key_columns)} into {partitions} state partitions",
        True,
    )


def _read(checkpoint: Storage, path: str) -> bytes | None:
    try:
        return checkpoint.read_bytes(path)
    except (OSError, ChangelogError):  # FileNotFoundError is an OSError
        return None


def _json_after_version(checkpoint: Storage, path: str) -> dict[str, Any] | None:
    """The JSON object on the line after Spark's version line (``v1``)."""
    data = _read(checkpoint, path)
    if data is None:
        return None
    lines = data.decode("utf-8", "replace").splitlines()
    try:
        found = json.loads(lines[1]) if len(lines) > 1 else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def _first_json_struct(checkpoint: Storage, path: str) -> dict[str, Any] | None:
    """The first JSON struct type in a Spark schema file: the state's key schema. The file
    frames each JSON text with binary lengths (their layout differs between Spark's schema
    file versions), so the text is found by its opening and parsed from there."""
    data = _read(checkpoint, path)
    if data is None:
        return None
    start = data.find(b'{"type":"struct"')
    if start < 0:
        return None
    try:
        found, _ = json.JSONDecoder().raw_decode(data[start:].decode("utf-8", "replace"))
    except ValueError:
        return None
    return found if isinstance(found, dict) and found.get("type") == "struct" else None
