"""Principals from a file: tokens (plain or hashed), table patterns, rotation without a
restart, and files that are wrong."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from sparkiq import AuthenticationError, ConfigError, ForbiddenError
from sparkiq.principals import Principal, Principals, check_read, current, readable

ANALYST = "analyst-token-0001"
DASHBOARD = "dashboard-token-01"

FILE = f"""
[principals.analyst]
tokens = ["{ANALYST}"]
tables = ["revenue_by_product", "shop_*"]

[principals.dashboard]
token_sha256 = ["{hashlib.sha256(DASHBOARD.encode()).hexdigest()}"]
tables = ["revenue_by_product"]
"""


def write(path: Path, text: str) -> None:
    path.write_text(text)
    stamp = path.stat().st_mtime_ns + 1_000_000_000  # a change the next look will see
    os.utime(path, ns=(stamp, stamp))


def test_tokens_name_principals_and_patterns_grant_tables(tmp_path: Path) -> None:
    path = tmp_path / "principals.toml"
    write(path, FILE)
    principals = Principals(token="the-old-admin-token", path=str(path))
    assert principals.names() == ["default", "analyst", "dashboard"]
    analyst = principals.authenticate(ANALYST)
    assert analyst == Principal("analyst", ("revenue_by_product", "shop_*"))
    assert analyst.may_read("shop_orders") and not analyst.may_read("payroll")
    assert principals.authenticate(DASHBOARD).name == "dashboard"  # type: ignore[union-attr]
    assert principals.authenticate("the-old-admin-token").may_read("payroll")  # type: ignore[union-attr]
    for wrong in (None, "", "analyst-token-0002"):
        with pytest.raises(AuthenticationError, match="missing or wrong bearer token"):
            principals.authenticate(wrong)
    assert principals.passwords_of("analyst") == [ANALYST]
    assert principals.passwords_of("dashboard") == []  # hashed: not usable as a password


def test_checks_follow_the_current_principal() -> None:
    check_read(["anything"])  # in process: unrestricted
    assert readable(["a", "b"]) == ["a", "b"]
    reset = current.set(Principal("dashboard", ("revenue_by_product",)))
    try:
        check_read(["revenue_by_product"])
        with pytest.raises(ForbiddenError, match="'dashboard' may not read 'payroll'"):
            check_read(["revenue_by_product", "payroll"])
        assert readable(["payroll", "revenue_by_product"]) == ["revenue_by_product"]
    finally:
        current.reset(reset)


def test_tokens_rotate_without_a_restart_and_a_bad_file_keeps_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sparkiq.principals._LOOK_EVERY", 0.0)
    path = tmp_path / "principals.toml"
    write(path, FILE)
    principals = Principals(path=str(path))
    new = "analyst-token-0002"
    write(path, FILE.replace(f'tokens = ["{ANALYST}"]', f'tokens = ["{ANALYST}", "{new}"]'))
    assert principals.authenticate(new).name == "analyst"  # type: ignore[union-attr]
    assert principals.authenticate(ANALYST).name == "analyst"  # type: ignore[union-attr]
    write(path, FILE.replace(f'tokens = ["{ANALYST}"]', f'tokens = ["{new}"]'))
    with pytest.raises(AuthenticationError):
        principals.authenticate(ANALYST)
    write(path, "[principals.analyst\ntokens = [")  # caught half-written
    assert principals.authenticate(new).name == "analyst"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", r"no \[principals.<name>\] section"),
        ("[principals.a]\ntables = ['t']\n", "has no tokens and no token_sha256"),
        ("[principals.a]\ntokens = ['short']\ntables = ['t']\n", "at least 16 characters"),
        ("[principals.a]\ntokens = ['x' ]\n", "tables must be a list"),
        ("[principals.a]\ntoken_sha256 = ['abc']\ntables = ['t']\n", "64 hex digits"),
        ("[principals.a]\npassword = 'p'\n", r"unknown keys \['password'\]"),
        ("[principals.a\n", "cannot read the principals file"),
    ],
)
def test_a_wrong_file_stops_the_node_naming_the_problem(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "principals.toml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        Principals(path=str(path))
    with pytest.raises(ConfigError, match="cannot read the principals file"):
        Principals(path=str(tmp_path / "missing.toml"))
