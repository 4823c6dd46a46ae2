"""sparkiq.testing: the kit users test their pipelines with, and the guide's example of it."""

from __future__ import annotations

import datetime as dt
import os
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from sparkiq import App
from sparkiq.testing import (
    LOCAL_SPARK_CONF,
    JsonSource,
    assert_table_matches,
    diff_table,
    spark_session,
    table_rows,
    temporary_state_dir,
)

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "guide.md"


def test_the_session_has_the_test_settings_and_overrides_apply(spark: Any) -> None:
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.shuffle.partitions") == "4"
    assert spark.conf.get("spark.ui.enabled") == "false"
    assert spark.conf.get("spark.sql.streaming.pollingDelay") == "100ms"
    assert LOCAL_SPARK_CONF["spark.driver.extraJavaOptions"] == "-Xss32m"
    try:
        again = spark_session(shuffle_partitions=3, config={"spark.sql.ansi.enabled": "true"})
        assert again is spark  # one session per process, as getOrCreate promises
        assert spark.conf.get("spark.sql.shuffle.partitions") == "3"
        assert spark.conf.get("spark.sql.ansi.enabled") == "true"
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", "4")
        spark.conf.unset("spark.sql.ansi.enabled")


def test_temporary_state_dir_is_new_and_removed_afterwards() -> None:
    with temporary_state_dir() as path:
        assert os.listdir(path) == []
        Path(path, "f").write_text("x")
    assert not os.path.exists(path)


def test_json_source_writes_values_spark_reads_back_exactly(spark: Any, tmp_path: Path) -> None:
    source = JsonSource(tmp_path / "in", "k string, day date, ts timestamp, amount decimal(10,2)")
    row = {
        "k": "a",
        "day": dt.date(2024, 2, 29),
        "ts": dt.datetime(2024, 5, 1, 10, 30, 0, 123456),
        "amount": Decimal("12.50"),
    }
    first = source.write([row])
    source.write([{"k": "b", "day": None, "ts": None, "amount": None}])
    assert first.name == "000000.json" and sorted(os.listdir(source.path))[1] == "000001.json"
    got = {r["k"]: r.asDict() for r in source.batch(spark).collect()}
    assert got == {"a": row, "b": {"k": "b", "day": None, "ts": None, "amount": None}}
    with pytest.raises(TypeError, match="cannot write a set"):
        source.write([{"k": {1}}])
    assert JsonSource(tmp_path / "in", source.schema).write([]).name == "000002.json"


def test_feed_waits_until_queries_see_the_batch_and_diffs_find_every_difference(
    spark: Any, tmp_path: Path
) -> None:
    from pyspark.sql import functions as F

    source = JsonSource(tmp_path / "in", "k string, n long, ts timestamp")

    def counts(df: Any) -> Any:
        return df.groupBy("k").agg(F.sum("n").alias("n"))

    def windows(df: Any) -> Any:
        return df.groupBy("k", F.window("ts", "1 minute")).agg(F.count("*").alias("events"))

    app = App(spark, state_dir=str(tmp_path / "state"), name="kit")
    app.materialize("counts", counts(source.stream(spark)), key="k", partitions=3)
    app.materialize("per_minute", windows(source.stream(spark)), key="k", window="window")
    app.start()
    try:
        t0 = dt.datetime(2024, 1, 1, 12, 0)
        source.feed(app, [{"k": "a", "n": 1, "ts": t0}, {"k": "b", "n": 2, "ts": t0}])
        assert app.get("counts", "a") == {"k": "a", "n": 1}
        source.feed(app, [{"k": "a", "n": 5, "ts": t0 + dt.timedelta(minutes=1)}])
        assert table_rows(app, "counts") == {"a": {"k": "a", "n": 6}, "b": {"k": "b", "n": 2}}
        assert_table_matches(app, "counts", counts(source.batch(spark)))
        assert_table_matches(app, "per_minute", windows(source.batch(spark)))
        assert set(table_rows(app, "per_minute")) == {
            ("a", t0),
            ("a", t0 + dt.timedelta(minutes=1)),
            ("b", t0),
        }

        wrong = [{"k": "a", "n": 7}, {"k": "c", "n": 1}]
        diff = diff_table(app, "counts", wrong)
        assert diff.missing == {"c": {"k": "c", "n": 1}}
        assert diff.unexpected == {"b": {"k": "b", "n": 2}}
        assert diff.different == {"a": ({"k": "a", "n": 6}, {"k": "a", "n": 7})}
        with pytest.raises(AssertionError, match=r"1 missing, 1 unexpected, 1 different"):
            assert_table_matches(app, "counts", wrong)
        # normalize sees both sides; a Node knows the layout too, a Client needs key=
        assert (
            diff_table(app.node, "counts", wrong, normalize=lambda row: {"k": row["k"]}).different
            == {}
        )
        with pytest.raises(TypeError, match="pass key="):
            diff_table(object(), "counts", wrong)
    finally:
        app.stop()


def guide_example() -> str:
    text = GUIDE.read_text()
    section = text[text.index("## Testing your pipeline") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the guide's testing section has a python example"
    return match.group(1)


def test_the_guides_testing_example_runs_as_written(spark: Any) -> None:
    namespace: dict[str, Any] = {"__name__": "guide_example"}
    exec(compile(guide_example(), str(GUIDE), "exec", dont_inherit=True), namespace)
    assert namespace["checked"] == ["p-1", "p-2"]
