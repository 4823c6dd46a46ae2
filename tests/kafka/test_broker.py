"""sparkiq.testing.kafka_broker: where it finds its jars and what it says when it cannot
start (tests/kafka/test_kafka_source.py has the broker serving a client)."""

from __future__ import annotations

import re
import shutil
import socket
from pathlib import Path

import pytest

from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.testing import KafkaBroker, kafka_broker, kafka_jars_dir, spark_kafka_jars


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


def test_a_broker_that_exits_names_its_kept_log() -> None:
    with socket.socket() as busy, socket.socket() as free:
        busy.bind(("127.0.0.1", 0))
        busy.listen()  # the broker's listener cannot have this port
        free.bind(("127.0.0.1", 0))
        taken, controller = busy.getsockname()[1], free.getsockname()[1]
        free.close()
        config = {
            "listeners": f"PLAINTEXT://127.0.0.1:{taken},CONTROLLER://127.0.0.1:{controller}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{taken}",
            "controller.quorum.voters": f"1@127.0.0.1:{controller}",
        }
        named = r"did not start \(exited with code \d+\); its log is (\S+kafka\.log)"
        with pytest.raises(SparkiqError, match=named) as failure, kafka_broker(config=config):
            pass
    found = re.search(named, str(failure.value))
    assert found is not None
    log = Path(found[1])
    try:
        assert f"127.0.0.1:{taken}" in log.read_text()  # Kafka says which address it wanted
        assert f"failed to bind to 127.0.0.1:{taken}: Address already in use" in str(
            failure.value
        )  # and the error quotes why, not the end of a stack trace
    finally:
        shutil.rmtree(log.parent)


def test_a_broker_handle_outside_its_block_says_so() -> None:
    broker = KafkaBroker()  # finds its jars and java; starts nothing
    with pytest.raises(SparkiqError, match="use it in a with block"):
        broker.start()
    with pytest.raises(SparkiqError, match="use it in a with block"):
        _ = broker.bootstrap_servers
    assert not broker.running
    broker.stop()  # nothing to stop
    broker.close()
