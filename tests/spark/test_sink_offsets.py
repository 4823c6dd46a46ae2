"""Source end offsets come from Spark's offset log; Kafka-shaped offsets become positions.

There is no Kafka broker on the test machine, so the Kafka case is checked on an offset log
written in the format Spark's Kafka source uses (``{"topic": {"partition": offset}}``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkiq.errors import ChangelogError
from sparkiq.spark.sink import position_components, pyarrow_uri, read_source_offsets, spark_uri

OFFSET_LOG = """v1
{"batchWatermarkMs":0,"batchTimestampMs":1763776000000,"conf":{}}
{"orders":{"0":120,"1":98,"2":0},"payments":{"0":7}}
{"logOffset":4}
-
"""


def test_offsets_are_read_per_source_and_kafka_offsets_become_components(tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    (checkpoint / "offsets").mkdir(parents=True)
    (checkpoint / "offsets" / "3").write_text(OFFSET_LOG)
    offsets = read_source_offsets(str(checkpoint), 3)
    assert offsets == [
        {"orders": {"0": 120, "1": 98, "2": 0}, "payments": {"0": 7}},
        {"logOffset": 4},
        None,
    ]
    assert position_components(offsets) == {
        "kafka:orders": {0: 120, 1: 98, 2: 0},
        "kafka:payments": {0: 7},
    }


def test_a_missing_offset_log_names_the_checkpoint(tmp_path: Path) -> None:
    with pytest.raises(ChangelogError, match="offset log for batch 9 is missing"):
        read_source_offsets(str(tmp_path), 9)


def test_s3_spellings() -> None:
    assert spark_uri("s3://b/p") == "s3a://b/p"
    assert pyarrow_uri("s3a://b/p") == "s3://b/p"
    assert spark_uri("/local/path") == pyarrow_uri("/local/path") == "/local/path"
