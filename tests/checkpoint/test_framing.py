"""The RocksDB provider's row framing with rows cut short or pointing outside themselves.

A prefix-scan key (and a list or map state key) is joined from two UnsafeRows at the byte
level, and the decoder only ever sees the joined row: a part that is cut short would read as
a null or as the other part's bytes. These tests hand the framing and the files reader such
keys and check that each is corruption naming the file -- never a row. The rows are written
here, field by field, as Spark's ``UnsafeRowWriter`` lays them out; the joined rows of good
keys are checked against the values they were written from.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from sparkiq.checkpoint.framing import RocksDBEncoding, RowFraming
from sparkiq.checkpoint.rocksdb import RocksDBStateFiles
from sparkiq.checkpoint.tws import ListStateFiles, MapStateFiles
from sparkiq.checkpoint.unsaferow import (
    UnsafeRowDecoder,
    UnsafeRowError,
    check_row,
    join_rows,
    nested_row,
)
from sparkiq.errors import ChangelogError, CorruptSegmentError
from sparkiq.schema.types import DataType, parse_type
from tests.checkpoint.test_hdfs_differential import lz4_java_raw

Value = int | str | bytes | None


def urow(*values: Value) -> bytes:
    """An UnsafeRow: an int is a fixed-width slot, a str (UTF-8) or bytes (a nested row)
    variable-length data after the slots, padded to 8 bytes; None a null."""
    words = (len(values) + 63) // 64
    head = 8 * words + 8 * len(values)
    nulls, slots, tail = 0, b"", b""
    for i, value in enumerate(values):
        if value is None:
            nulls |= 1 << i
            slots += bytes(8)
        elif isinstance(value, int):
            slots += struct.pack("<q", value)
        else:
            data = value.encode() if isinstance(value, str) else value
            slots += struct.pack("<Q", (head + len(tail)) << 32 | len(data))
            tail += data + bytes(-len(data) % 8)
    return nulls.to_bytes(8 * words, "little") + slots + tail


def struct_of(*fields: tuple[str, str | DataType]) -> DataType:
    return parse_type(
        {
            "type": "struct",
            "fields": [
                {"name": n, "type": t if isinstance(t, str) else t.to_json(), "nullable": True}
                for n, t in fields
            ],
        }
    )


def prefix_key(prefix: bytes, rest: bytes) -> bytes:
    """A ``PrefixKeyScanStateEncoderSpec`` key of two UnsafeRow bodies."""
    return struct.pack("<i", 1 + len(prefix)) + b"\x00" + prefix + b"\x00" + rest


def _corrupt(message: str) -> ChangelogError:
    return CorruptSegmentError(f"CORRUPT {message}")


def _unsupported(message: str) -> ChangelogError:
    return ChangelogError(f"UNSUPPORTED {message}")


def framing(key_schema: DataType, prefix_columns: int) -> RowFraming:
    encoding = RocksDBEncoding(key_schema, prefix_columns=prefix_columns)
    return RowFraming(encoding, error=_unsupported, corrupt=_corrupt, unsupported=_unsupported)


STRING_KEY = struct_of(("k", "string"), ("n", "long"), ("s", "string"))
INT_KEY = struct_of(("a", "integer"), ("b", "string"))


def test_a_prefix_key_rejoins_into_the_row_it_was_written_from() -> None:
    decode = UnsafeRowDecoder(STRING_KEY).decode
    rows = framing(STRING_KEY, 1)
    assert decode(rows.unframe_key(prefix_key(urow("a"), urow(5, "bc")))) == ("a", 5, "bc")
    assert decode(rows.unframe_key(prefix_key(urow("x" * 13), urow(None, "")))) == (
        "x" * 13,
        None,
        "",
    )
    rows = framing(STRING_KEY, 2)
    assert decode(rows.unframe_key(prefix_key(urow(None, -7), urow("é")))) == (None, -7, "é")
    joined = framing(INT_KEY, 1).unframe_key(prefix_key(urow(3), urow("b")))
    assert UnsafeRowDecoder(INT_KEY).decode(joined) == (3, "b")


def _out_of_bounds(row: bytes, slot: int, offset: int, size: int) -> bytes:
    """``row`` with variable-length field ``slot`` (of a one-word bitset) pointing at
    ``offset``, ``size`` bytes."""
    at = 8 + 8 * slot
    return row[:at] + struct.pack("<Q", offset << 32 | size) + row[at + 8 :]


# (key schema, prefix columns, prefix part, rest part): each part is damaged, the other not
BROKEN_KEYS = {
    # the case: a 3-byte prefix part, whose first byte is read as the null bitset
    "prefix of 3 bytes": (INT_KEY, 1, b"ab", urow("b")),
    "prefix without its string": (STRING_KEY, 1, urow("a")[:16], urow(5, "bc")),
    "prefix cut inside its slot": (STRING_KEY, 1, urow("a")[:12], urow(5, "bc")),
    "prefix one word short": (INT_KEY, 1, urow(3)[:8], urow("b")),
    "prefix of fixed columns with bytes after": (INT_KEY, 1, urow(3) + bytes(8), urow("b")),
    "prefix string past its end": (
        STRING_KEY,
        1,
        _out_of_bounds(urow("abc"), 0, 16, 9),
        urow(5, ""),
    ),
    "prefix string inside the slots": (
        STRING_KEY,
        1,
        _out_of_bounds(urow("abc"), 0, 8, 3),
        urow(5, ""),
    ),
    "prefix null bit past its columns": (INT_KEY, 1, b"\x02" + urow(3)[1:], urow("b")),
    "rest cut short by a word": (STRING_KEY, 1, urow("a"), urow(5, "bcdefghij")[:-8]),
    "rest cut short by a byte": (STRING_KEY, 1, urow("a"), urow(5, "bc")[:-1]),
    "rest of no bytes": (STRING_KEY, 1, urow("a"), b""),
    "rest string past its end": (
        STRING_KEY,
        1,
        urow("a"),
        _out_of_bounds(urow(5, "bc"), 1, 24, 17),
    ),
}


@pytest.mark.parametrize("case", BROKEN_KEYS)
def test_a_prefix_key_part_that_is_not_a_whole_row_is_corruption(case: str) -> None:
    key_schema, prefix_columns, prefix, rest = BROKEN_KEYS[case]
    with pytest.raises(CorruptSegmentError, match=r"CORRUPT prefix-scan key of \d+ bytes: "):
        framing(key_schema, prefix_columns).unframe_key(prefix_key(prefix, rest))


def test_a_prefix_length_that_does_not_fit_the_key_is_corruption() -> None:
    rows = framing(STRING_KEY, 1)
    key = prefix_key(urow("a"), urow(5, "bc"))
    for size in (0, len(key), -1):
        with pytest.raises(CorruptSegmentError, match="overruns the key"):
            rows.unframe_key(struct.pack("<i", size) + key[4:])
    # a length moved by a word: the parts no longer end where their rows do (the remainder
    # may then start with another version byte: refused as such)
    for size in (1 + 16, 1 + 24 + 8):
        with pytest.raises(ChangelogError, match=r"CORRUPT|UNSUPPORTED"):
            rows.unframe_key(struct.pack("<i", size) + key[4:])


def test_check_row_accepts_what_spark_writes_and_names_what_does_not_fit() -> None:
    check_row(urow("a", 1, None, ""), (True, False, True, True))
    check_row(urow(*range(70)), (False,) * 70)  # two bitset words
    check_row(urow(), ())
    with pytest.raises(
        UnsafeRowError, match=r"a 12-byte row cannot be an UnsafeRow of 1 field\(s\)"
    ):
        check_row(urow("a")[:12], (True,))
    with pytest.raises(UnsafeRowError, match="exactly"):
        check_row(urow(1) + bytes(8), (False,))
    with pytest.raises(UnsafeRowError, match=r"field 0 points at bytes 16\.\.25 of a 24-byte"):
        check_row(_out_of_bounds(urow("abc"), 0, 16, 9), (True,))
    with pytest.raises(UnsafeRowError, match="null bitset marks field 1 of 1"):
        check_row(b"\x02" + urow(3)[1:], (False,))


def test_join_and_nested_rows_refuse_parts_outside_their_row() -> None:
    joined = join_rows(urow("a", None), (True, True), urow(2, "xyz"), (False, True))
    assert UnsafeRowDecoder(
        struct_of(("a", "string"), ("b", "string"), ("c", "long"), ("d", "string"))
    ).decode(joined) == ("a", None, 2, "xyz")
    with pytest.raises(UnsafeRowError):
        join_rows(urow("a")[:16], (True,), urow(2), (False,))
    outer = urow(urow("k"), urow("u"))
    assert nested_row(outer, 1, 2) == urow("u")
    with pytest.raises(UnsafeRowError, match="cannot hold 2 fields"):
        nested_row(outer[:16], 1, 2)
    with pytest.raises(UnsafeRowError, match=r"struct field 1 points at bytes 40\.\.240"):
        nested_row(_out_of_bounds(outer, 1, 40, 200), 1, 2)
    with pytest.raises(UnsafeRowError, match="struct field 0 is null"):
        nested_row(b"\x01" + outer[1:], 0, 2)


# -- through the files reader: the error names the file ------------------------------------


def write_changelog(folder: Path, version: int, records: list[tuple[bytes, bytes | None]]) -> Path:
    """A v1 changelog (``int keyLen, key, int valueLen, value`` ... ``int -1``, big-endian) in
    lz4-java block framing, without a checksum file."""
    body = b""
    for key, value in records:
        body += struct.pack(">i", len(key)) + key
        body += struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    path = folder / f"{version}.changelog"
    path.write_bytes(lz4_java_raw(body + struct.pack(">i", -1)))
    return path


def test_a_broken_prefix_key_in_a_changelog_names_the_file(tmp_path: Path) -> None:
    encoding = RocksDBEncoding(STRING_KEY, prefix_columns=1)
    files = RocksDBStateFiles(tmp_path, encoding, name="op 0", partition=3)
    value = b"\x00" + urow(1)
    good = prefix_key(urow("a"), urow(5, "bc"))
    write_changelog(tmp_path, 1, [(good, value)])
    ((key, row),) = files.changes(1)
    assert UnsafeRowDecoder(STRING_KEY).decode(key) == ("a", 5, "bc") and row == urow(1)
    write_changelog(tmp_path, 2, [(good, value), (prefix_key(b"ab", urow(5, "bc")), value)])
    with pytest.raises(
        CorruptSegmentError, match=r"op 0 partition 3 \(.*2\.changelog\).*prefix-scan key"
    ):
        list(files.changes(2))


LIST_KEY = struct_of(("k", "string"))
ELEMENT = struct_of(("x", "long"))


def _list_value(*xs: int) -> bytes:
    return b"".join(struct.pack("<i", 17) + b"\x00" + urow(x) for x in xs)


def test_a_broken_list_state_key_names_the_file(tmp_path: Path) -> None:
    encoding = RocksDBEncoding(LIST_KEY, multi_value=True)
    files = ListStateFiles(RocksDBStateFiles(tmp_path, encoding, name="items"), LIST_KEY)
    write_changelog(tmp_path, 1, [(b"\x00" + urow("a"), _list_value(4, 5))])
    rows = list(files.changes(1))
    keys = UnsafeRowDecoder(struct_of(("k", "string"), ("list_index", "integer"))).decode
    assert [(keys(k), v) for k, v in rows] == [(("a", 0), urow(4)), (("a", 1), urow(5))]
    # the key's string cut off: joined with its list index, it would point into the index
    write_changelog(tmp_path, 2, [(b"\x00" + urow("a")[:16], _list_value(6))])
    with pytest.raises(CorruptSegmentError, match=r"items \(.*2\.changelog\).*list state key"):
        list(files.changes(2))


MAP_KEY = struct_of(("key", LIST_KEY), ("userKey", struct_of(("bucket", "string"))))


def test_a_broken_map_state_key_names_the_file(tmp_path: Path) -> None:
    encoding = RocksDBEncoding(MAP_KEY, prefix_columns=1)
    files = MapStateFiles(RocksDBStateFiles(tmp_path, encoding, name="latest"), MAP_KEY)
    value = b"\x00" + urow(9)
    write_changelog(tmp_path, 1, [(prefix_key(urow(urow("a")), urow(urow("u"))), value)])
    ((key, _),) = files.changes(1)
    assert UnsafeRowDecoder(struct_of(("k", "string"), ("bucket", "string"))).decode(key) == (
        "a",
        "u",
    )
    # the grouping key's own row cut to its bitset, inside an outer row that is whole
    write_changelog(tmp_path, 2, [(prefix_key(urow(urow("a")[:8]), urow(urow("u"))), value)])
    with pytest.raises(CorruptSegmentError, match=r"latest \(.*2\.changelog\).*map state key"):
        list(files.changes(2))
    # the outer prefix row cut short
    write_changelog(tmp_path, 3, [(prefix_key(urow(urow("a"))[:16], urow(urow("u"))), value)])
    with pytest.raises(CorruptSegmentError, match=r"latest \(.*3\.changelog\).*prefix-scan key"):
        list(files.changes(3))
