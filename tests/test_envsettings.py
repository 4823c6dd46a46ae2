"""Settings groups from keywords, then SPARKIQ_<GROUP>_<NAME> variables, then defaults."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import sparkiq
from sparkiq import ConfigError
from sparkiq.envsettings import values_from_env
from sparkiq.server.auth_failures import AuthFailures
from sparkiq.serving.config import ENV_GROUPS, ENV_VARIABLES, NodeConfig

KINDS = {"free_failures": int, "max_delay": float}


def test_keywords_win_then_variables_and_empty_ones_are_unset() -> None:
    env = {"SPARKIQ_AUTH_FREE_FAILURES": "5", "SPARKIQ_AUTH_MAX_DELAY": ""}
    assert values_from_env(KINDS, "AUTH", {}, environ=env) == {"free_failures": 5}
    given = values_from_env(KINDS, "AUTH", {"free_failures": 9, "max_delay": None}, environ=env)
    assert given == {"free_failures": 9}  # None is "not given": the variable still counts


def test_bad_values_and_unknown_keywords_name_the_problem() -> None:
    with pytest.raises(ConfigError, match="SPARKIQ_AUTH_MAX_DELAY='soon' is not a number"):
        values_from_env(KINDS, "AUTH", {}, environ={"SPARKIQ_AUTH_MAX_DELAY": "soon"})
    with pytest.raises(ConfigError, match=r"unknown auth settings \['max_dely'\]"):
        values_from_env(KINDS, "AUTH", {"max_dely": 1.0})


def test_every_group_reads_its_variables() -> None:
    env = {
        "SPARKIQ_SQL_MEMORY_LIMIT": "256MB",
        "SPARKIQ_HTTP_MAX_HEADER_BYTES": "4096",
        "SPARKIQ_PG_MAX_PARAMETERS": "12",
        "SPARKIQ_AUTH_MAX_DELAY": "7.5",
    }
    config = NodeConfig.resolve("/s", environ=env)
    assert config.sql_limits.memory_limit == "256MB"
    assert config.http_limits.max_header_bytes == 4096
    assert config.pg_limits.max_parameters == 12
    assert config.auth_policy.max_delay == 7.5
    assert AuthFailures(config.auth_policy).max_delay == 7.5


# -- who reads the environment ---------------------------------------------------------------

SRC = Path(sparkiq.__file__).resolve().parent
#: The modules that read a node's variables: every other one gets its settings from them.
SETTINGS_READERS = {"envsettings.py", "serving/config.py"}
#: Modules that read variables of their own, none of them a node setting (docs/design.md,
#: "every node setting in NodeConfig").
OTHER_READERS = {
    "cli.py": "the command line's own options: SPARKIQ_STATE_DIR, SPARKIQ_DEMO_*, "
    "SPARKIQ_CHECKPOINT, and the client commands' SPARKIQ_URL, SPARKIQ_TOKEN, SPARKIQ_TLS_CA",
    "shell.py": "SPARKIQ_HISTORY, where the shell keeps its history",
    "spark/sink.py": "the tests' fault injection (SPARKIQ_TEST_*), SPARKIQ_SINK_SHUFFLE (shuffle "
    "every batch), SPARKIQ_SINK_WRITE (where segments are written) and PYSPARK_PYTHON",
    "spark/segment_writer.py": "the tests' segment fault injection (SPARKIQ_TEST_SEGMENT_FAULT)",
    "spark/worker_python.py": "the Spark worker's connect-back variables",
    "spark/publishing.py": "SPARKIQ_KAFKA_BOOTSTRAP, the brokers an App's publishers use when "
    "materialize names none (the App is not a node; the same variable names the brokers)",
    "publish/publisher.py": "the tests' pause inside a transaction (SPARKIQ_TEST_PUBLISH_PAUSE)",
    "testing/sessions.py": "SPARK_REMOTE and the test Spark session's interpreter",
    "testing/kafka.py": "SPARKIQ_KAFKA_JARS and JAVA_HOME: the test broker's jars and JVM",
}
#: A client command reads the variable a node reads for the same value: the token it
#: presents, the CA it trusts (one environment serves `sparkiq serve` and `sparkiq query`).
SHARED_WITH_CLIENTS = {
    ("cli.py", "SPARKIQ_TOKEN"),
    ("cli.py", "SPARKIQ_TLS_CA"),
    ("spark/publishing.py", "SPARKIQ_KAFKA_BOOTSTRAP"),  # an App's publishers: one variable
    ("cli.py", "SPARKIQ_KAFKA_BOOTSTRAP"),  # `sparkiq publish`: the brokers `serve` reads too
}
_VARIABLE = re.compile(r"SPARKIQ_[A-Z0-9_]*")


def _reads_environment(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in ("environ", "environb", "getenv")
            and isinstance(node.value, ast.Name)
            and node.value.id == "os"
        ):
            return True
        if (
            isinstance(node, ast.ImportFrom)
            and node.module == "os"
            and {a.name for a in node.names} & {"environ", "environb", "getenv"}
        ):
            return True
    return False


def _is_node_variable(name: str) -> bool:
    prefixes = tuple(f"SPARKIQ_{group}_" for _, group in ENV_GROUPS.values())
    return name in ENV_VARIABLES.values() or name.startswith(prefixes)


def test_only_the_configuration_reads_a_nodes_variables() -> None:
    strays, node_variables = [], []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        tree = ast.parse(path.read_text())
        if module in SETTINGS_READERS or not _reads_environment(tree):
            continue
        if module not in OTHER_READERS:
            strays.append(module)
        named = {
            node.value
            for node in ast.walk(tree)
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _VARIABLE.fullmatch(node.value)
        }
        node_variables += [
            f"{module}: {name}"
            for name in sorted(named)
            if _is_node_variable(name) and (module, name) not in SHARED_WITH_CLIENTS
        ]
    assert strays == [], "read settings through NodeConfig, or list the module with a reason"
    assert node_variables == [], "a node's variables are read by NodeConfig only"


def test_the_check_sees_a_node_variable_read_elsewhere() -> None:
    tree = ast.parse('import os\nos.environ.get(f"SPARKIQ_SQL_{name}")\n')
    assert _reads_environment(tree)
    assert _is_node_variable("SPARKIQ_SQL_") and _is_node_variable("SPARKIQ_LISTEN")
    assert not _is_node_variable("SPARKIQ_HISTORY")
