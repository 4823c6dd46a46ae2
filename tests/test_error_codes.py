"""The ErrorCode table: every row complete and unique, every error class in it, every renderer
reading it, and docs/rest.md listing exactly its rows."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import orjson
import pytest

import sparkiq
from sparkiq.client import _error
from sparkiq.error_codes import ErrorCode
from sparkiq.errors import (
    InvalidQueryError,
    NodeUnreachableError,
    SparkiqError,
    error_code,
    exception_class,
)
from sparkiq.server.http_errors import HttpError, classify
from sparkiq.server.pg.errors import StatementCanceledError, error_fields, sqlstate
from sparkiq.sql.errors import SqlError, SqlLimitError, SqlPartitionError
from sparkiq.wire.protocol import RemoteError, error_frame, read_frames, results_from_frames

DOCS = Path(__file__).resolve().parents[1] / "docs" / "rest.md"


def all_error_classes() -> list[type[SparkiqError]]:
    """Every SparkiqError subclass in the package (each module imported first)."""
    for module in pkgutil.walk_packages(sparkiq.__path__, "sparkiq."):
        importlib.import_module(module.name)
    found, todo = [], [SparkiqError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_code_has_one_unique_wire_string_and_a_complete_row() -> None:
    assert len(ErrorCode.__members__) == len(list(ErrorCode))  # no alias: wire strings unique
    for code in ErrorCode:
        assert re.fullmatch(r"[a-z][a-z_]*", code.wire), code
        assert ErrorCode.parse(code.wire) is code
        assert 400 <= code.status <= 599, code
        assert re.fullmatch(r"[0-9A-Z]{5}", code.sqlstate), code
        assert isinstance(code.retryable, bool), code
        assert code.todo and "\n" not in code.todo and "|" not in code.todo, code
        assert issubclass(exception_class(code), SparkiqError), code


def test_an_unknown_code_reads_as_itself_with_an_upstream_row() -> None:
    code = ErrorCode.parse("a_newer_nodes_code")
    assert code == "a_newer_nodes_code" and code.wire == "a_newer_nodes_code"
    assert code not in list(ErrorCode)
    assert (code.status, code.sqlstate) == (502, "58000")
    assert exception_class(code) is RemoteError
    with pytest.raises(ValueError):
        ErrorCode.parse("")


def test_every_error_class_carries_a_listed_code() -> None:
    classes = all_error_classes()
    assert len(classes) > 30  # the walk found the tree, not just the root
    for cls in classes:
        assert cls.code in list(ErrorCode), cls
    # classes a renderer used to single out keep their codes
    assert StatementCanceledError.code is ErrorCode.CANCELED
    assert SqlPartitionError.code is ErrorCode.PARTITION_FAILED
    assert NodeUnreachableError.code is ErrorCode.UPSTREAM_UNAVAILABLE


@pytest.mark.parametrize("code", list(ErrorCode), ids=str)
def test_rest_and_postgres_render_the_row_and_the_client_raises_its_class(
    code: ErrorCode,
) -> None:
    error = SqlError("the problem", code=code, field="f", line=1, column=2, snippet="x\n ^")
    rendered = classify(error)
    assert (rendered.status, rendered.code, rendered.field) == (code.status, code, "f")
    assert sqlstate(error) == code.sqlstate
    assert error_fields(error, "x")["C"] == code.sqlstate
    doc = {"code": rendered.code.wire, "message": rendered.message, "field": rendered.field}
    body = orjson.dumps({"error": doc | rendered.extra})  # as server/asgi.send_error
    raised = _error(rendered.status, body)
    assert type(raised) is exception_class(code)
    assert raised.code is code and raised.retryable is code.retryable
    if isinstance(raised, SqlError):  # where the problem is survives the trip
        assert (raised.line, raised.column, raised.snippet) == (1, 2, "x\n ^")
    if isinstance(raised, RemoteError):
        assert raised.message == f"{code.status}: the problem"
    else:
        assert raised.message == "the problem"


def test_a_relayed_failure_is_answered_as_upstream_unavailable() -> None:
    relayed = RemoteError("502: no", code=ErrorCode.UNKNOWN_STORE, field="store")
    assert relayed.code is ErrorCode.UNKNOWN_STORE  # what the other node said
    rendered = classify(relayed)
    assert (rendered.status, rendered.code, rendered.field) == (
        502,
        ErrorCode.UPSTREAM_UNAVAILABLE,
        None,
    )
    assert sqlstate(relayed) == "58000"


def test_faults_outside_the_tree() -> None:
    deep = classify(RecursionError("maximum recursion depth exceeded"))
    assert (deep.status, deep.code) == (400, ErrorCode.NESTING_TOO_DEEP)
    assert sqlstate(RecursionError()) == "54000"
    bug = classify(KeyError("x"))
    assert (bug.status, bug.code) == (500, ErrorCode.INTERNAL_ERROR)
    assert "request id" in bug.message and "KeyError" not in bug.message
    assert sqlstate(KeyError("x")) == "XX000"
    assert error_code(ValueError()) is ErrorCode.INTERNAL_ERROR


def test_an_http_error_is_its_own_answer() -> None:
    refused = HttpError(ErrorCode.BODY_TOO_LARGE, "too big", "body")
    assert classify(refused) is refused and refused.status == 413
    assert isinstance(refused, SparkiqError)


def test_a_class_default_code_and_a_raisers_code() -> None:
    assert InvalidQueryError("x").code is ErrorCode.INVALID_QUERY
    assert InvalidQueryError("x", code=ErrorCode.BAD_AS_OF, field="t").field == "t"
    assert SqlLimitError("x", code=ErrorCode.TIMEOUT).code is ErrorCode.TIMEOUT
    assert sqlstate(SqlLimitError("x", code=ErrorCode.TIMEOUT)) == "57014"
    assert sqlstate(SqlLimitError("x")) == "54000"


def test_a_refusal_frame_carries_the_code() -> None:
    frames = read_frames([error_frame(ErrorCode.PARTITION_FAILED, "behind", None)])
    with pytest.raises(RemoteError) as caught:
        results_from_frames(frames)
    assert caught.value.code is ErrorCode.PARTITION_FAILED


def test_a_body_that_is_no_error_is_an_http_error() -> None:
    raised = _error(502, b"<html>bad gateway</html>")
    assert isinstance(raised, RemoteError) and raised.code is ErrorCode.HTTP_ERROR
    assert "bad gateway" in raised.message


def documented_rows() -> dict[str, tuple[str, ...]]:
    text = DOCS.read_text()
    section = text.split("### Every error code", 1)[1].split("\n#", 1)[0]
    rows = {}
    for line in section.splitlines():
        match = re.fullmatch(r"\| `([a-z_]+)` \| (.*) \|", line.strip())
        if match:
            cells = tuple(c.strip() for c in match.group(2).split(" | "))
            assert match.group(1) not in rows, f"{match.group(1)} is listed twice"
            rows[match.group(1)] = cells
    return rows


def test_docs_list_exactly_the_table() -> None:
    expected = {
        code.wire: (
            str(code.status),
            code.sqlstate,
            "yes" if code.retryable else "no",
            code.todo,
        )
        for code in ErrorCode
    }
    documented = documented_rows()
    assert sorted(set(expected) - set(documented)) == [], "codes missing from docs/rest.md"
    assert sorted(set(documented) - set(expected)) == [], "docs/rest.md lists unknown codes"
    for wire, row in expected.items():
        assert documented[wire] == row, f"docs/rest.md's row of {wire!r} disagrees"
