"""A RocksDB store on a disk that fills up, then has room again.

RocksDB refuses every write after one failed and, without ``DB::Resume`` (not in rocksdict),
does not resume by itself: the store stayed read-only until the process restarted. It now
keeps serving reads while the disk is full and opens the database again on the first write
once the disk has room.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sparkiq.errors import StoreError
from sparkiq.stores.rocksdb import RocksDBStore
from tests.small_disk import fill

BIG = b"x" * 4000  # rows that need new pages of the log


def _batch(tag: bytes, count: int = 64) -> list[tuple[bytes, bytes | None]]:
    return [(b"k%03d" % i, tag + BIG) for i in range(count)]


def _failed_on_a_full_disk(disk: Path) -> tuple[RocksDBStore, Path]:
    """A store holding batch a, whose batch b was refused by the full ``disk``."""
    store = RocksDBStore(disk / "db")
    store.apply(_batch(b"a"), b"batch-a")
    filler = fill(disk)
    with pytest.raises(StoreError, match="No space left on device"):
        store.apply(_batch(b"b"), b"batch-b")
    return store, filler


def test_reads_go_on_while_the_disk_is_full_and_writes_resume_once_it_has_room(
    small_disk: Path,
) -> None:
    store, filler = _failed_on_a_full_disk(small_disk)
    with pytest.raises(StoreError, match="less than 1 MiB free after a write failed"):
        store.apply(_batch(b"c"), b"batch-c")  # not reopened on a full disk
    # Nothing of the failed batches: the store reads as it was.
    assert store.meta() == b"batch-a"
    assert store.get(b"k005") == b"a" + BIG
    with store.range(None, None) as rows:
        assert [v[:1] for _, v in rows] == [b"a"] * 64

    open_before = store.range(None, None)
    filler.unlink()
    store.apply(_batch(b"c"), b"batch-c")  # reopens, then writes
    assert store.meta() == b"batch-c"
    assert store.get(b"k063") == b"c" + BIG
    with pytest.raises(StoreError, match="closed"):  # it held the old database
        list(open_before)
    store.close()

    reopened = RocksDBStore(small_disk / "db")
    assert reopened.meta() == b"batch-c"
    with reopened.range(None, None) as rows:
        assert [v[:1] for _, v in rows] == [b"c"] * 64
    reopened.close()


def test_readers_never_see_the_database_closed_while_it_is_opened_again(
    small_disk: Path,
) -> None:
    store, filler = _failed_on_a_full_disk(small_disk)
    filler.unlink()

    stop = threading.Event()
    seen: set[bytes] = set()
    errors: list[Exception] = []

    def read() -> None:
        while not stop.is_set():
            try:
                value = store.get(b"k010")
                assert value is not None
                seen.add(value[:1])
            except Exception as exc:
                errors.append(exc)
                return

    readers = [threading.Thread(target=read) for _ in range(2)]
    for reader in readers:
        reader.start()
    try:
        store.apply(_batch(b"c"), b"batch-c")
        for tag in b"def":
            store.apply(_batch(bytes([tag])), b"batch-" + bytes([tag]))
    finally:
        stop.set()
        for reader in readers:
            reader.join(60)
    assert errors == []
    assert seen <= {b"a", b"c", b"d", b"e", b"f"}
    store.close()
