"""sparkiq.testing.kafka_broker: where it finds its jars and what it says when it cannot
start (tests/kafka/test_kafka_source.py has the broker serving a client)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.testing import kafka_broker, kafka_jars_dir, spark_kafka_jars


def test_missing_jars_say_to_run_the_make_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = r"no jars in .*kafka-broker: run `make jvm-jars`"
    with pytest.raises(ConfigError, match=missing), kafka_broker(jars=tmp_path):
        pass
    with pytest.raises(ConfigError, match="SPARKIQ_KAFKA_JARS"):
        spark_kafka_jars(jars=tmp_path)
    monkeypatch.setenv("SPARKIQ_KAFKA_JARS", str(tmp_path))
    assert kafka_jars_dir() == tmp_path
    with pytest.raises(ConfigError, match=re.escape(str(tmp_path / "spark-kafka"))):
        spark_kafka_jars()
    assert kafka_jars_dir(tmp_path / "other") == tmp_path / "other"  # the argument wins


def test_the_default_jars_are_the_checkouts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SPARKIQ_KAFKA_JARS", raising=False)
    jars = kafka_jars_dir()
    assert jars == Path(__file__).resolve().parents[2] / ".jvm"
    names = [Path(p).name for p in spark_kafka_jars()]
    assert any(n.startswith("spark-sql-kafka-0-10_2.13-") for n in names), names
    assert not any(n.startswith(("spark-core", "scala-library")) for n in names), names


def test_a_broker_that_cannot_start_names_its_kept_log() -> None:
    named = r"its log is (\S+kafka\.log)"
    with (
        pytest.raises(SparkiqError, match=named) as failure,
        kafka_broker(config={"node.id": "not-a-number"}),
    ):
        pass
    found = re.search(named, str(failure.value))
    assert found is not None
    log = Path(found[1])
    try:
        # Kafka's own words, in the kept log and quoted in the error
        assert "Invalid value not-a-number for configuration" in log.read_text()
        assert "Invalid value not-a-number for configuration" in str(failure.value)
    finally:
        shutil.rmtree(log.parent)
