"""The REST API and the node protocol as one ASGI application.

Its routes are one table (:mod:`sparkiq.server.routes`: method, path, coroutine, who may call
it), from which ``/openapi.json`` lists the paths and the public paths are read.

The key lookup is answered on the event loop
when this node holds the key's partition caught up (a few microseconds), everything that may
block (routing to another node, scans, SQL) runs on a bounded thread pool. Errors are JSON
``{"error": {"code", "message", "field"}}`` with the right status; unexpected faults are
logged and answered with a 500 that carries a request id, never a stack trace.
"""

from __future__ import annotations

import asyncio
import importlib.resources
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pyarrow as pa

from sparkiq.cancel import CancelSignal, cancellable
from sparkiq.cluster.nodeauth import REPLY_HEADER, REQUEST_HEADER
from sparkiq.error_codes import ErrorCode
from sparkiq.pools import ElasticPool
from sparkiq.principals import current as current_principal
from sparkiq.query.queries import KeyQuery
from sparkiq.query.result import FailureReason, StateQueryResult
from sparkiq.server.asgi import (
    JSON_HEADERS,
    Receive,
    Scope,
    Send,
    accepts_arrow,
    accepts_binary,
    allow,
    bearer,
    close_all,
    coalesced,
    header,
    json_object,
    peer,
    send_body,
    send_error,
    when_disconnected,
)
from sparkiq.server.audit import AuditLog
from sparkiq.server.auth_failures import auth_failures_of
from sparkiq.server.browser import BrowserGuard, console_policy
from sparkiq.server.charts import chart_svg
from sparkiq.server.http_errors import HttpError, classify
from sparkiq.server.metrics import Metrics
from sparkiq.server.openapi import openapi_document
from sparkiq.server.reports import stats_document, stores_document
from sparkiq.server.routes import PUBLIC_PATHS, ROUTES, Route, match
from sparkiq.server.scrub import roots_of, scrub
from sparkiq.server.served import ServedNode, no_tables_warning
from sparkiq.server.source_wait import until_sources_read
from sparkiq.server.streams import iq_json_chunks, push_stream, sql_json
from sparkiq.sql.result import SqlResult
from sparkiq.sql.statement import is_push_query
from sparkiq.wire import arrowipc, jsonapi, protocol
from sparkiq.wire.values import pack, unpack_plain

__all__ = ["PUBLIC_PATHS", "RestApp", "scrub"]

log = logging.getLogger("sparkiq.server")

#: A route's coroutine (sparkiq.server.routes): scope, receive, send, the path parameters;
#: it answers and returns the status it sent.
Handler = Callable[..., Awaitable[int]]


_BINARY = [(b"content-type", protocol.CONTENT_TYPE.encode())]
#: The most rows of a SQL answer encoded on the event loop (more: on a thread).
_ENCODE_ON_LOOP = 64
_REPLY = REPLY_HEADER.encode()
_NOTE = "sparkiq.audit"  # the scope key of what a request read (tables, rows)
_HTML = [
    (b"content-type", b"text/html; charset=utf-8"),
    # the page keeps the token in the browser: no framing by other sites, no referrer
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]

_SVG = [
    (b"content-type", b"image/svg+xml"),
    # opened on its own (not as the console's <img>), a chart runs nothing: pygal writes its
    # settings in a <script> and its looks in a <style>
    (b"content-security-policy", b"default-src 'none'; style-src 'unsafe-inline'"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
]


class RestApp:
    """ASGI application serving ``node`` (a :class:`sparkiq.Node` or anything with its
    methods). ``max_body_bytes`` bounds request bodies (413 beyond)."""

    def __init__(
        self,
        node: ServedNode,
        *,
        max_body_bytes: int = 1 << 20,
        threads: int = 32,
        max_push_streams: int = 2048,
    ) -> None:
        self.node = node
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics(node)
        self._count_request = self.metrics.counts.request  # every answered request
        self._auth = auth_failures_of(node)  # slowed and counted per caller address
        self.metrics.registry.register(self._auth)
        self._pool = ElasticPool("sparkiq-http", threads)
        #: each route's coroutine, bound once (sparkiq.server.routes names them)
        self._handlers: dict[str, Handler] = {r.handler: getattr(self, r.handler) for r in ROUTES}
        # A push stream waits for changes on the event loop (no thread), and sends a
        # batch's lines encoded once for every stream of the same statement; their number
        # is bounded all the same, each holds a subscription's buffer.
        self.max_push_streams = max_push_streams
        self._push_streams = 0
        self._openapi = jsonapi.dumps(openapi_document())
        self._audit: AuditLog | None = getattr(node, "audit", None)
        self._console = (
            importlib.resources.files("sparkiq.server").joinpath("console.html").read_bytes()
        )
        self._console_headers = [
            *_HTML,
            (b"content-security-policy", console_policy(self._console)),
        ]
        config = getattr(node, "config", None)  # a Node's; tests' fakes have none
        self._browser = BrowserGuard.for_node(
            getattr(config, "allowed_hosts", ()),
            [getattr(node, "url", None), getattr(config, "listen", None)],
        )
        # directories whose paths never reach a caller, even relative ones (see scrub)
        self._roots = roots_of(
            getattr(node, "state_dir", None),
            getattr(getattr(node, "config", None), "local_dir", None),
            os.getcwd(),
        )

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        started = time.perf_counter()
        route = "unmatched"
        status = 500
        note: dict[str, Any] = {}  # what the request read (tables, rows), for the audit log
        scope[_NOTE] = note
        try:
            found, params = self._route(scope)
            # the route's coroutine awaited here, not through one more: a layer of them
            # costs about as much as the route's match
            status = await self._handlers[found.handler](scope, receive, send, **params)
            route = found.label  # a route that raised counts as "unmatched", as it always has
        except Exception as exc:  # errors that are the caller's become 4xx, the rest 500
            error = classify(exc)
            error.message = scrub(error.message, self._roots)
            status = error.status
            await send_error(send, error)
        finally:
            took = time.perf_counter() - started
            self._count_request(route, status, took)
            if self._audit is not None and not _unaudited(scope):
                principal = current_principal.get()
                self._audit.record(
                    listener="http",
                    principal=None if principal is None else principal.name,
                    peer=peer(scope),
                    kind=route if route != "unmatched" else scope["path"][:200],
                    tables=note.get("tables", ()),
                    status=status,
                    seconds=took,
                    rows=note.get("rows"),
                )

    # -- dispatch ----------------------------------------------------------------------------

    def _route(self, scope: Scope) -> tuple[Route, dict[str, str]]:
        """The route of the request and its path parameters, once the caller may ask it;
        raises HttpError (refused, no such route, wrong method)."""
        path: str = scope["path"]
        self._browser.check(scope)  # before anything else: what a web page may not ask
        # Routes match the path as sent, and a parameter is percent-decoded once: the server
        # already decoded scope["path"], where "%2F" in a key splits it and "%25" would be
        # decoded again, reading the key "a%b" for "a%25b".
        raw: bytes | None = scope.get("raw_path")
        found = match(raw.decode("latin-1") if raw else path)
        if found is None or found[0].access == "token":
            # every read below runs as this principal and within its grants (a caller whose
            # address failed too often lately is refused before its token is looked at); a
            # path that is no route asks for a token too, so routes are not probed for free
            self._client_principal(scope)
        if found is None:
            method = scope["method"]
            raise HttpError(ErrorCode.NOT_FOUND, f"no route {method} {path}; see /openapi.json")
        if scope["method"] != found[0].method:
            allow(scope["method"], found[0].method)
        return found

    def _client_principal(self, scope: Scope) -> None:
        current_principal.set(
            self._auth.check_http(scope.get("client"), bearer(scope), self.node.check_token)
        )

    # -- the routes (sparkiq.server.routes): each answers and returns its status -------------

    async def _on_key(
        self, scope: Scope, receive: Receive, send: Send, store: str, key: str
    ) -> int:
        # the hot path: answered here, without a coroutine of its own (a layer of them
        # costs about as much as the route's match)
        node = self.node
        value = jsonapi.key_from_text(node.schema(store), key)  # the key, typed
        location = node.locate_key(store, value)  # once: the read and the answer use it
        if location.here:  # microseconds, on the event loop
            row, position = node.read_located(location, store, value)
        else:  # another node holds it: routing blocks, so off the event loop
            row, position = await self._run(node.read_located, location, store, value)
        partition = location.partition
        self.metrics.queried(store)  # answered here or routed: a query this node was asked
        scope[_NOTE]["tables"] = [store]
        doc = {"key": value, "row": row, "partition": partition, "position": position.to_token()}
        if row is None:
            missing = ErrorCode.KEY_NOT_FOUND
            doc["error"] = {
                "code": missing.wire,
                "message": f"{store!r} has no row for key {value!r}",
                "field": "key",
            }
            await send_body(send, missing.status, jsonapi.dumps(doc), JSON_HEADERS, scope)
            return missing.status
        await send_body(send, 200, jsonapi.dumps(doc), JSON_HEADERS, scope)
        return 200

    async def _on_internal_query(self, scope: Scope, receive: Receive, send: Send) -> int:
        # a member's sub-request carries a node credential; a client's, its token
        credential = header(scope, REQUEST_HEADER)
        if credential is None:
            self._client_principal(scope)
        body = await self._body(receive)
        if credential is not None:
            opened = self.node.admit_node(
                credential, scope["method"], scope["path"], body, peer(scope)
            )
            # a member's sub-request runs for the caller it routes for, grants and all
            caller = None if opened is None else opened.principal
            current_principal.set(self.node.principal_named(caller))
        await self._internal_query(scope, receive, send, body)
        return 200

    async def _on_heartbeat(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._membership_message(scope, receive, send, self.node.on_heartbeat)

    async def _on_probe(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._membership_message(scope, receive, send, self.node.on_probe)

    async def _on_probe_req(self, scope: Scope, receive: Receive, send: Send) -> int:
        # it waits for another member's ack: on the pool, never on the event loop
        handler = self.node.on_probe_req
        return await self._membership_message(
            scope, receive, send, lambda doc: self._run(handler, doc)
        )

    async def _membership_message(
        self, scope: Scope, receive: Receive, send: Send, handler: Callable[..., Any]
    ) -> int:
        """A heartbeat or a gossip message: admitted, decoded, answered, the reply signed."""
        body = await self._body(receive)
        # proven before anything of it is decoded; client tokens never admit a member
        opened = self.node.admit_node(
            header(scope, REQUEST_HEADER), scope["method"], scope["path"], body, peer(scope)
        )
        try:
            doc = unpack_plain(body)
        except ValueError:  # msgpack's errors vary by cause; all mean the same here
            raise HttpError(
                ErrorCode.INVALID_HEARTBEAT, "the body is not a packed heartbeat", "body"
            ) from None
        reply = handler(doc)  # a HeartbeatError records nothing: 400
        if asyncio.iscoroutine(reply) or asyncio.isfuture(reply):
            reply = await reply
        data = pack(reply)
        self.metrics.membership_message(len(body), len(data))
        signature = self.node.sign_reply(None if opened is None else opened.mac, data)
        headers = _BINARY if signature is None else [*_BINARY, (_REPLY, signature.encode())]
        await send_body(send, 200, data, headers)
        return 200

    async def _on_iq_query(self, scope: Scope, receive: Receive, send: Send, store: str) -> int:
        await self._iq_query(scope, send, store, await self._body(receive))
        return 200

    async def _on_sql(self, scope: Scope, receive: Receive, send: Send) -> int:
        await self._sql(scope, receive, send, await self._body(receive))
        return 200

    async def _on_healthz(self, scope: Scope, receive: Receive, send: Send) -> int:
        doc = {"status": "ok", "node_id": self.node.node_id}
        await send_body(send, 200, jsonapi.dumps(doc), JSON_HEADERS)
        return 200

    async def _on_readyz(self, scope: Scope, receive: Receive, send: Send) -> int:
        return await self._ready(send)

    async def _on_console(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_body(send, 200, self._console, self._console_headers)
        return 200

    async def _on_openapi(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_body(send, 200, self._openapi, JSON_HEADERS)
        return 200

    async def _on_metrics(self, scope: Scope, receive: Receive, send: Send) -> int:
        text, content_type = self.metrics.render()
        await send_body(send, 200, text, [(b"content-type", content_type.encode())])
        return 200

    async def _on_stats(self, scope: Scope, receive: Receive, send: Send) -> int:
        doc = stats_document(self.node, self.metrics, self._roots)
        await send_body(send, 200, jsonapi.dumps(doc), JSON_HEADERS)
        return 200

    async def _on_chart(
        self, scope: Scope, receive: Receive, send: Send, store: str, chart: str
    ) -> int:
        query = scope.get("query_string", b"")
        # rendering takes milliseconds: on the pool, not on the loop that answers key lookups
        svg = await self._run(chart_svg, self.node, self.metrics, store, chart, query)
        await send_body(send, 200, svg, _SVG)
        return 200

    async def _on_stores(self, scope: Scope, receive: Receive, send: Send) -> int:
        await send_body(send, 200, jsonapi.dumps(stores_document(self.node)), JSON_HEADERS)
        return 200

    async def _on_metadata(self, scope: Scope, receive: Receive, send: Send) -> int:
        nodes = [m.to_dict() for m in self.node.all_metadata()]
        await send_body(send, 200, jsonapi.dumps({"nodes": nodes}), JSON_HEADERS)
        return 200

    async def _on_key_metadata(
        self, scope: Scope, receive: Receive, send: Send, store: str, key: str
    ) -> int:
        meta = self.node.metadata_for_key(
            store, jsonapi.key_from_text(self.node.schema(store), key)
        )
        await send_body(send, 200, jsonapi.dumps(meta.to_dict()), JSON_HEADERS)
        return 200

    # -- helpers -----------------------------------------------------------------------------

    async def _body(self, receive: Receive) -> bytes:
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":  # gone (or timed out): nobody to answer
                raise HttpError(ErrorCode.DISCONNECTED, "the client left before its body ended")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise HttpError(
                    ErrorCode.BODY_TOO_LARGE,
                    f"request body exceeds {self.max_body_bytes} bytes",
                    "body",
                )
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    async def _run_while_awaited(self, receive: Receive, fn: Callable[..., Any]) -> Any:
        """``fn()`` on the pool, canceled (sparkiq.cancel) if the client hangs up first: a
        statement nobody waits for -- a curl stopped with Ctrl-C, a hedged copy that lost --
        stops instead of running on to its timeout."""
        gone = CancelSignal()
        watcher = asyncio.ensure_future(when_disconnected(receive, gone.set))
        try:
            with cancellable(gone):  # the pool runs fn in this task's context
                return await self._run(fn)
        finally:
            watcher.cancel()

    # -- handlers ----------------------------------------------------------------------------

    async def _internal_query(
        self, scope: Scope, receive: Receive, send: Send, body: bytes
    ) -> None:
        request, local = protocol.decode_request(body)
        node = self.node
        if (
            local
            and isinstance(request.query, KeyQuery)
            and (request.partitions is None or len(request.partitions) == 1)
        ):  # a router's key sub-request: microseconds, no thread hop (and no wait on the
            # event loop: a replica just behind the bound is waited for on a thread)
            results = node.query_local(request, catch_up_wait=0.0)
            if any(
                r.failure_reason is FailureReason.NOT_UP_TO_BOUND
                for r in results.partition_results.values()
            ):
                results = await self._run(node.query_local, request)
        elif local:  # a SQL fragment among them: stopped if the asking node gives up on it
            results = await self._run_while_awaited(receive, lambda: node.query_local(request))
        else:
            await until_sources_read(self.node, (request.store,), request.bound)
            results = await self._run(node.query, request)
        if not any(isinstance(r.result, Iterator) for r in results.partition_results.values()):
            await send_body(send, 200, b"".join(protocol.result_frames(results)), _BINARY)
            return
        await self._stream(send, 200, _BINARY, protocol.result_frames(results))

    async def _iq_query(self, scope: Scope, send: Send, store: str, body: bytes) -> None:
        request = jsonapi.request_from_json(store, self.node.schema(store), body)
        scope[_NOTE]["tables"] = [store]
        await until_sources_read(self.node, (store,), request.bound)
        results: StateQueryResult[Any] = await self._run(self.node.query, request)
        self.metrics.queried(store)
        await self._stream(send, 200, JSON_HEADERS, iq_json_chunks(store, results, self._roots))

    async def _sql(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        doc = json_object(body)
        text = doc.get("sql")
        if not isinstance(text, str) or not text.strip():
            raise HttpError(ErrorCode.INVALID_REQUEST, 'expected {"sql": "SELECT ..."}', "sql")
        options: dict[str, Any] = {}
        bound = jsonapi.bound_from_json(doc)
        if bound is not None:
            options["bound"] = bound
        arrow = accepts_arrow(scope)
        if is_push_query(text):
            if arrow:
                raise HttpError(
                    ErrorCode.NOT_ACCEPTABLE,
                    "a push query (EMIT CHANGES) streams newline-delimited JSON, one change "
                    f"per line; send it without 'Accept: {arrowipc.CONTENT_TYPE}'",
                    "accept",
                )
            if bound is not None:  # a push query starts where it is told, and never waits
                raise HttpError(
                    ErrorCode.INVALID_REQUEST,
                    "a push query (EMIT CHANGES) takes 'from' (a position token to resume "
                    "after), not 'bound' or 'after'",
                    "after" if doc.get("after") is not None else "bound",
                )
            if doc.get("from") is not None:
                options["from_position"] = jsonapi.position_from_token(doc["from"], "from")
            if doc.get("snapshot"):
                options["snapshot"] = True
            if self._push_streams >= self.max_push_streams:
                raise HttpError(
                    ErrorCode.TOO_MANY_SUBSCRIPTIONS,
                    f"this node serves at most {self.max_push_streams} push queries at once; "
                    "retry later or on another node",
                )
            self._push_streams += 1
            try:
                subscription = await self._run(lambda: self.node.stream(text, **options))
                watcher = asyncio.ensure_future(when_disconnected(receive, subscription.close))
                try:
                    await self._push(send, subscription)
                finally:
                    watcher.cancel()
            finally:
                self._push_streams -= 1
            return
        for name in ("page_token", "page_size"):
            if doc.get(name) is not None:
                options[name] = doc[name]
        if bound is not None:
            await until_sources_read(self.node, self.node.tables, bound)
        # A key lookup this node reads itself answers in microseconds: on the event loop,
        # without two thread hops (the statement, then its encoding) and a watcher task.
        result = None
        if bound is None and "page_token" not in options:
            result = self.node.sql_here(text, page_size=options.get("page_size"))
        if result is None:
            result = await self._run_while_awaited(receive, lambda: self.node.sql(text, **options))
        elif not arrow and not accepts_binary(scope) and len(result.rows) <= _ENCODE_ON_LOOP:
            self._sql_answered(scope, result)
            await send_body(send, 200, jsonapi.dumps(sql_json(result)), JSON_HEADERS, scope)
            return
        self._sql_answered(scope, result)
        if arrow:
            headers, table = await self._sql_arrow(result)
            del result  # a slow reader pins the columns only, not the Python rows as well
            await self._stream(send, 200, headers, arrowipc.ipc_chunks(table))
        elif accepts_binary(scope):  # sparkiq.Client: values keep their Python types
            await send_body(send, 200, await self._run(lambda: pack(sql_json(result))), _BINARY)
        else:  # encoding 64 MB holds the GIL for a fraction of a second: not on the loop
            await send_body(
                send, 200, await self._run(lambda: jsonapi.dumps(sql_json(result))), JSON_HEADERS
            )

    def _sql_answered(self, scope: Scope, result: SqlResult) -> None:
        """Count and note (for the audit log) the tables ``result`` read."""
        read = _tables_read(result.position.to_map(), self.node.tables)
        self.metrics.queried(*read)
        scope[_NOTE].update(tables=read, rows=len(result.rows))

    async def _sql_arrow(self, result: SqlResult) -> tuple[list[tuple[bytes, bytes]], pa.Table]:
        """The response headers and the Arrow table of ``result``, for an IPC stream
        (sparkiq.wire.arrowipc): its position (and page token) travel in headers."""
        table = await self._run(result.to_arrow)  # milliseconds of conversion: off the loop
        headers = [
            (b"content-type", arrowipc.CONTENT_TYPE.encode()),
            (arrowipc.POSITION_HEADER.encode(), result.position.to_token().encode()),
        ]
        if result.next_page_token is not None:
            headers.append((arrowipc.PAGE_TOKEN_HEADER.encode(), result.next_page_token.encode()))
        return headers, table

    async def _ready(self, send: Send) -> int:
        statuses = self.node.status()
        behind = [
            {"store": s.table, "partition": s.partition, "state": s.state, "lag": s.lag_batches}
            for s in statuses
            if s.state != "live"
        ]
        # is_ready() also covers a node still starting (meeting peers, opening partitions)
        ready = not behind and self.node.is_ready()
        status = 200 if ready else 503
        doc: dict[str, Any] = {"ready": ready, "node_id": self.node.node_id, "not_ready": behind}
        if not self.node.tables:  # most likely a mistyped state_dir: said, not silent
            # without the path: /readyz answers without a token (the log names it)
            doc["warning"] = no_tables_warning(None)
        await send_body(send, status, jsonapi.dumps(doc), JSON_HEADERS)
        return status

    async def _push(self, send: Send, subscription: Any) -> None:
        """Stream a push query's changes as they come, on the event loop: waiting holds no
        thread, and each batch's encoded lines are shared by the streams that send them."""
        start = [(b"content-type", b"application/x-ndjson")]
        await send({"type": "http.response.start", "status": 200, "headers": start})
        body = push_stream(subscription, self._roots, self._pool)
        try:
            async for chunk in body:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await body.aclose()

    async def _stream(
        self,
        send: Send,
        status: int,
        headers: list[tuple[bytes, bytes]],
        chunks: Iterator[bytes],
    ) -> None:
        """Send ``chunks`` as they are produced (on the pool: producing may block). The
        first chunk is produced before the status is sent, so early errors get a proper
        status."""
        loop = asyncio.get_running_loop()
        source = coalesced(chunks)
        pool = self._pool
        start = {"type": "http.response.start", "status": status, "headers": headers}
        try:
            chunk = await loop.run_in_executor(pool, next, source, None)
            await send(start)
            while chunk is not None:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
                chunk = await loop.run_in_executor(pool, next, source, None)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await loop.run_in_executor(pool, close_all, source, chunks)


def _tables_read(position: dict[str, Any], tables: list[str]) -> list[str]:
    """The tables a SQL result read: its position has a component per table read (and one
    per source component, e.g. a Kafka topic, which is not a table)."""
    return [name for name in position if name in tables]


def _unaudited(scope: Scope) -> bool:
    """Probes, pages, and traffic between nodes (heartbeats, members' sub-requests: the
    node that took the caller's request logs it)."""
    path = scope["path"]
    return (
        path in PUBLIC_PATHS
        or path in ("/internal/heartbeat", "/internal/probe", "/internal/probe-req")
        or header(scope, REQUEST_HEADER) is not None
    )
