"""The route table: every route has a coroutine and an OpenAPI operation, and paths match
the routes they name (dispatch, 401/404/405 and the public paths are tested over HTTP in
test_rest.py and test_hostile.py)."""

from __future__ import annotations

import inspect

from sparkiq.server.app import RestApp
from sparkiq.server.openapi import _OPERATIONS, openapi_document
from sparkiq.server.routes import NODE_PATHS, PUBLIC_PATHS, ROUTES, match


def test_every_route_has_a_coroutine_and_a_documented_operation() -> None:
    for route in ROUTES:
        handler = getattr(RestApp, route.handler)
        assert inspect.iscoroutinefunction(handler), route
        params = list(inspect.signature(handler).parameters)[4:]  # after self, scope, ...
        assert params == [s[1:-1] for s in route.segments if s.startswith("{")], route
    documented = openapi_document()["paths"]
    assert {(p, m.upper()) for p, ops in documented.items() for m in ops} == {
        (r.path, r.method) for r in ROUTES
    }
    assert set(_OPERATIONS) == {r.path for r in ROUTES}  # nothing documented that is no route
    public = {
        p for p, ops in documented.items() if all(o.get("security") == [] for o in ops.values())
    }
    assert public == PUBLIC_PATHS
    assert {
        "/internal/query",
        "/internal/heartbeat",
        "/internal/probe",
        "/internal/probe-req",
    } == NODE_PATHS


def test_paths_match_their_routes() -> None:
    found = match("/stores/orders/keys/a%20b")
    assert found is not None and found[0].path == "/stores/{store}/keys/{key}"
    assert found[1] == {"store": "orders", "key": "a b"}
    found = match("/metadata/stores/orders/keys/k1")
    assert found is not None and found[1] == {"store": "orders", "key": "k1"}
    found = match("/stores/orders/query")
    assert found is not None and found[0].handler == "_on_iq_query"
    assert match("/")[0].label == match("/console")[0].label == "/console"  # type: ignore[index]
    for path in ("/nope", "/stores/orders/rows/k1", "/stores/orders/keys", "/metadata/x/y/z/w"):
        assert match(path) is None, path
