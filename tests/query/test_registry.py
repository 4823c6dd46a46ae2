"""Query types by name: one registration (sparkiq.register) makes a custom query type both
answerable in-process and sendable over the wire; names are unique."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from sparkiq import (
    KeyQuery,
    Query,
    QueryContext,
    QueryResult,
    RangeQuery,
    StateQueryRequest,
    WindowKeyQuery,
    WindowRangeQuery,
    register,
)
from sparkiq.query.registry import (
    query_type,
    query_type_name,
    query_type_names,
    register_query_type,
)
from sparkiq.wire.protocol import decode_request, encode_request


def test_builtin_query_types_are_known_by_their_class_names() -> None:
    for cls in (KeyQuery, RangeQuery, WindowKeyQuery, WindowRangeQuery):
        assert query_type(cls.__name__) is cls
        assert query_type_name(cls) == cls.__name__
    assert {"KeyQuery", "RangeQuery"} <= set(query_type_names())
    assert query_type("NoSuchQuery") is None


def test_one_registration_makes_a_query_type_travel() -> None:
    @dataclass(frozen=True)
    class PrefixCount(Query):
        prefix: str

    request = StateQueryRequest.in_store("t").with_query(PrefixCount("p-"))
    with pytest.raises(ValueError, match="cannot be sent"):
        encode_request(request)

    @register(PrefixCount, name="tests.PrefixCount")
    def count(store: Any, query: PrefixCount, ctx: QueryContext) -> QueryResult[int]:
        raise AssertionError("not called")

    decoded, _ = decode_request(encode_request(request))
    assert decoded.query == PrefixCount("p-")
    assert query_type_name(PrefixCount) == "tests.PrefixCount"


def test_registering_a_stateless_plain_subclass_travels_without_fields() -> None:
    class Ping(Query):
        __slots__ = ()

    register(Ping, name="tests.Ping")(lambda store, query, ctx: QueryResult.for_result(1, None))
    decoded, _ = decode_request(encode_request(StateQueryRequest.in_store("t").with_query(Ping())))
    assert type(decoded.query) is Ping


def test_a_name_belongs_to_one_class() -> None:
    class KeyQuery(Query):  # a user's class that happens to share a built-in's name
        __slots__ = ()

    with pytest.raises(ValueError, match=r"'KeyQuery' is taken by sparkiq\.query\.queries"):
        register(KeyQuery)
    assert query_type("KeyQuery") is not KeyQuery
    assert register_query_type(KeyQuery, "tests.MyKeyQuery") == "tests.MyKeyQuery"
    with pytest.raises(ValueError, match=r"already registered as 'tests\.MyKeyQuery'"):
        register_query_type(KeyQuery, "tests.Other")


def test_a_builtin_keeps_its_name_when_registered_for_another_store() -> None:
    class MyStore:
        pass

    register(RangeQuery, MyStore)(lambda store, query, ctx: QueryResult.for_result([], None))
    assert query_type_name(RangeQuery) == "RangeQuery"


def test_the_same_class_defined_again_replaces_the_old_definition() -> None:
    def define() -> type[Query]:
        @dataclass(frozen=True)
        class Again(Query):
            n: int

        return Again

    first, second = define(), define()
    register_query_type(first, "tests.Again")
    register_query_type(second, "tests.Again")
    assert query_type("tests.Again") is second
    assert query_type_name(first) is None


def test_only_query_subclasses_and_string_names_are_accepted() -> None:
    with pytest.raises(TypeError, match=r"subclass of sparkiq\.Query"):
        register_query_type(int)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="takes a Query subclass"):
        register(str)  # type: ignore[arg-type]

    class Nameless(Query):
        __slots__ = ()

    with pytest.raises(TypeError, match="non-empty string"):
        register_query_type(Nameless, "")
