"""Tables of the changelog tests (a string-keyed count, a wide table), written through
:func:`sparkiq.testing.write_table`, and the ground truth of a history of batches."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from sparkiq.changelog import Changelog, CommitRecord
from sparkiq.testing import TableWriter, write_table

SCHEMA_JSON = {
    "type": "struct",
    "fields": [
        {"name": "k", "type": "string", "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
    ],
}
ARROW = pa.schema([("k", pa.string()), ("n", pa.int64())])


def create_changelog(
    state_dir: str,
    name: str,
    schema_json: Any,
    keys: Sequence[str] = ("k",),
    *,
    window: str | None = None,
    partitions: int = 4,
    mode: str = "update",
) -> Changelog:
    """The changelog of a new table of Spark schema ``schema_json``, its manifest written."""
    writer = write_table(
        state_dir,
        name,
        key=list(keys),
        schema=schema_json,
        window=window,
        partitions=partitions,
        output_mode=mode,
    )
    return writer.changelog


def make_table(
    state_dir: str, name: str = "t", partitions: int = 4, mode: str = "update"
) -> Changelog:
    return create_changelog(state_dir, name, SCHEMA_JSON, partitions=partitions, mode=mode)


def write_batch(
    changelog: Changelog,
    batch_id: int,
    rows: dict[str, int | None],
    *,
    commit: bool = True,
    position: dict[str, dict[int, int]] | None = None,
) -> CommitRecord:
    """Write ``{key: n}`` (None deletes the key) to a :func:`make_table` table as batch
    ``batch_id``."""
    changes = {key: None if n is None else {"k": key, "n": n} for key, n in rows.items()}
    return write_rows(changelog, batch_id, changes, commit=commit, position=position)


def expected_rows(history: list[dict[str, int | None]]) -> dict[str, dict[str, Any]]:
    state: dict[str, dict[str, Any]] = {}
    for batch in history:
        for key, n in batch.items():
            if n is None:
                state.pop(key, None)
            else:
                state[key] = {"k": key, "n": n}
    return state


# A table with a column of most kinds, for subsets (filters, projections) of whole rows.
WIDE_SCHEMA_JSON = {
    "type": "struct",
    "fields": [
        {"name": "k", "type": "string", "nullable": True, "metadata": {}},
        {"name": "n", "type": "long", "nullable": True, "metadata": {}},
        {"name": "tag", "type": "string", "nullable": True, "metadata": {}},
        {"name": "price", "type": "double", "nullable": True, "metadata": {}},
        {"name": "day", "type": "date", "nullable": True, "metadata": {}},
        {
            "name": "info",
            "type": {
                "type": "struct",
                "fields": [
                    {"name": "a", "type": "integer", "nullable": True, "metadata": {}},
                    {
                        "name": "tags",
                        "type": {"type": "array", "elementType": "string", "containsNull": True},
                        "nullable": True,
                        "metadata": {},
                    },
                ],
            },
            "nullable": True,
            "metadata": {},
        },
    ],
}
WIDE_ARROW = pa.schema(
    [
        ("k", pa.string()),
        ("n", pa.int64()),
        ("tag", pa.string()),
        ("price", pa.float64()),
        ("day", pa.date32()),
        ("info", pa.struct([("a", pa.int32()), ("tags", pa.list_(pa.string()))])),
    ]
)


def make_wide_table(
    state_dir: str, name: str = "w", partitions: int = 4, mode: str = "update"
) -> Changelog:
    return create_changelog(state_dir, name, WIDE_SCHEMA_JSON, partitions=partitions, mode=mode)


def write_rows(
    changelog: Changelog,
    batch_id: int,
    changes: Mapping[Any, Mapping[str, Any] | None],
    *,
    commit: bool = True,
    position: Mapping[str, Mapping[int, int]] | None = None,
) -> CommitRecord:
    """Write ``{key: row dict}`` (None deletes the key) as batch ``batch_id`` (unless
    ``commit`` is false, without its commit record), through the testing kit and
    ``changelog``'s storage (the fault tests' writer gives it a faulty one)."""
    writer = TableWriter(changelog)
    rows = [row for row in changes.values() if row is not None]
    deletes = [key for key, row in changes.items() if row is None]
    return writer.write(rows, deletes=deletes, batch_id=batch_id, commit=commit, position=position)


def apply_changes(
    history: Sequence[Mapping[Any, Mapping[str, Any] | None]],
) -> dict[Any, dict[str, Any]]:
    """The table after ``history`` (update mode): key -> row."""
    state: dict[Any, dict[str, Any]] = {}
    for batch in history:
        for key, row in batch.items():
            if row is None:
                state.pop(key, None)
            else:
                state[key] = dict(row)
    return state


def wait_for_writer(
    state_dir: str, table: str, state: str, timeout: float = 120.0, *, batch_id: int | None = None
) -> Any:
    """The writer status record of ``table`` once it says ``state`` (and, running, has the
    figures of a finished batch; with ``batch_id``, once it names that committed batch: a
    record written between Spark's progress and the driver learning of the commit names
    the one before); fails after ``timeout`` s (generous: a busy machine)."""
    from sparkiq.changelog import open_storage
    from sparkiq.changelog.writer_status import read_writer_status

    deadline = time.monotonic() + timeout
    while True:
        record = read_writer_status(open_storage(state_dir), table)
        finished = state != "running" or (record and record.batch_duration_ms is not None)
        batch = batch_id is None or (record and record.batch_id == batch_id)
        if record is not None and record.state == state and finished and batch:
            return record
        assert time.monotonic() < deadline, f"writer of {table!r} never {state}: {record}"
        time.sleep(0.05)
