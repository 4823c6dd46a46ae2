"""The REST API's routes, as one table: the server dispatches by it, the OpenAPI document
lists its paths from it, and the paths answered without a token are read off it.

A route is a method, a path as OpenAPI writes it (``/stores/{store}/keys/{key}``), the
name of the :class:`~sparkiq.server.app.RestApp` coroutine that answers it, and who may
call it:

- ``token``: a client with a token, when the node has tokens (every read runs as its
  principal and within its grants);
- ``public``: anyone (probes, this API's description, the console page, which is static
  and sends the token its user types with every request it makes);
- ``node``: the node protocol, whose callers prove a node credential instead of
  (heartbeats) or besides (sub-requests) a client token (:mod:`sparkiq.cluster.nodeauth`).

Matching costs a dict lookup for a fixed path and a comparison of a few path segments
for the others; the key lookup, the hot path, is the first templated route tried.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["NODE_PATHS", "PUBLIC_PATHS", "ROUTES", "Route", "match"]

Access = Literal["token", "public", "node"]


@dataclass(frozen=True, slots=True)
class Route:
    """One route (see the module docstring). ``label`` names it in metrics and the audit
    log (default: its path)."""

    method: str
    path: str
    handler: str
    access: Access = "token"
    label: str = ""
    segments: tuple[str, ...] = field(init=False)
    # (index, parameter name) and (index, literal segment): what bind compares, found once
    params: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)
    literals: tuple[tuple[int, str], ...] = field(init=False, repr=False, compare=False)
    binder: Callable[[list[str]], dict[str, str] | None] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        segments = tuple(self.path.strip("/").split("/"))
        object.__setattr__(self, "segments", segments)
        named = tuple((i, s[1:-1]) for i, s in enumerate(segments) if s.startswith("{"))
        object.__setattr__(self, "params", named)
        fixed = tuple((i, s) for i, s in enumerate(segments) if not s.startswith("{"))
        object.__setattr__(self, "literals", fixed)
        if not self.label:
            object.__setattr__(self, "label", self.path)
        object.__setattr__(self, "binder", _binder(self))

    @property
    def templated(self) -> bool:
        return "{" in self.path

    def bind(self, parts: list[str]) -> dict[str, str] | None:
        """The path parameters if ``parts`` (a path's segments) are this route's, else
        None. Parameters are percent-decoded."""
        return self.binder(parts)


def _binder(route: Route) -> Callable[[list[str]], dict[str, str] | None]:
    """:meth:`Route.bind` of ``route`` as a function of its own, its segments' checks
    unrolled: the key lookup's match took 0.6 us in a loop over the segments and a dict
    comprehension, a tenth of that unrolled. Only the route's literal segments, as
    Python literals, and indexes enter the source."""
    checks = " or ".join(
        [f"len(parts) != {len(route.segments)}"]
        + [f"parts[{i}] != {literal!r}" for i, literal in route.literals]
    )
    lines = ["def bind(parts):", f"    if {checks}:", "        return None"]
    lines += [f"    p{i} = parts[{i}]" for i, _ in route.params]
    # unquote returns a segment without "%" as it is: asking first saves its call
    values = ", ".join(
        f"{name!r}: p{i} if '%' not in p{i} else unquote(p{i})" for i, name in route.params
    )
    lines.append(f"    return {{{values}}}")
    namespace: dict[str, Any] = {"unquote": urllib.parse.unquote}
    exec("\n".join(lines), namespace)  # the source holds the route table's literals only
    return namespace["bind"]  # type: ignore[no-any-return]


ROUTES: tuple[Route, ...] = (
    Route("GET", "/stores/{store}/keys/{key}", "_on_key"),  # the hot path: tried first
    Route("POST", "/internal/query", "_on_internal_query", "node"),
    Route("POST", "/internal/heartbeat", "_on_heartbeat", "node"),
    Route("POST", "/internal/probe", "_on_probe", "node"),
    Route("POST", "/internal/probe-req", "_on_probe_req", "node"),
    Route("POST", "/stores/{store}/query", "_on_iq_query"),
    Route("POST", "/query", "_on_sql"),
    Route("GET", "/healthz", "_on_healthz", "public"),
    Route("GET", "/readyz", "_on_readyz", "public"),
    Route("GET", "/", "_on_console", "public", label="/console"),
    Route("GET", "/console", "_on_console", "public"),
    Route("GET", "/openapi.json", "_on_openapi", "public"),
    Route("GET", "/metrics", "_on_metrics"),
    Route("GET", "/stats", "_on_stats"),
    Route("GET", "/charts/{store}/{chart}", "_on_chart"),
    Route("GET", "/stores", "_on_stores"),
    Route("GET", "/metadata", "_on_metadata"),
    Route("GET", "/metadata/stores/{store}/keys/{key}", "_on_key_metadata"),
)

#: Paths answered without a token (docs/rest.md lists the same; a test checks it).
PUBLIC_PATHS = frozenset(r.path for r in ROUTES if r.access == "public")
#: Paths of the node protocol.
NODE_PATHS = frozenset(r.path for r in ROUTES if r.access == "node")

_FIXED = {r.path: r for r in ROUTES if not r.templated}
_BY_LENGTH: dict[int, tuple[Route, ...]] = {}
for _route in ROUTES:
    if _route.templated:
        _BY_LENGTH[len(_route.segments)] = (*_BY_LENGTH.get(len(_route.segments), ()), _route)
del _route


def match(path: str) -> tuple[Route, dict[str, str]] | None:
    """The route of ``path`` and its parameters, or None (no such route)."""
    fixed = _FIXED.get(path)
    if fixed is not None:
        return fixed, {}
    parts = path.strip("/").split("/")
    for route in _BY_LENGTH.get(len(parts), ()):
        params = route.binder(parts)
        if params is not None:
            return route, params
    return None
