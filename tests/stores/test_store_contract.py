"""One contract suite for every partition store, plus what only RocksDB can show.

Every test taking the ``store`` fixture runs against :class:`MemoryStore` and a real
:class:`RocksDBStore` in ``tmp_path``; expectations come from a Python dict and ``sorted``.
The RocksDB-only tests reopen databases, corrupt their files and ``SIGKILL`` a writer
process in the middle of its batches.
"""

from __future__ import annotations

import random
import signal
import subprocess
import sys
import threading
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options, Rdict

from sparkiq.errors import ConfigError, StoreError
from sparkiq.stores import MemoryStore, RocksDBStore, Store, StoreIterator
from sparkiq.stores.rocksdb import FORMAT_KEY, META_KEY

Op = tuple[bytes, bytes | None]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=["memory", "rocksdb"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened: Store = MemoryStore() if request.param == "memory" else RocksDBStore(tmp_path / "p0")
    yield opened
    opened.close()


def scan(
    store: Store, lower: bytes | None = None, upper: bytes | None = None, **kw: Any
) -> list[tuple[bytes, bytes]]:
    with store.range(lower, upper, **kw) as iterator:
        return list(iterator)


def model_range(
    model: dict[bytes, bytes] | list[tuple[bytes, bytes]],
    lower: bytes | None,
    upper: bytes | None,
    *,
    reverse: bool = False,
    upper_exclusive: bool = False,
) -> list[tuple[bytes, bytes]]:
    """The expected rows, from a dict or its items already sorted."""
    items = sorted(model.items()) if isinstance(model, dict) else model
    keys = [key for key, _ in items]
    start = 0 if lower is None else bisect_left(keys, lower)
    if upper is None:
        stop = len(keys)
    else:
        stop = (bisect_left if upper_exclusive else bisect_right)(keys, upper)
    rows = items[start:stop]
    return rows[::-1] if reverse else rows


def model_apply(model: dict[bytes, bytes], ops: Iterable[Op], replace_all: bool = False) -> None:
    if replace_all:
        model.clear()
    for key, value in ops:
        if value is None:
            model.pop(key, None)
        else:
            model[key] = value


def k(text: str) -> bytes:
    return b"\x00" + text.encode()


# -- contract ----------------------------------------------------------------------------------


def test_stores_satisfy_the_protocols(store: Store) -> None:
    assert isinstance(store, Store)
    with store.range(None, None) as iterator:
        assert isinstance(iterator, StoreIterator)


def test_get_put_delete(store: Store) -> None:
    assert store.get(k("a")) is None
    store.apply([(k("a"), b"1"), (k("b"), b"2"), (k("c"), b"")], b"m1")
    assert [store.get(k(x)) for x in "abcd"] == [b"1", b"2", b"", None]
    store.apply([(k("a"), None), (k("b"), b"22"), (k("zz"), None)], b"m2")
    assert [store.get(k(x)) for x in "abc"] == [None, b"22", b""]
    assert scan(store) == [(k("b"), b"22"), (k("c"), b"")]


def test_later_op_for_the_same_key_wins(store: Store) -> None:
    store.apply([(k("a"), b"1"), (k("a"), b"2"), (k("b"), b"1"), (k("b"), None)], b"m1")
    assert (store.get(k("a")), store.get(k("b"))) == (b"2", None)
    store.apply([(k("a"), None), (k("a"), b"3"), (k("c"), b"x"), (k("c"), None)], b"m2")
    assert scan(store) == [(k("a"), b"3")]
    store.apply([(k("d"), b"1"), (k("d"), b"4")], b"m3", replace_all=True)
    assert scan(store) == [(k("d"), b"4")]


RANGE_KEYS = [b"\x00", b"\x00a", b"\x00a\x00", b"\x00a\x01", b"\x00ab", b"\x00b", b"\x00\xff"]
RANGE_KEYS += [b"\x01", b"\x01\x00", b"\x01\xff\xff"]
BOUNDS = [None, b"", b"\x00", b"\x00a", b"\x00a\x00", b"\x00aa", b"\x00b", b"\x01", b"\x02"]
BOUNDS += [b"\xff", b"\xff\xff"]


BoundCase = tuple[bytes | None, bytes | None, dict[str, bool], list[tuple[bytes, bytes]]]


@pytest.fixture(
    params=[(reverse, exclusive) for reverse in (False, True) for exclusive in (False, True)],
    ids=lambda p: f"reverse={p[0]}-upper_exclusive={p[1]}",
)
def bound_cases(store: Store, request: pytest.FixtureRequest) -> list[BoundCase]:
    """RANGE_KEYS applied to ``store``, then every pair of BOUNDS as ``(lower, upper,
    range keywords, rows the model expects)``, for each of the four keyword combinations."""
    reverse, upper_exclusive = request.param
    model = {key: b"v" + key for key in RANGE_KEYS}
    store.apply(model.items(), b"meta")
    kw = {"reverse": reverse, "upper_exclusive": upper_exclusive}
    return [
        (lower, upper, kw, model_range(model, lower, upper, **kw))
        for lower in BOUNDS
        for upper in BOUNDS
    ]


def test_ranges_match_the_model_for_every_pair_of_bounds(
    store: Store, bound_cases: list[BoundCase]
) -> None:
    for lower, upper, kw, expected in bound_cases:
        assert scan(store, lower, upper, **kw) == expected, (lower, upper)


def chunked(iterator: StoreIterator, sizes: Iterable[int]) -> list[tuple[bytes, bytes]]:
    """Every pair, through ``next_chunk`` of the given sizes (cycled) and one ``next`` after
    each chunk, checking that only the end returns a short chunk."""
    out: list[tuple[bytes, bytes]] = []
    sizes = list(sizes)
    for turn in range(10**9):
        size = sizes[turn % len(sizes)]
        chunk = iterator.next_chunk(size)
        out += chunk
        if len(chunk) < size:
            assert iterator.next_chunk(size) == []
            assert next(iterator, None) is None
            return out
        following = next(iterator, None)
        if following is None:
            assert iterator.next_chunk(size) == []
            return out
        out.append(following)
    raise AssertionError("unreachable")


def test_next_chunk_matches_the_model_for_every_pair_of_bounds(
    store: Store, bound_cases: list[BoundCase]
) -> None:
    for lower, upper, kw, expected in bound_cases:
        for sizes in ([1], [3], [1000], [2, 1, 5]):
            with store.range(lower, upper, **kw) as iterator:
                assert chunked(iterator, sizes) == expected, (lower, upper, sizes)
        with store.range(lower, upper, **kw) as iterator:
            assert iterator.next_chunk(1 << 62) == expected
            assert iterator.next_chunk(5) == []


def test_next_chunk_reads_the_snapshot_of_its_range(store: Store) -> None:
    store.apply([(k(f"{i:04}"), b"old") for i in range(3000)], b"m1")
    early = store.range(None, None)  # a write comes before the first chunk
    started = store.range(k("0100"), k("2999"), upper_exclusive=True)
    assert len(started.next_chunk(50)) == 50  # bulk reading began before the write
    store.apply([(k(f"{i:04}"), b"new") for i in range(0, 3000, 7)] + [(k("5"), b"n")], b"m2")
    assert early.meta == started.meta == b"m1"
    assert early.next_chunk(1 << 62) == [(k(f"{i:04}"), b"old") for i in range(3000)]
    assert started.next_chunk(1 << 62) == [(k(f"{i:04}"), b"old") for i in range(150, 2999)]
    with store.range(k("0000"), k("0010")) as now:
        assert now.meta == b"m2"
        assert now.next_chunk(100) == [
            (k(f"{i:04}"), b"new" if i % 7 == 0 else b"old") for i in range(11)
        ]


def test_next_chunk_on_closed_iterators(store: Store) -> None:
    store.apply([(k(f"{i:03}"), b"v") for i in range(200)], b"m")
    explicit = store.range(None, None)
    assert len(explicit.next_chunk(40)) == 40
    explicit.close()
    with pytest.raises(StoreError, match="closed"):
        explicit.next_chunk(10)
    with pytest.raises(StoreError, match="closed"):
        next(explicit)
    open_iterator = store.range(None, None)
    assert len(open_iterator.next_chunk(100)) == 100
    store.close()
    with pytest.raises(StoreError, match="closed"):
        open_iterator.next_chunk(10)


def test_range_bounds_examples(store: Store) -> None:
    store.apply([(k(x), x.encode()) for x in "abcde"], b"m")
    assert [v for _, v in scan(store, k("b"), k("d"))] == [b"b", b"c", b"d"]
    assert [v for _, v in scan(store, k("b"), k("d"), upper_exclusive=True)] == [b"b", b"c"]
    assert [v for _, v in scan(store, k("b"), k("d"), reverse=True)] == [b"d", b"c", b"b"]
    assert [v for _, v in scan(store, k("b"), k("d"), reverse=True, upper_exclusive=True)] == [
        b"c",
        b"b",
    ]
    assert [v for _, v in scan(store, None, k("b"))] == [b"a", b"b"]
    assert [v for _, v in scan(store, k("d"), None)] == [b"d", b"e"]
    assert [v for _, v in scan(store, None, None, reverse=True)] == [b"e", b"d", b"c", b"b", b"a"]
    assert [v for _, v in scan(store, k("c"), k("c"))] == [b"c"]
    assert scan(store, k("c"), k("c"), upper_exclusive=True) == []
    assert scan(store, k("d"), k("b")) == []
    assert scan(store, k("d"), k("b"), reverse=True) == []
    assert scan(store, k("bb"), k("bc")) == []
    assert scan(store, b"\x01", None) == []
    assert scan(store, b"\xff", None) == []  # the reserved space is never returned


def test_range_on_an_empty_store(store: Store) -> None:
    with store.range(None, None) as iterator:
        assert iterator.meta is None
        assert list(iterator) == []
    assert scan(store, None, None, reverse=True) == []
    store.apply([], b"m-empty")
    with store.range(k("a"), k("z")) as iterator:
        assert (iterator.meta, list(iterator)) == (b"m-empty", [])


def test_range_reads_the_snapshot_taken_when_it_was_called(store: Store) -> None:
    store.apply([(k(x), b"old") for x in "abcd"], b"m1")
    full = store.range(None, None)
    reverse = store.range(k("b"), k("c"), reverse=True)
    started = store.range(None, None)
    assert next(started) == (k("a"), b"old")

    store.apply([(k("a"), b"new"), (k("b"), None), (k("bb"), b"new"), (k("e"), b"new")], b"m2")
    assert (full.meta, reverse.meta, started.meta) == (b"m1", b"m1", b"m1")
    assert list(full) == [(k(x), b"old") for x in "abcd"]
    assert list(reverse) == [(k("c"), b"old"), (k("b"), b"old")]
    assert list(started) == [(k(x), b"old") for x in "bcd"]

    replaced = store.range(None, None)
    store.apply([(k("q"), b"q")], b"m3", replace_all=True)
    assert replaced.meta == b"m2"
    assert [key for key, _ in replaced] == [k("a"), k("bb"), k("c"), k("d"), k("e")]
    with store.range(None, None) as now:
        assert (now.meta, list(now)) == (b"m3", [(k("q"), b"q")])


def test_meta_changes_with_the_data(store: Store) -> None:
    assert store.meta() is None
    store.apply([(k("a"), b"1")], b"pos-1")
    assert store.meta() == b"pos-1"
    store.apply([], b"pos-2")
    assert (store.meta(), store.get(k("a"))) == (b"pos-2", b"1")
    with store.range(k("a"), k("a")) as iterator:
        assert (iterator.meta, list(iterator)) == (b"pos-2", [(k("a"), b"1")])


def test_a_failing_batch_applies_nothing(store: Store) -> None:
    store.apply([(k("a"), b"1")], b"m1")

    def ops_then_crash() -> Iterator[Op]:
        yield k("a"), b"changed"
        yield k("b"), b"new"
        raise RuntimeError("source failed")

    with pytest.raises(RuntimeError, match="source failed"):
        store.apply(ops_then_crash(), b"m2", replace_all=True)
    bad_batches: list[list[Any]] = [
        [(k("a"), b"x"), (META_KEY, b"forged")],
        [(k("a"), b"x"), ("str-key", b"x")],
        [(k("a"), b"x"), (k("b"), "str-value")],
        [(k("a"), b"x"), (k("b"), 1)],
    ]
    for bad in bad_batches:
        with pytest.raises(ConfigError):
            store.apply(bad, b"m3")
    with pytest.raises(ConfigError):
        store.apply([(k("a"), b"x")], "str-meta")  # type: ignore[arg-type]
    assert (store.meta(), scan(store)) == (b"m1", [(k("a"), b"1")])


def test_reserved_keys_are_refused(store: Store) -> None:
    with pytest.raises(ConfigError, match="0xFF"):
        store.get(META_KEY)
    with pytest.raises(ConfigError, match="0xFF"):
        store.apply([(b"\xff", b"x")], b"m")


def test_replace_all_removes_every_key_atomically(store: Store) -> None:
    store.apply([(k(str(i)), b"old") for i in range(100)], b"m1")
    store.apply([(k("5"), b"new"), (k("new"), b"new")], b"m2", replace_all=True)
    assert scan(store) == [(k("5"), b"new"), (k("new"), b"new")]
    assert (store.meta(), store.get(k("7"))) == (b"m2", None)
    store.apply([], b"m3", replace_all=True)
    assert (scan(store), store.meta()) == ([], b"m3")


def test_approximate_count_after_distinct_inserts(store: Store) -> None:
    assert store.approximate_count() == 0
    store.apply([(k(f"{i:05}"), b"v") for i in range(500)], b"m")
    assert store.approximate_count() == 500


def test_closed_store_and_iterators(store: Store) -> None:
    store.apply([(k(x), b"v") for x in "abc"], b"m")
    open_iterator = store.range(None, None)
    assert next(open_iterator) == (k("a"), b"v")

    explicit = store.range(None, None)
    explicit.close()
    explicit.close()
    with pytest.raises(StoreError, match="closed"):
        next(explicit)
    with store.range(None, None) as scoped:
        pass
    with pytest.raises(StoreError, match="closed"):
        next(scoped)
    exhausted = store.range(None, None)
    assert len(list(exhausted)) == 3
    assert list(exhausted) == []  # exhausted, not closed

    store.close()
    store.close()
    with pytest.raises(StoreError, match="closed"):
        next(open_iterator)  # closing the store closed its iterators
    for call in (
        lambda: store.get(k("a")),
        lambda: store.range(None, None),
        lambda: store.apply([(k("d"), b"v")], b"m2"),
        store.meta,
        store.approximate_count,
    ):
        with pytest.raises(StoreError, match=r"store .* is closed"):
            call()


def test_many_random_keys_match_a_dict(store: Store) -> None:
    rng = random.Random(20240611)
    model: dict[bytes, bytes] = {}
    keys = sorted(
        {bytes([rng.randrange(2)]) + rng.randbytes(rng.randrange(0, 12)) for _ in range(12_000)}
    )
    for batch in range(5):
        ops: list[Op] = []
        for _ in range(3_000):
            key = rng.choice(keys)
            ops.append((key, None if rng.random() < 0.15 else rng.randbytes(rng.randrange(0, 40))))
        store.apply(ops, f"batch-{batch}".encode())
        model_apply(model, ops)
    store.apply([(key, b"fill") for key in keys[:10_000] if key not in model], b"final")
    model_apply(model, [(key, b"fill") for key in keys[:10_000] if key not in model])
    assert len(model) >= 10_000

    expected = sorted(model.items())
    assert scan(store) == expected
    assert scan(store, reverse=True) == expected[::-1]
    for _ in range(100):
        lower, upper = sorted(rng.sample(keys, 2))
        kw = {"reverse": rng.random() < 0.5, "upper_exclusive": rng.random() < 0.5}
        assert scan(store, lower, upper, **kw) == model_range(expected, lower, upper, **kw)
        with store.range(lower, upper, **kw) as iterator:
            sizes = [rng.randrange(1, 3000) for _ in range(3)]
            assert chunked(iterator, sizes) == model_range(expected, lower, upper, **kw)
    with store.range(None, None) as iterator:
        assert iterator.next_chunk(1 << 62) == expected
    probes = rng.sample(keys, 2_000) + [b"\x00" + rng.randbytes(13) for _ in range(200)]
    assert [store.get(key) for key in probes] == [model.get(key) for key in probes]
    assert store.meta() == b"final"
    if isinstance(store, MemoryStore):
        assert store.approximate_count() == len(model)
    else:  # an estimate: overwrites and deletions are not compacted yet
        assert 0.5 * len(model) <= store.approximate_count() <= 2 * len(model)


def test_readers_see_whole_batches_while_one_thread_writes(store: Store) -> None:
    keys = [k(f"{i:03}") for i in range(50)]
    store.apply([(key, b"0") for key in keys], b"0")
    stop = threading.Event()
    read_done = threading.Event()  # a reader finished a read
    failures: list[str] = []
    snapshots: set[bytes | None] = set()

    def write() -> None:
        for batch in range(1, 121):
            # Every batch rewrites all keys (odd batches in reverse order) and deletes an
            # extra key, so a reader that saw half a batch would see mixed values.
            ops: list[Op] = [(key, str(batch).encode()) for key in keys]
            ops = [*(ops[::-1] if batch % 2 else ops), (k("extra"), None)]
            store.apply(ops, str(batch).encode())
            if batch % 10 == 0:
                # Let a reader in between batches, not only after the last: a yield of the
                # GIL (sleep(0)) is not enough when the CPU is busy elsewhere, so wait for a
                # read that ends after this batch (bounded, so a broken reader fails the
                # assertions below rather than hanging the test).
                read_done.clear()
                read_done.wait(30)
        stop.set()

    def read() -> None:
        last = 0
        while not stop.is_set() and not failures:
            with store.range(None, None, reverse=last % 2 == 1) as iterator:
                meta = iterator.meta
                if last % 3 == 0:
                    values = {value for _, value in iterator.next_chunk(1 << 62)}
                else:
                    values = {value for _, value in iterator}
            snapshots.add(meta)
            read_done.set()
            if values != {meta}:
                failures.append(f"snapshot at meta {meta!r} holds {sorted(values)}")
            value = store.get(keys[last % 50])
            assert value is not None
            if int(value) < last:
                failures.append(f"get went back from {last} to {int(value)}")
            last = int(value)

    readers = [threading.Thread(target=read) for _ in range(2)]
    writer = threading.Thread(target=write)
    for thread in [*readers, writer]:
        thread.start()
    for thread in [writer, *readers]:
        thread.join(timeout=60)
    assert failures == []
    assert store.meta() == b"120"
    assert len(snapshots) > 10  # the readers did run between the writer's batches


# -- RocksDB only ------------------------------------------------------------------------------


def test_rocksdb_reopen_keeps_data_and_meta(tmp_path: Path) -> None:
    path = tmp_path / "p1"
    store = RocksDBStore(path)
    assert store.path == path
    store.apply([(k(str(i)), str(i).encode()) for i in range(1000)], b"m1")
    store.flush()
    store.apply([(k("late"), b"in the WAL only"), (k("7"), None)], b"m2")
    with store.range(None, None):
        store.close()  # an open iterator must not keep the files locked
    reopened = RocksDBStore(path)
    try:
        assert reopened.meta() == b"m2"
        assert (reopened.get(k("late")), reopened.get(k("7")), reopened.get(k("8"))) == (
            b"in the WAL only",
            None,
            b"8",
        )
        assert len(scan(reopened)) == 1000
    finally:
        reopened.close()


def test_rocksdb_read_only_open_sees_data(tmp_path: Path) -> None:
    path = tmp_path / "p2"
    with pytest.raises(StoreError, match="no RocksDB database"):
        RocksDBStore(path, read_only=True)
    assert not path.exists()
    writer = RocksDBStore(path)
    writer.apply([(k("a"), b"1"), (k("b"), b"2")], b"m1")
    writer.close()

    reader = RocksDBStore(path, read_only=True)
    try:
        assert reader.read_only
        assert (reader.get(k("a")), reader.meta()) == (b"1", b"m1")
        assert scan(reader) == [(k("a"), b"1"), (k("b"), b"2")]
        with pytest.raises(StoreError, match="read-only"):
            reader.apply([(k("c"), b"3")], b"m2")
        with pytest.raises(StoreError, match="read-only"):
            reader.destroy()
        reader.flush()  # nothing to write
    finally:
        reader.close()
    assert path.exists()


def test_rocksdb_refuses_a_second_read_write_open(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path / "p3")
    try:
        with pytest.raises(StoreError, match="already open"):
            RocksDBStore(tmp_path / "p3")
    finally:
        store.close()


def test_rocksdb_destroy_deletes_the_directory(tmp_path: Path) -> None:
    store = RocksDBStore(tmp_path / "p4")
    store.apply([(k("a"), b"1")], b"m")
    store.destroy()
    store.destroy()
    assert not (tmp_path / "p4").exists()
    with pytest.raises(StoreError, match="closed"):
        store.get(k("a"))


def _write_store(path: Path) -> None:
    store = RocksDBStore(path)
    store.apply([(k(f"{i:05}"), b"x" * 100) for i in range(2000)], b"m1")
    store.flush()
    store.apply([(k(f"{i:05}"), b"y" * 100) for i in range(0, 2000, 3)], b"m2")
    store.close()


def _open_and_read_everything(path: Path, bulk: bool = False) -> list[tuple[bytes, bytes]]:
    store = RocksDBStore(path)
    try:
        store.meta()
        if bulk:
            with store.range(None, None) as iterator:
                return iterator.next_chunk(1 << 62)
        return scan(store)
    finally:
        store.close()


@pytest.mark.parametrize("bulk", [False, True])
@pytest.mark.parametrize("pattern", ["*", "CURRENT", "MANIFEST-*", "*.sst"])
def test_rocksdb_corrupted_files_raise_store_error_naming_the_path(
    tmp_path: Path, pattern: str, bulk: bool
) -> None:
    path = tmp_path / "corrupt"
    _write_store(path)
    assert len(_open_and_read_everything(path, bulk)) == 2000
    rng = random.Random(pattern)
    corrupted = [f for f in path.glob(pattern) if f.name != "LOCK"]
    assert corrupted
    for file in corrupted:
        file.write_bytes(rng.randbytes(max(file.stat().st_size, 64)))
    with pytest.raises(StoreError) as info:
        _open_and_read_everything(path, bulk)
    message = str(info.value)
    assert str(path) in message
    assert "delete the directory" in message and "changelog" in message


@pytest.mark.parametrize("bulk", [False, True])
def test_rocksdb_scan_stopped_mid_way_by_corruption_raises(tmp_path: Path, bulk: bool) -> None:
    """rocksdict's own items iterator stops silently at a bad block; scans must not."""
    path = tmp_path / "torn"
    rng = random.Random(5)
    store = RocksDBStore(path)
    store.apply([(k(f"{i:06}"), rng.randbytes(100)) for i in range(20_000)], b"m")
    store.flush()
    store.close()
    (table,) = path.glob("*.sst")
    data = bytearray(table.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = bytes(16)  # one data block mid-file
    table.write_bytes(bytes(data))
    store = RocksDBStore(path)
    try:
        with store.range(None, None) as iterator:
            first = iterator.next_chunk(100) if bulk else [next(iterator) for _ in range(100)]
            assert len(first) == 100
            with pytest.raises(StoreError, match="Corruption") as info:
                iterator.next_chunk(1 << 62) if bulk else list(iterator)
        assert str(path) in str(info.value)
    finally:
        store.close()


def test_rocksdb_refuses_paths_that_are_not_its_databases(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("not a directory")
    with pytest.raises(StoreError, match="not a directory") as info:
        RocksDBStore(a_file)
    assert str(a_file) in str(info.value)

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("someone else's")
    with pytest.raises(StoreError, match="not a RocksDB database") as info:
        RocksDBStore(foreign)
    assert str(foreign) in str(info.value)
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]

    other_format = tmp_path / "v2"
    RocksDBStore(other_format).close()
    db = Rdict(str(other_format), Options(raw_mode=True))
    db[FORMAT_KEY] = b"2"
    db.close()
    with pytest.raises(StoreError, match="format") as info:
        RocksDBStore(other_format)
    assert str(other_format) in str(info.value)


# A writer process SIGKILLed at a random moment must leave one of the states it published.


def _crash_batch(index: int) -> tuple[list[Op], bool]:
    """Batch ``index`` of the crash test, a pure function of ``index``."""
    rng = random.Random(index)
    ops: list[Op] = []
    for _ in range(rng.randrange(100, 400)):
        key = b"\x00" + rng.randrange(4000).to_bytes(2, "big")
        value = None if rng.random() < 0.2 else rng.randbytes(rng.randrange(100, 1500))
        ops.append((key, value))
    return ops, index % 23 == 22


def _crash_writer(path: str) -> None:
    """Child process: apply batches 0, 1, 2, ... until killed; meta is the batch index."""
    store = RocksDBStore(path)
    index = 0
    while True:
        ops, replace_all = _crash_batch(index)
        store.apply(ops, str(index).encode(), replace_all=replace_all)
        if index == 0:
            print("ready", flush=True)
        index += 1


def test_rocksdb_state_after_sigkill_is_an_applied_prefix(tmp_path: Path) -> None:
    rng = random.Random()
    for attempt in range(5):
        path = tmp_path / f"crash{attempt}"
        code = (
            f"import sys; sys.path.insert(0, {str(ROOT)!r}); "
            "from tests.stores.test_store_contract import _crash_writer; "
            f"_crash_writer({str(path)!r})"
        )
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            assert child.stdout is not None
            line = child.stdout.readline()
            assert line == b"ready\n", child.stderr.read() if child.stderr else line
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
        assert child.returncode == -signal.SIGKILL

        store = RocksDBStore(path)
        try:
            meta = store.meta()
            assert meta is not None
            last = int(meta)
            model: dict[bytes, bytes] = {}
            for index in range(last + 1):
                ops, replace_all = _crash_batch(index)
                model_apply(model, ops, replace_all)
            assert scan(store) == sorted(model.items()), f"attempt {attempt}, batch {last}"
        finally:
            store.close()
