"""The two checks a segment passes before its batch is committed: the writer reads it back
(verify_landed) and the driver finds it with its size where readers look (check_visible)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkiq.changelog import Changelog
from sparkiq.changelog.segment import SegmentInfo, check_visible, verify_landed
from sparkiq.errors import CorruptSegmentError


def written(
    tmp_path: Path, partition: int = 2, batch_id: int = 7
) -> tuple[Changelog, str, SegmentInfo]:
    changelog = Changelog(str(tmp_path / "state"), "t")
    info = changelog.write_segment(partition, batch_id, {b"a": b"1", b"b": None, b"c": b"3"})
    return changelog, changelog.segment_path(partition, batch_id), info


def test_a_whole_segment_passes_both_checks(tmp_path: Path) -> None:
    changelog, path, info = written(tmp_path)
    assert info.size == os.path.getsize(path) and info.rows == 3
    verify_landed(changelog.storage, path, info, "t", 7)
    check_visible(changelog.storage, {path: info}, "t", 7)
    check_visible(changelog.storage, {}, "t", 7)  # a batch without segments


@pytest.mark.parametrize("damage", ["truncate", "remove", "flip"])
def test_the_writer_notices_a_segment_that_did_not_land_whole(tmp_path: Path, damage: str) -> None:
    changelog, path, info = written(tmp_path)
    data = Path(path).read_bytes()
    if damage == "truncate":
        Path(path).write_bytes(data[: len(data) // 2])
    elif damage == "remove":
        os.remove(path)
    else:  # same size, other bytes: only the checksum tells
        Path(path).write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(CorruptSegmentError) as failed:
        verify_landed(changelog.storage, path, info, "t", 7)
    message = str(failed.value)
    assert "partition 2, batch 7 did not land" in message and path in message
    assert {"truncate": "bytes", "remove": "missing", "flip": "checksum"}[damage] in message
    assert failed.value.store == "t" and failed.value.partition == 2


def test_the_driver_notices_a_segment_missing_or_of_another_size(tmp_path: Path) -> None:
    changelog, path, info = written(tmp_path)
    _, other_path, other_info = written(tmp_path, partition=3)
    os.remove(other_path)
    with pytest.raises(CorruptSegmentError) as failed:
        check_visible(changelog.storage, {path: info, other_path: other_info}, "t", 7)
    message = str(failed.value)
    assert other_path in message and "missing where the driver looks" in message
    assert "docs/deploy.md" in message and failed.value.partition == 3

    Path(path).write_bytes(Path(path).read_bytes() + b"x")
    with pytest.raises(CorruptSegmentError, match=f"is {info.size + 1} bytes"):
        check_visible(changelog.storage, {path: info}, "t", 7)
