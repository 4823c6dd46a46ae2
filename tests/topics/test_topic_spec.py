"""``sparkiq serve --follow-topic``'s spec, and a node's Kafka client settings file."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkiq.errors import ConfigError
from sparkiq.serving.topic import parse_topic_spec
from sparkiq.topics.consumer import read_client_config

SECRET = "s3cret-in-a-spec"


def test_a_spec_takes_client_settings_and_never_shows_them() -> None:
    spec = parse_topic_spec(
        f"totals=user-totals?key=user&columns=user+STRING&kafka.client.id=reader"
        f"&kafka.sasl.password={SECRET}"
    )
    assert (spec.name, spec.topic, spec.key, spec.columns) == (
        "totals",
        "user-totals",
        ("user",),
        "user STRING",
    )
    assert dict(spec.kafka_config) == {"client.id": "reader", "sasl.password": SECRET}
    assert SECRET not in repr(spec)
    with pytest.raises(ConfigError, match="'keys=user' is not an option") as raised:
        parse_topic_spec(f"user-totals?keys=user&kafka.sasl.password={SECRET}")
    assert SECRET not in str(raised.value)


def test_the_client_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "client.properties"
    path.write_text("# a comment\n! another\n\nsecurity.protocol = SASL_SSL\nsasl.password=a=b c\n")
    assert read_client_config(str(path)) == {
        "security.protocol": "SASL_SSL",
        "sasl.password": "a=b c",  # the first '=' separates
    }
    assert read_client_config(None) == {}
    path.write_text(f"security.protocol=SSL\nsasl.password {SECRET}\n")
    with pytest.raises(ConfigError, match=r"client.properties:2: expected KEY=VALUE") as raised:
        read_client_config(str(path))
    assert SECRET not in str(raised.value)
    with pytest.raises(ConfigError, match="cannot read the Kafka client settings file"):
        read_client_config(str(tmp_path / "missing.properties"))
