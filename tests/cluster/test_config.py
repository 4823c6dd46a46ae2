"""NodeConfig: keyword arguments, then SPARKIQ_* variables, then defaults; clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from sparkiq import ConfigError, Node
from sparkiq.serving.config import ENV_VARIABLES, NodeConfig
from tests.changelog.helpers import make_table


def test_arguments_win_over_variables_which_win_over_defaults() -> None:
    env = {
        "SPARKIQ_NODE_ID": "env-node",
        "SPARKIQ_LISTEN": "127.0.0.1:9000",
        "SPARKIQ_PEERS": "a:1, b:2,,",
        "SPARKIQ_STANDBYS": "2",
        "SPARKIQ_TOKEN": "tok",
        "SPARKIQ_CLUSTER_SECRET": "a-secret-of-the-nodes",
        "SPARKIQ_LOCAL_DIR": "/tmp/here",
        "SPARKIQ_HEARTBEAT_INTERVAL": "0.25",
        "SPARKIQ_FAILURE_TIMEOUT": "4",
        "SPARKIQ_ADVERTISE": "http://me:9000",
    }
    from_env = NodeConfig.resolve("/s", environ=env)
    assert from_env == NodeConfig(
        state_dir="/s",
        node_id="env-node",
        listen="127.0.0.1:9000",
        advertise="http://me:9000",
        peers=("http://a:1", "http://b:2"),
        standbys=2,
        token="tok",
        cluster_secret="a-secret-of-the-nodes",
        local_dir="/tmp/here",
        heartbeat_interval=0.25,
        failure_timeout=4.0,
    )
    assert from_env.clustered
    given = NodeConfig.resolve("/s", environ=env, node_id="mine", standbys=0, peers=["c:3"])
    assert (given.node_id, given.standbys, given.peers) == ("mine", 0, ("http://c:3",))
    # None means "not set, and ignore the variable"
    ignored = NodeConfig.resolve("/s", environ=env, listen=None, peers=None, token=None)
    assert (ignored.listen, ignored.peers, ignored.token, ignored.clustered) == (
        None,
        (),
        None,
        False,
    )
    # a caller's own defaults come after the variables
    assert NodeConfig.resolve("/s", environ={}, defaults={"listen": "h:1"}).listen == "h:1"
    assert NodeConfig.resolve("/s", environ=env, defaults={"listen": "h:1"}).listen == (
        "127.0.0.1:9000"
    )
    assert NodeConfig.resolve("/s", environ={}) == NodeConfig(state_dir="/s")


def test_every_variable_is_read_and_empty_ones_are_unset() -> None:
    for field, variable in ENV_VARIABLES.items():
        value = {
            "standbys": "3",
            "heartbeat_interval": "2",
            "failure_timeout": "5",
            "cluster_secret": "sixteen-chars-or-more",
            "allowed_hosts": "sparkiq.example.com",
            "pg_tls": "optional",
            "kafka_interval": "2",
            "source_wait": "2",
            "membership": "heartbeats",  # not the default (gossip)
        }.get(field, "127.0.0.1:1")
        environ = {variable: value}
        if field.startswith("tls_"):  # the TLS files go together
            environ |= {ENV_VARIABLES[f]: "/etc/x.pem" for f in ("tls_cert", "tls_key")}
        resolved = getattr(NodeConfig.resolve("/s", environ=environ), field)
        assert resolved not in (None, (), NodeConfig.__dataclass_fields__[field].default), field
    assert NodeConfig.resolve("/s", environ={"SPARKIQ_LISTEN": ""}).listen is None


def test_a_node_named_after_its_address_when_asked() -> None:
    assert NodeConfig.resolve("/s", environ={}, node_id=None, listen="h:7").node_id == "h:7"
    assert NodeConfig.resolve("/s", environ={}, node_id=None).node_id == "local"
    env = {"SPARKIQ_LISTEN": "h:8"}
    assert NodeConfig.resolve("/s", environ=env, defaults={"node_id": None}).node_id == "h:8"


@pytest.mark.parametrize(
    ("given", "env", "message"),
    [
        ({"standbys": "two"}, {}, r"^standbys must be an int, got 'two'$"),
        ({}, {"SPARKIQ_STANDBYS": "two"}, r"standbys must be an int.*set by SPARKIQ_STANDBYS"),
        ({"standbys": -1}, {}, "standbys must be >= 0"),
        ({"standbys": 1.5}, {}, "standbys must be an int"),
        ({}, {"SPARKIQ_FAILURE_TIMEOUT": "0"}, "failure_timeout must be a positive number"),
        ({"poll_interval": "soon"}, {}, "poll_interval must be a number"),
        ({}, {"SPARKIQ_SOURCE_WAIT": "-1"}, r"source_wait must be 0 to 3600 seconds.*SOURCE_WAIT"),
        ({"poll_interval": True}, {}, "poll_interval must be a number"),
        ({"store": "sqlite"}, {}, "store must be 'rocksdb' or 'memory'"),
        (
            {},
            {"SPARKIQ_MEMBERSHIP": "swim"},
            r"membership must be 'gossip' or 'heartbeats', got 'swim'.*SPARKIQ_MEMBERSHIP",
        ),
        (
            {},
            {"SPARKIQ_PG_TLS": "prefer"},
            r"^pg_tls must be 'require' or 'optional', got 'prefer' \(set by SPARKIQ_PG_TLS\)$",
        ),
        ({"node_id": " "}, {}, "node_id must be a non-empty string"),
        ({"listen": 8080}, {}, "listen must be a string"),
        ({"peers": [1]}, {}, "peers must be addresses"),
        ({"cluster_secret": "short"}, {}, "cluster_secret must be at least 16 characters"),
        (
            {"cluster_secret": "sixteen-chars-or-more", "token": "sixteen-chars-or-more"},
            {},
            "cluster_secret must differ from token",
        ),
        (
            {"peers": ["127.0.0.1:9"]},
            {"SPARKIQ_TOKEN": "tok"},
            r"a node with a token \(or principals\) joins peers only with a cluster secret.*"
            r"--cluster-secret",
        ),
        (
            {"peers": ["127.0.0.1:9", "10.1.2.3:9"]},
            {},
            r"peers \['http://10.1.2.3:9'\] are not on this host.*cluster_secret",
        ),
        ({"colour": "red"}, {}, r"unknown node option\(s\) \['colour'\]"),
    ],
)
def test_bad_settings_name_the_option_and_the_variable(
    given: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        NodeConfig.resolve("/s", environ=env, **given)


def test_a_node_takes_a_config_or_settings_not_both(tmp_path: Path) -> None:
    make_table(str(tmp_path))
    config = NodeConfig.resolve(str(tmp_path), environ={}, node_id="cfg", store="memory")
    with Node(config=config) as node:
        assert (node.node_id, node.local_dir, node.clustered) == ("cfg", None, False)
        assert node.tables == ["t"]
    with pytest.raises(ConfigError, match="either config= or settings"):
        Node(config=config, standbys=2)
    with pytest.raises(ConfigError, match="needs a state_dir"):
        Node()
    rocks = Node(str(tmp_path), node_id="r", listen=None, peers=None)
    assert rocks.local_dir == str(tmp_path / "replicas" / "r")
