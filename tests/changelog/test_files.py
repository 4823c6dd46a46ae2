"""Segment, commit record and manifest files: determinism, integrity, layout checks."""

from __future__ import annotations

import os
import random
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from sparkiq.changelog import Changelog, CommitRecord, TableManifest
from sparkiq.changelog.retention import apply_retention
from sparkiq.changelog.segment import decode_segment, encode_segment, encode_segment_arrays
from sparkiq.changelog.snapshot import write_snapshot
from sparkiq.errors import CorruptSegmentError, LayoutMismatchError, UnknownStoreError
from sparkiq.schema.types import TableSchema
from tests.changelog.helpers import SCHEMA_JSON, make_table, write_batch


def test_rewriting_a_batch_produces_identical_files(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    rows = {f"k{i}": i for i in range(200)}
    first = write_batch(changelog, 0, rows, commit=False)
    contents = {p: Path(changelog.segment_path(p, 0)).read_bytes() for p in first.segments}
    # Same changes in another order: byte-identical segments.
    second = write_batch(changelog, 0, dict(reversed(list(rows.items()))), commit=False)
    assert first.segments == second.segments
    for p, data in contents.items():
        assert Path(changelog.segment_path(p, 0)).read_bytes() == data


def test_commit_record_round_trips(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    record = write_batch(changelog, 3, {"a": 1, "b": 2}, position={"kafka:x": {0: 7}})
    assert changelog.read_commit(3) == record
    assert changelog.read_commit(4) is None
    assert changelog.committed_batch_ids() == [3]
    assert record.rows == 2


def test_a_segments_columns_hold_what_its_lists_hold(tmp_path: os.PathLike[str]) -> None:
    """What a replica hands its versions (the segment's binary columns) is what it hands
    its store (the lists), deletions (nulls) included; a partition the batch did not touch
    has empty columns."""
    from sparkiq.changelog.source import SegmentSource

    changelog = make_table(str(tmp_path))
    record = write_batch(changelog, 0, {f"k{i}": None if i % 3 == 0 else i for i in range(60)})
    source = SegmentSource(changelog)
    for partition in record.segments:
        columns = source.read_change_columns(record, partition)
        keys, values = changelog.read_segment(record, partition)
        assert columns is not None and columns[0].type == columns[1].type == pa.binary()
        assert (columns[0].to_pylist(), columns[1].to_pylist()) == (keys, values)
        assert None in values and keys == sorted(keys)
    untouched = write_batch(changelog, 1, {"k1": 5})
    partition = next(p for p in record.segments if p not in untouched.segments)
    columns = source.read_change_columns(untouched, partition)
    assert columns is not None and len(columns[0]) == len(columns[1]) == 0


def test_corrupted_segment_byte_is_detected(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    record = write_batch(changelog, 0, {f"k{i}": i for i in range(50)})
    partition = next(iter(record.segments))
    path = changelog.segment_path(partition, 0)
    data = bytearray(Path(path).read_bytes())
    data[len(data) // 2] ^= 0x01
    Path(path).write_bytes(bytes(data))
    with pytest.raises(CorruptSegmentError, match="checksum") as info:
        changelog.read_segment(record, partition)
    assert path in str(info.value) and info.value.partition == partition


def test_truncated_and_missing_segments_are_detected(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    record = write_batch(changelog, 0, {f"k{i}": i for i in range(50)})
    first, second = sorted(record.segments)[:2]
    path = changelog.segment_path(first, 0)
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[:-10])
    with pytest.raises(CorruptSegmentError, match="truncated"):
        changelog.read_segment(record, first)
    os.remove(changelog.segment_path(second, 0))
    with pytest.raises(CorruptSegmentError, match="missing"):
        changelog.read_segment(record, second)


def test_segment_of_another_batch_is_refused(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 1})
    record1 = write_batch(changelog, 1, {"a": 2})
    partition = next(iter(record1.segments))
    # Replace batch 1's segment by batch 0's and fix the checksum: the embedded id still differs.
    os.replace(changelog.segment_path(partition, 0), changelog.segment_path(partition, 1))
    data = Path(changelog.segment_path(partition, 1)).read_bytes()
    import hashlib

    from sparkiq.changelog.segment import SegmentInfo

    forged = CommitRecord(
        table="t",
        batch_id=1,
        mode="update",
        segments={
            partition: SegmentInfo(partition, 1, len(data), hashlib.sha256(data).hexdigest())
        },
    )
    with pytest.raises(CorruptSegmentError, match="belongs to"):
        changelog.read_segment(forged, partition)


def test_corrupted_commit_record_is_detected(tmp_path: os.PathLike[str]) -> None:
    changelog = make_table(str(tmp_path))
    write_batch(changelog, 0, {"a": 1})
    path = changelog.commit_path(0)
    text = Path(path).read_text().replace('"rows":1', '"rows":2')
    Path(path).write_text(text)
    with pytest.raises(CorruptSegmentError, match="checksum"):
        changelog.read_commit(0)
    Path(path).write_text(text[:20])
    with pytest.raises(CorruptSegmentError, match="truncated"):
        changelog.read_commit(0)


def test_manifest_layout_changes_are_refused_and_nothing_is_written(
    tmp_path: os.PathLike[str],
) -> None:
    changelog = make_table(str(tmp_path), partitions=4)
    before = Path(changelog.manifest_path).read_bytes()
    schema = TableSchema.from_spark_json(SCHEMA_JSON, ["k"])
    other = TableManifest(name="t", schema=schema, partitions=8)
    with pytest.raises(LayoutMismatchError, match="partitions 8 != 4") as info:
        other.ensure_written(changelog.storage, changelog.manifest_path)
    assert "delete" in str(info.value)
    assert Path(changelog.manifest_path).read_bytes() == before
    same = TableManifest(name="t", schema=schema, partitions=4)
    kept = same.ensure_written(changelog.storage, changelog.manifest_path)
    assert kept.incarnation == changelog.manifest().incarnation != ""


def test_unknown_table_names_the_tables_present(tmp_path: os.PathLike[str]) -> None:
    make_table(str(tmp_path), name="present")
    with pytest.raises(UnknownStoreError, match="present"):
        Changelog(str(tmp_path), "absent").manifest()


def _segment_as_before(
    table: str, partition: int, batch_id: int, changes: dict[bytes, Any]
) -> bytes:
    """A segment as the row-by-row writer made it (sorted dict keys), the oracle for the
    column-wise one: the format is unchanged, so the bytes must be too."""
    keys = sorted(changes)
    metadata = {
        "sparkiq.format": "segment",
        "sparkiq.version": "1",
        "sparkiq.table": table,
        "sparkiq.partition": str(partition),
        "sparkiq.batch": str(batch_id),
    }
    schema = pa.schema(
        [pa.field("key", pa.binary(), nullable=False), pa.field("value", pa.binary())]
    ).with_metadata(metadata)
    batch = pa.record_batch(
        [pa.array(keys, pa.binary()), pa.array([changes[k] for k in keys], pa.binary())],
        schema=schema,
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, schema) as writer:
        writer.write_batch(batch)
    return bytes(sink.getvalue())


@pytest.mark.parametrize("seed", range(4))
def test_segments_from_columns_keep_the_last_row_of_a_key_and_the_same_bytes(seed: int) -> None:
    rng = random.Random(seed)
    pool = [bytes(rng.randrange(256) for _ in range(rng.randrange(5))) for _ in range(300)]
    keys = [rng.choice(pool) for _ in range(1000)]  # many keys given more than once
    values = [None if rng.random() < 0.1 else rng.randbytes(rng.randrange(6)) for _ in keys]
    latest = dict(zip(keys, values, strict=True))  # a later row for a key wins
    data, rows = encode_segment_arrays(
        "t", 2, 7, pa.array(keys, pa.binary()), pa.array(values, pa.binary())
    )
    assert rows == len(latest)
    assert data == _segment_as_before("t", 2, 7, latest) == encode_segment("t", 2, 7, latest)
    found_keys, found_values = decode_segment(data, "p", "t", 2, 7)
    assert found_keys == sorted(latest)
    assert found_values == [latest[k] for k in found_keys]
    empty, none = encode_segment_arrays(
        "t", 2, 7, pa.array([], pa.binary()), pa.array([], pa.binary())
    )
    assert (empty, none) == (_segment_as_before("t", 2, 7, {}), 0)


def test_a_batch_written_again_is_read_from_the_attempt_its_record_lists(
    tmp_path: os.PathLike[str],
) -> None:
    """The sink writes a batch again (attempt 1) after refusing to write it in place: the
    record lists attempt 1's files, and a file of attempt 0 written late, as a straggling
    task of the refused attempt would, is never read; retention removes both. A record as
    sparkiq wrote it before attempts (no ``attempt``) still names attempt 0's files."""
    changelog = make_table(str(tmp_path), partitions=1)
    keys = pa.array([b"\x01a", b"\x01b"], pa.binary())
    wanted = pa.array([b"2", b"3"], pa.binary())
    info = changelog.write_segment_arrays(0, 0, keys, wanted, attempt=1)
    assert info.attempt == 1
    assert changelog.segment_path(0, 0, 1) != changelog.segment_path(0, 0)
    changelog.write_commit(CommitRecord(table="t", batch_id=0, mode="update", segments={0: info}))
    changelog.write_segment_arrays(0, 0, keys.slice(0, 1), wanted.slice(0, 1))  # late, attempt 0
    record = changelog.read_commit(0)
    assert record is not None and record.segments[0].attempt == 1
    assert changelog.read_segment_arrays(record, 0)[1].to_pylist() == [b"2", b"3"]
    assert '"attempt":1' in Path(changelog.commit_path(0)).read_text()

    later = write_batch(changelog, 1, {"c": 1})
    assert later.segments[0].attempt == 0
    assert '"attempt"' not in Path(changelog.commit_path(1)).read_text()  # the old format
    assert changelog.read_commit(1) == later
    write_batch(changelog, 2, {"d": 1})
    write_snapshot(changelog, 0, 1)
    report = apply_retention(changelog, 0, keep_snapshots=1, now=time.time() + 60)
    assert report.segments == 2  # batches 0 and 1, one listed file each
    assert not Path(changelog.segment_path(0, 0, 1)).exists()
    assert not Path(changelog.segment_path(0, 0)).exists()
