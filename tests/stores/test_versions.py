"""VersionedRows against a plain model: the rows at every retained batch, merges, history
limits, versions of a key, and what a reader holding an old version keeps seeing."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest

from sparkiq.query.position import Position
from sparkiq.schema.codec import KeyCodec, RowCodec
from sparkiq.schema.types import TableSchema
from sparkiq.stores.versions import OPEN, BatchOutOfHistory, History, VersionedRows
from tests.changelog.helpers import ARROW, SCHEMA_JSON

SCHEMA = TableSchema.from_spark_json(SCHEMA_JSON, ["k"])
KEYS = KeyCodec(SCHEMA)
ROWS = RowCodec(SCHEMA)


def encode(changes: dict[str, int | None]) -> tuple[list[bytes], list[bytes | None]]:
    names = sorted(changes)
    keys = [KEYS.encode(KEYS.to_internal(k)) for k in names]
    kept = [k for k in names if changes[k] is not None]
    encoded = ROWS.encode_arrow(
        pa.table({"k": kept, "n": [changes[k] for k in kept]}, schema=ARROW).to_batches()[0]
        if kept
        else pa.table({"k": [], "n": []}, schema=ARROW)
    )
    by_key = dict(zip(kept, encoded, strict=True))
    return keys, [by_key.get(k) for k in names]


def state_of(version: Any) -> dict[str, int]:
    """``{k: n}`` of a version's rows, decoded from its Arrow columns and from the encoded rows
    (both must agree)."""
    table = version.table(["k", "n"])
    columnar = dict(zip(table.column("k").to_pylist(), table.column("n").to_pylist(), strict=True))
    pairs = version.pairs(None, None)
    decoded = {ROWS.decode(v)["k"]: ROWS.decode(v)["n"] for _, v in pairs}
    assert columnar == decoded
    assert [k for k, _ in pairs] == sorted(k for k, _ in pairs)  # key order
    return columnar


def position(batch_id: int) -> Position:
    return Position.from_map({"t": {0: batch_id}})


def run_model(
    versions: VersionedRows, batches: int, seed: int, complete_every: int = 0
) -> list[dict[str, int]]:
    rng = random.Random(seed)
    states: list[dict[str, int]] = []
    state: dict[str, int] = {}
    for batch_id in range(batches):
        if complete_every and batch_id % complete_every == complete_every - 1:
            changes: dict[str, int | None] = {k: None for k in state}
            changes.update({f"k{rng.randrange(60):02d}": batch_id for _ in range(20)})
            replace_all = True
        else:
            changes = {}
            for _ in range(rng.randrange(0, 15)):
                key = f"k{rng.randrange(60):02d}"
                changes[key] = None if rng.random() < 0.25 else rng.randrange(1000)
            replace_all = False
        keys, values = encode(
            {k: v for k, v in changes.items() if v is not None or not replace_all}
        )
        versions.apply(
            batch_id, position(batch_id), float(batch_id), keys, values, replace_all=replace_all
        )
        if replace_all:
            state = {}
        for key, value in changes.items():
            if value is None:
                state.pop(key, None)
            else:
                state[key] = value
        states.append(dict(state))
    return states


@pytest.mark.parametrize("complete_every", [0, 7])
def test_every_retained_batch_reads_as_the_model(complete_every: int) -> None:
    versions = VersionedRows(SCHEMA, History(batches=1000))
    states = run_model(versions, 120, seed=3, complete_every=complete_every)
    assert versions.oldest == 0 and versions.newest == 119
    for batch_id, expected in enumerate(states):
        version = versions.version(batch_id)
        assert version.position == position(batch_id)
        assert state_of(version) == expected, batch_id


def test_history_by_batches_and_merging_drop_only_what_no_batch_sees() -> None:
    versions = VersionedRows(SCHEMA, History(batches=10))
    states = run_model(versions, 300, seed=5)
    assert versions.oldest == 289
    for batch_id in range(289, 300):
        assert state_of(versions.version(batch_id)) == states[batch_id]
    with pytest.raises(BatchOutOfHistory, match="oldest batch still readable is 289"):
        versions.version(288)
    with pytest.raises(BatchOutOfHistory, match="not applied yet"):
        versions.version(300)
    # merged: far fewer rows than 300 batches of changes, at most the live rows plus the
    # versions replaced within the window
    assert versions.stored_rows() < 60 + 11 * 15 * 2


def test_history_by_time_keeps_what_was_current_in_the_window() -> None:
    versions = VersionedRows(SCHEMA, History(seconds=3600))
    import time

    now = time.time()
    for batch_id in range(5):
        keys, values = encode({"a": batch_id})
        # batches 0-2 committed long ago; 3 and 4 within the hour
        at = now - 10_000 + batch_id if batch_id < 3 else now - 10 + batch_id
        versions.apply(batch_id, position(batch_id), at, keys, values)
    # batch 2 was current until batch 3 committed, inside the window: still readable
    assert versions.oldest == 2
    assert state_of(versions.version(2)) == {"a": 2}


def test_a_reader_holding_a_version_keeps_its_rows_through_later_batches_and_merges() -> None:
    versions = VersionedRows(SCHEMA, History(batches=2))
    keys, values = encode({f"k{i}": i for i in range(50)})
    versions.apply(0, position(0), 0.0, keys, values)
    held = versions.version(0)
    for batch_id in range(1, 200):  # every key rewritten many times; history moves past 0
        keys, values = encode({f"k{i}": batch_id for i in range(50)})
        versions.apply(batch_id, position(batch_id), 0.0, keys, values)
    assert state_of(held) == {f"k{i}": i for i in range(50)}
    with pytest.raises(BatchOutOfHistory):
        versions.version(0)


def test_versions_of_a_key_with_their_validity() -> None:
    versions = VersionedRows(SCHEMA, History(batches=100))
    for batch_id, change in enumerate([{"a": 1}, {"b": 5}, {"a": 2}, {"a": None}, {"a": 3}]):
        keys, values = encode(change)
        versions.apply(batch_id, position(batch_id), 0.0, keys, values)
    found = [
        (vf, vt, ROWS.decode(row)["n"])
        for vf, vt, row in versions.versions_of(encode({"a": 0})[0][0])
    ]
    assert found == [(0, 2, 1), (2, 3, 2), (4, OPEN, 3)]


def test_batches_must_move_forward() -> None:
    versions = VersionedRows(SCHEMA)
    keys, values = encode({"a": 1})
    versions.apply(3, position(3), 0.0, keys, values)
    with pytest.raises(ValueError, match="not after the applied batch 3"):
        versions.apply(3, position(3), 0.0, keys, values)


def test_wait_for_a_batch() -> None:
    import threading

    versions = VersionedRows(SCHEMA)
    assert not versions.wait_for(0, 0.05)
    keys, values = encode({"a": 1})
    timer = threading.Timer(0.1, lambda: versions.apply(0, position(0), 0.0, keys, values))
    timer.start()
    assert versions.wait_for(0, 30)
    timer.join()


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_history_refuses_nonsense(bad: Any) -> None:
    with pytest.raises(ValueError, match="history batches"):
        History(batches=bad)
    with pytest.raises(ValueError, match="history seconds"):
        History(seconds=float("nan"))
