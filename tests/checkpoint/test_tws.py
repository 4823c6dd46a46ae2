"""transformWithStateInPandas state variables read from a RocksDB checkpoint, compared with
Spark's own State Data Source (``stateVarName``) batch by batch: value, list and map state,
with puts, appends, clears and removals, with changelog checkpointing on and off."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sparkiq.checkpoint import Checkpoint, RowDecoder, replay
from sparkiq.checkpoint.rocksdb_stores import open_state_variable
from sparkiq.checkpoint.tws import (
    LIST_INDEX,
    read_schema_v3,
    served_schemas,
    state_variables,
    variable_kind,
)
from sparkiq.errors import ChangelogError
from sparkiq.schema.types import parse_type
from sparkiq.testing import JsonSource
from tests.checkpoint.test_rocksdb import PARTITIONS, committed, plain, rocksdb_conf

# One file per batch; a negative value clears the key's list, value and one map entry, a zero
# replaces the list (a put of the whole list), anything else appends.
BATCHES = [
    [("a", 1), ("a", 2), ("b", 3), ("c", 5)],
    [("a", 0), ("b", 4), ("b", 5), ("c", -2)],
    [("a", 7), ("b", -1), ("d", 9)],
    [("c", 8), ("a", 10)],
]


def _processor() -> Any:
    import pandas as pd
    from pyspark.sql.streaming import StatefulProcessor
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    class Tracker(StatefulProcessor):  # type: ignore[misc]
        def init(self, handle: Any) -> None:
            self.count = handle.getValueState("count", StructType([StructField("n", LongType())]))
            self.items = handle.getListState(
                "items",
                StructType([StructField("x", LongType()), StructField("tag", StringType())]),
            )
            self.latest = handle.getMapState(
                "latest",
                StructType([StructField("bucket", StringType())]),
                StructType([StructField("v", LongType()), StructField("note", StringType())]),
            )

        def handleInputRows(self, key: Any, rows: Iterator[Any], timerValues: Any) -> Any:
            values = [int(v) for frame in rows for v in frame["v"]]
            appended = []
            for v in values:
                if v < 0:
                    self.items.clear()
                    self.count.clear()
                    self.latest.removeKey((str(-v % 3),))
                    appended = []
                elif v == 0:
                    self.items.put([(100, "reset")])
                    appended = []
                else:
                    appended.append((v, f"t{v}"))
                    self.latest.updateValue((str(v % 3),), (v, f"n{v}"))
            if appended:
                self.items.appendList(appended)
            if any(v >= 0 for v in values):
                before = self.count.get()[0] if self.count.exists() else 0
                self.count.update((before + len(values),))
            yield pd.DataFrame({"k": [key[0]], "n": [len(values)]})

        def close(self) -> None:
            pass

    return Tracker()


@pytest.fixture(scope="module", params=[True, False], ids=["changelog", "snapshots"])
def checkpoint(
    request: pytest.FixtureRequest, spark: Any, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    base = tmp_path_factory.mktemp("tws")
    source = JsonSource(base / "in", "k string, v long")
    with rocksdb_conf(spark, changelog=request.param):
        frame = (
            source.stream(spark)
            .groupBy("k")
            .transformWithStateInPandas(
                _processor(),
                outputStructType="k string, n long",
                outputMode="Update",
                timeMode="None",
            )
        )
        query = (
            frame.writeStream.format("noop")
            .outputMode("update")
            .option("checkpointLocation", str(base / "cp"))
            .trigger(availableNow=True)
        )
        for rows in BATCHES:
            source.write([{"k": k, "v": v} for k, v in rows])
            handle = query.start()
            handle.awaitTermination()
            assert handle.exception() is None
    return base / "cp"


def spark_rows(spark: Any, checkpoint: Path, batch: int, variable: str) -> list[Any]:
    return (
        spark.read.format("statestore")
        .option("batchId", batch)
        .option("stateVarName", variable)
        .load(str(checkpoint))
        .collect()
    )


def ours(checkpoint: Path, variable: str, version: int) -> list[tuple[Any, Any]]:
    cp = Checkpoint(str(checkpoint))
    info = cp.store(variable)
    decoder = RowDecoder(info)
    rows = []
    for partition in range(info.partitions):
        for key, value in replay(cp.files(info, partition), version).items():
            rows.append(decoder.row(key, value))
    return rows


def test_the_stores_are_the_state_variables_with_table_schemas(checkpoint: Path) -> None:
    cp = Checkpoint(str(checkpoint))
    stores = {s.store_name: s for s in cp.stores()}
    assert set(stores) == {"count", "items", "latest"}  # no $rowCounter_ bookkeeping
    assert stores["count"].key_schema.simple_string() == "struct<k:string>"
    assert stores["items"].key_schema.simple_string() == f"struct<k:string,{LIST_INDEX}:int>"
    assert stores["items"].value_schema.simple_string() == "struct<x:bigint,tag:string>"
    assert stores["latest"].key_schema.simple_string() == "struct<k:string,bucket:string>"
    assert stores["latest"].value_schema.simple_string() == "struct<v:bigint,note:string>"
    assert all(s.partitions == PARTITIONS and s.provider == "rocksdb" for s in stores.values())


def test_value_state_equals_spark(spark: Any, checkpoint: Path) -> None:
    for batch in committed(checkpoint):
        want = {
            (plain(r["key"]), plain(r["value"]))
            for r in spark_rows(spark, checkpoint, batch, "count")
        }
        assert set(ours(checkpoint, "count", batch + 1)) == want, f"batch {batch}"


def test_list_state_is_one_row_per_element_in_list_order(spark: Any, checkpoint: Path) -> None:
    for batch in committed(checkpoint):
        want: dict[Any, list[Any]] = {}
        for r in spark_rows(spark, checkpoint, batch, "items"):
            want.setdefault(plain(r["key"]), []).append(plain(r["list_element"]))
        got: dict[Any, list[Any]] = {}
        for key, value in sorted(ours(checkpoint, "items", batch + 1)):
            *grouping, index = key
            assert index == len(got.setdefault(tuple(grouping), []))  # 0, 1, 2... no gaps
            got[tuple(grouping)].append(value)
        assert got == want, f"batch {batch}"
    # the cases the batches exercise: appends, a put replacing the list, a clear
    final = committed(checkpoint)[-1]
    lists: dict[str, list[Any]] = {"a": [], "b": [], "c": []}
    for (grouping, _), element in sorted(ours(checkpoint, "items", final + 1)):
        lists.setdefault(grouping, []).append(element)
    assert lists["a"] == [(100, "reset"), (7, "t7"), (10, "t10")]
    assert lists["b"] == []
    assert lists["c"] == [(8, "t8")]


def test_map_state_is_one_row_per_user_key(spark: Any, checkpoint: Path) -> None:
    for batch in committed(checkpoint):
        want = {
            (plain(r["key"]) + plain(r["user_map_key"]), plain(r["user_map_value"]))
            for r in spark_rows(spark, checkpoint, batch, "latest")
        }
        assert set(ours(checkpoint, "latest", batch + 1)) == want, f"batch {batch}"


def test_list_state_read_out_of_order_rebuilds_its_lengths(checkpoint: Path) -> None:
    cp = Checkpoint(str(checkpoint))
    info = cp.store("items")
    for partition in range(info.partitions):
        in_order = replay(cp.files(info, partition), len(BATCHES))
        files = cp.files(info, partition)
        list(files.changes(2))  # leaves the reader at version 2
        state = replay(files, len(BATCHES))
        assert state == in_order


def test_internal_column_families_and_unknown_kinds_are_refused(checkpoint: Path) -> None:
    folder = checkpoint / "state" / "0" / "_stateSchema" / "default"
    schema_file = next(p for p in folder.iterdir() if not p.name.startswith("."))
    families = {f.name: f for f in read_schema_v3(schema_file)}
    assert "$rowCounter_items" in families
    assert families["latest"].key_encoder == {
        "keyStateEncoderType": "PrefixKeyScanStateEncoderSpec",
        "numColsPrefixKey": 1,
    }
    with pytest.raises(ChangelogError, match="internal bookkeeping"):
        open_state_variable(
            checkpoint / "state" / "0" / "0",
            "value",
            column_family="$rowCounter_items",
            key_schema=families["$rowCounter_items"].key_schema,
        )
    with pytest.raises(ChangelogError, match="ValueState, ListState and MapState"):
        variable_kind("TimerState")
    folder = checkpoint / "state" / "0" / "_metadata" / "v2"
    newest = max((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    metadata = json.loads(newest.read_text().partition("\n")[2])
    variables = state_variables(metadata, 0)
    assert {name: v.kind for name, v in variables.items()} == {
        "count": "value",
        "items": "list",
        "latest": "map",
    }


def test_timers_are_not_state_variables() -> None:
    properties = {
        "timeMode": "ProcessingTime",
        "stateVariables": [
            {"stateName": "cnt", "stateVariableType": "ValueState", "ttlEnabled": True},
            {"stateName": "$procTimers_keyToTimestamp", "stateVariableType": "TimerState"},
        ],
    }
    found = state_variables({"operatorPropertiesJson": json.dumps(properties)}, 3)
    assert list(found) == ["cnt"]
    assert found["cnt"].kind == "value" and found["cnt"].ttl
    with pytest.raises(ChangelogError, match="operator 3: unreadable operatorPropertiesJson"):
        state_variables({"operatorPropertiesJson": "{"}, 3)


def test_a_corrupt_schema_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "0_schema"
    path.write_bytes(b"\x00\x02v3\x00\x00\x00\x01\x00\x03abc\x00")
    with pytest.raises(ChangelogError, match="not a readable v3 schema file"):
        read_schema_v3(path)


def test_served_schemas_rename_user_key_columns_that_clash() -> None:
    grouping = {"type": "struct", "fields": [{"name": "k", "type": "string"}]}
    key = parse_type(
        json.loads(
            json.dumps(
                {
                    "type": "struct",
                    "fields": [
                        {"name": "key", "type": grouping},
                        {"name": "userKey", "type": grouping},
                    ],
                }
            )
        )
    )
    value = parse_type({"type": "struct", "fields": [{"name": "v", "type": "long"}]})
    served_key, served_value = served_schemas("map", key, value)
    assert served_key.simple_string() == "struct<k:string,user_k:string>"
    assert served_value == value
