"""Settings groups from keywords, then SPARKIQ_<GROUP>_<NAME> variables, then defaults."""

from __future__ import annotations

import pytest

from sparkiq import ConfigError
from sparkiq.cluster.config import NodeConfig
from sparkiq.envsettings import values_from_env
from sparkiq.server.auth_failures import AuthFailures

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
