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
from sparkiq.stores.history import BatchOutOfHistory, History
from sparkiq.stores.versions import OPEN, VersionedRows
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


def test_a_complete_mode_batch_keeps_the_versions_of_rows_it_leaves_unchanged() -> None:
    versions = VersionedRows(SCHEMA, History(batches=100))
    table = {f"k{i:02d}": i for i in range(50)}
    for batch_id in range(30):  # every batch re-emits the whole table; one row changes
        table[f"k{batch_id % 50:02d}"] = 1000 + batch_id
        keys, values = encode(dict(table))
        versions.apply(batch_id, position(batch_id), 0.0, keys, values, replace_all=True)
        assert state_of(versions.version(batch_id)) == table
    assert versions.stored_rows() == 50 + 29  # one new version per batch, not 50


# -- every key's history against a plain model ---------------------------------------------
#
# The batches below mix what a replica sees: updates, inserts, deletes, a key written twice
# in one batch (the store keeps the last write: put-then-delete deletes, delete-then-put
# puts), complete-mode batches that re-emit some rows unchanged, and a short history so
# merges drop rows. After every batch, every retained batch is read back (rows, each key's
# row) and every key's versions are compared with the model's.

Change = tuple[str, int | None]


def encode_list(changes: list[Change]) -> tuple[list[bytes], list[bytes | None]]:
    """Encoded keys and rows in the order given, duplicates kept."""
    keys = [KEYS.encode(KEYS.to_internal(k)) for k, _ in changes]
    rows = [
        None
        if n is None
        else ROWS.encode_arrow(pa.table({"k": [k], "n": [n]}, schema=ARROW).to_batches()[0])[0]
        for k, n in changes
    ]
    return keys, rows


class KeyModel:
    """Every version of every key: ``key -> [[valid_from, valid_to, n]]`` (OPEN: current)."""

    def __init__(self) -> None:
        self.history: dict[str, list[list[int]]] = {}

    def current(self) -> dict[str, int]:
        return {k: v[-1][2] for k, v in self.history.items() if v and v[-1][1] == OPEN}

    def at(self, batch_id: int) -> dict[str, int]:
        return {
            k: n for k, runs in self.history.items() for vf, vt, n in runs if vf <= batch_id < vt
        }

    def apply(self, batch_id: int, changes: list[Change], replace_all: bool) -> None:
        latest = dict(changes)  # the last write of a key wins
        current = self.current()
        if replace_all:
            new = {k: n for k, n in latest.items() if n is not None}
            for key, n in current.items():
                if new.get(key) == n:
                    del new[key]  # unchanged: the version stays
                else:
                    self.history[key][-1][1] = batch_id
            for key, n in new.items():
                self.history.setdefault(key, []).append([batch_id, OPEN, n])
            return
        for key, n in latest.items():
            if key in current:
                self.history[key][-1][1] = batch_id
            if n is not None:
                self.history.setdefault(key, []).append([batch_id, OPEN, n])


def random_batch(rng: random.Random, model: KeyModel, batch_id: int) -> tuple[list[Change], bool]:
    if batch_id % 9 == 8:  # complete mode: keep some rows as they are, change or drop others
        changes: list[Change] = [
            (k, n if rng.random() < 0.6 else n + 1)
            for k, n in model.current().items()
            if rng.random() < 0.8
        ]
        changes += [(f"k{rng.randrange(80):02d}", batch_id) for _ in range(5)]
        rng.shuffle(changes)
        return changes, True
    changes = []
    for _ in range(rng.randrange(0, 25)):
        key = f"k{rng.randrange(80):02d}"
        changes.append((key, None if rng.random() < 0.2 else rng.randrange(1000)))
    if changes and rng.random() < 0.5:  # a key written twice (or more) in the batch
        key = rng.choice(changes)[0]
        changes.insert(rng.randrange(len(changes) + 1), (key, rng.choice([None, 7, 8])))
    return changes, False


def check_against(versions: VersionedRows, model: KeyModel, names: list[str]) -> None:
    for batch_id in range(versions.oldest, versions.newest + 1):
        version = versions.version(batch_id)
        expected = model.at(batch_id)
        assert state_of(version) == expected, batch_id
        for name in names:
            row = version.row(KEYS.encode(KEYS.to_internal(name)))
            assert (None if row is None else ROWS.decode(row)["n"]) == expected.get(name), (
                batch_id,
                name,
            )
    for name in names:
        found = [
            (vf, vt, ROWS.decode(row)["n"])
            for vf, vt, row in versions.versions_of(KEYS.encode(KEYS.to_internal(name)))
        ]
        wanted = [(vf, vt, n) for vf, vt, n in model.history.get(name, []) if vt > versions.oldest]
        assert found == wanted, name


def columns_of(
    keys: list[bytes], values: list[bytes | None], given: bool
) -> tuple[pa.Array, pa.Array] | None:
    """The changes as the binary arrays a segment holds them in (when ``given``)."""
    return (pa.array(keys, pa.binary()), pa.array(values, pa.binary())) if given else None


@pytest.mark.parametrize("columns", [False, True], ids=["lists", "segment columns"])
@pytest.mark.parametrize("history", [1000, 4])
def test_every_version_of_every_key_matches_a_plain_model(history: int, columns: bool) -> None:
    versions = VersionedRows(SCHEMA, History(batches=history))
    model = KeyModel()
    rng = random.Random(history)
    names = [f"k{i:02d}" for i in range(80)]
    for batch_id in range(150):
        changes, replace_all = random_batch(rng, model, batch_id)
        keys, values = encode_list(changes)
        versions.apply(
            batch_id,
            position(batch_id),
            0.0,
            keys,
            values,
            replace_all=replace_all,
            columns=columns_of(keys, values, columns),
        )
        model.apply(batch_id, changes, replace_all)
        if batch_id % 10 == 9 or history < 10:
            check_against(versions, model, names)
    if history < 10:  # merged: at most the live rows and what the window still sees
        assert versions.stored_rows() <= 80 + (history + 1) * 26


@pytest.mark.parametrize("columns", [False, True], ids=["lists", "segment columns"])
@pytest.mark.parametrize("collide", ["every key from the start", "two keys later"])
def test_keys_sharing_a_hash_are_told_apart_by_their_bytes(
    collide: str, columns: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Hash collisions (unlikely with 64-bit hashes, so forced here: the hash keeps 2 bits,
    or two keys added at batches 20 and 30 share one): the writer drops its index and
    matches keys by value, reads check the bytes of every candidate; everything still
    reads as the model, before and after."""
    from sparkiq.stores import keyindex

    pair = {KEYS.encode(KEYS.to_internal(k)) for k in ("x1", "x2")}
    if collide == "two keys later":
        monkeypatch.setattr(keyindex, "_hash", lambda key: 42 if key in pair else hash(key))
    else:
        monkeypatch.setattr(keyindex, "_hash", lambda key: hash(key) & 3)
    versions = VersionedRows(SCHEMA, History(batches=6))
    model = KeyModel()
    rng = random.Random(11)
    names = [f"k{i:02d}" for i in range(80)] + ["x1", "x2"]
    for batch_id in range(60):
        changes, replace_all = random_batch(rng, model, batch_id)
        if batch_id in (20, 30):
            changes.append(("x1" if batch_id == 20 else "x2", batch_id))
        keys, values = encode_list(changes)
        x1_current = "x1" in model.current()
        versions.apply(
            batch_id,
            position(batch_id),
            0.0,
            keys,
            values,
            replace_all=replace_all,
            columns=columns_of(keys, values, columns),
        )
        model.apply(batch_id, changes, replace_all)
        if collide == "two keys later" and batch_id < 30:
            assert versions._current is not None, batch_id  # the writer's index still serves
        if collide == "two keys later" and batch_id == 30:
            assert (versions._current is None) == x1_current  # x2 met x1's hash
        if batch_id % 3 == 2:
            check_against(versions, model, names)
    check_against(versions, model, names)
    if collide == "every key from the start":
        assert versions._current is None


@pytest.mark.parametrize("columns", [False, True], ids=["lists", "segment columns"])
def test_a_replica_store_and_its_versions_agree_on_keys_written_twice(
    tmp_path: Any, columns: bool
) -> None:
    """RocksDB applies a batch's writes in order; the versions keep the last write of a
    key, so both hold the same rows."""
    from sparkiq.stores.partition import PartitionStore
    from sparkiq.stores.rocksdb import RocksDBStore

    store = PartitionStore("t", 0, SCHEMA, RocksDBStore(tmp_path / "p"), History(batches=100))
    batches: list[list[Change]] = [
        [("a", 1), ("b", 1), ("a", 2)],
        [("a", None), ("b", 3), ("a", 4), ("c", 5), ("c", None)],
        [("b", None), ("b", None), ("d", 1), ("d", 1)],
    ]
    try:
        for batch_id, changes in enumerate(batches):
            keys, values = encode_list(changes)
            store.apply_changes(
                keys,
                values,
                batch_id,
                position(batch_id),
                columns=columns_of(keys, values, columns),
            )
            with store.store.range(None, None) as iterator:
                stored = {ROWS.decode(v)["k"]: ROWS.decode(v)["n"] for _, v in iterator}
            assert versions_state(store) == stored
        assert stored == {"a": 4, "d": 1}
    finally:
        store.close()


def versions_state(store: Any) -> dict[str, int]:
    return state_of(store.versions.version(store.versions.newest))


def test_a_batch_whose_row_does_not_decode_changes_nothing() -> None:
    versions = VersionedRows(SCHEMA, History(batches=100))
    keys, values = encode({"a": 1, "b": 2})
    versions.apply(0, position(0), 0.0, keys, values)
    bad_keys, _ = encode({"a": 0})
    with pytest.raises(Exception):  # noqa: B017 - whatever the decoder raises
        versions.apply(1, position(1), 0.0, bad_keys, [b"\xc1not msgpack"])
    assert versions.newest == 0
    assert state_of(versions.version(0)) == {"a": 1, "b": 2}
    keys, values = encode({"a": 3})
    versions.apply(1, position(1), 0.0, keys, values)
    assert state_of(versions.version(1)) == {"a": 3, "b": 2}
    assert [vt for _, vt, _ in versions.versions_of(keys[0])] == [1, OPEN]


def test_a_deleted_keys_index_entry_taken_by_a_key_with_its_hash(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``a`` and ``b`` share a hash (forced): ``a`` is deleted (its index entry stays, marked
    deleted), ``b`` takes the entry, then ``a`` comes back and the writer sees the two apart."""
    from sparkiq.stores import keyindex

    pair = {KEYS.encode(KEYS.to_internal(k)) for k in ("a", "b")}
    monkeypatch.setattr(keyindex, "_hash", lambda key: 7 if key in pair else hash(key))
    versions = VersionedRows(SCHEMA, History(batches=100))
    model = KeyModel()
    batches: list[list[Change]] = [[("a", 1), ("c", 1)], [("a", None)], [("b", 2)], [("a", 3)]]
    for batch_id, changes in enumerate(batches):
        keys, values = encode_list(changes)
        versions.apply(batch_id, position(batch_id), 0.0, keys, values)
        model.apply(batch_id, changes, False)
        assert (versions._current is None) == (batch_id == 3), batch_id
    check_against(versions, model, ["a", "b", "c"])
    assert model.current() == {"a": 3, "b": 2, "c": 1}


def test_columns_that_are_not_the_changes_are_refused() -> None:
    versions = VersionedRows(SCHEMA, History(batches=100))
    keys, values = encode({"a": 1, "b": 2})
    key_array, value_array = pa.array(keys, pa.binary()), pa.array(values, pa.binary())
    with pytest.raises(ValueError, match="hold 1 keys and 2 values for 2 changes"):
        versions.apply(0, position(0), 0.0, keys, values, columns=(key_array[:1], value_array))
    with pytest.raises(ValueError, match="must be binary arrays"):
        versions.apply(0, position(0), 0.0, keys, values, columns=(key_array, pa.array([1, 2])))
    assert versions.newest == -1
    versions.apply(0, position(0), 0.0, keys, values, columns=(key_array, value_array))
    assert state_of(versions.version(0)) == {"a": 1, "b": 2}


def test_versions_read_the_same_after_the_valid_to_vector_grows() -> None:
    """Rows past the writer's ``valid_to`` vector make it move to a larger copy (300 rows a
    batch, past 1,024 and 2,048 rows, no merge): the chunks move with it, so stamps after
    the move show at the newest batch, and versions held from before keep their rows."""
    versions = VersionedRows(SCHEMA, History(batches=1000))
    model = KeyModel()
    names = [f"k{i:03d}" for i in range(300)]
    held = []
    sizes = set()
    for batch_id in range(12):
        changes: list[Change] = [
            (name, None if (i + batch_id) % 7 == 0 else batch_id * 1000 + i)
            for i, name in enumerate(names)
        ]
        keys, values = encode_list(changes)
        versions.apply(batch_id, position(batch_id), 0.0, keys, values)
        model.apply(batch_id, changes, False)
        held.append((versions.version(batch_id), model.at(batch_id)))
        sizes.add(len(versions._valid_to.vector))
    assert len(sizes) >= 3  # it grew (at least) twice
    for version, expected in held:
        assert state_of(version) == expected, version.batch_id
    check_against(versions, model, names[::7])
