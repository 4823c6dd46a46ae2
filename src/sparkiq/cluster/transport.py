"""How a node reaches another: one interface, an HTTP implementation and an in-process one.

A :class:`Transport` sends a sub-request (``local``: answer from your own replicas) or a
heartbeat to a member by URL. :class:`HttpTransport` speaks the binary protocol of
:mod:`sparkiq.wire.protocol` over pooled keep-alive connections
(:mod:`sparkiq.cluster.httppool`); :class:`LocalTransport`
calls nodes of the same process directly (tests, and embedding several nodes in one
process). Both raise :class:`NodeUnreachableError` when the member cannot be reached, which
routers treat as "try the next replica"; any answer, even a failure, is a value.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any, Protocol

import orjson

from sparkiq.cluster.httppool import HttpPool, NodeTimeoutError
from sparkiq.errors import NodeUnreachableError, SparkiqError
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import QueryResult
from sparkiq.wire import protocol
from sparkiq.wire.values import pack, unpack

__all__ = [
    "HttpTransport",
    "LocalTransport",
    "NodeTimeoutError",
    "NodeUnreachableError",
    "Transport",
]


class Transport(Protocol):
    def query(
        self, url: str, request: StateQueryRequest, token: str | None
    ) -> dict[int, QueryResult[Any]]:
        """Ask the member at ``url`` to answer ``request`` from its own replicas."""
        ...

    def heartbeat(self, url: str, doc: dict[str, Any], token: str | None) -> dict[str, Any]:
        """Send this node's heartbeat; return the member's."""
        ...

    def close(self) -> None: ...


class LocalTransport:
    """Nodes of this process by URL (``register``); no sockets involved."""

    def __init__(self) -> None:
        self._nodes: dict[str, Any] = {}
        self._lock = threading.Lock()

    def register(self, url: str, node: Any) -> None:
        with self._lock:
            self._nodes[url] = node

    def unregister(self, url: str) -> None:
        with self._lock:
            self._nodes.pop(url, None)

    def _node(self, url: str) -> Any:
        with self._lock:
            node = self._nodes.get(url)
        if node is None:
            raise NodeUnreachableError(f"no node at {url}")
        return node

    def query(
        self, url: str, request: StateQueryRequest, token: str | None
    ) -> dict[int, QueryResult[Any]]:
        node = self._node(url)
        node.check_token(token)
        return dict(node.query_local(request).partition_results)

    def heartbeat(self, url: str, doc: dict[str, Any], token: str | None) -> dict[str, Any]:
        node = self._node(url)
        node.check_token(token)
        reply: dict[str, Any] = node.on_heartbeat(doc)
        return reply

    def close(self) -> None:
        pass


class HttpTransport:
    """The binary protocol over HTTP/1.1 keep-alive connections, pooled per member.

    Heartbeats use a pool of their own with a short read timeout (``heartbeat_timeout``):
    a reply that late says nothing the failure detector does not already know, and a
    heartbeat must never wait behind a long query on the same connection."""

    def __init__(
        self,
        *,
        connect_timeout: float = 1.0,
        read_timeout: float = 30.0,
        heartbeat_timeout: float = 2.0,
    ) -> None:
        self._pool = HttpPool(connect_timeout=connect_timeout, timeout=read_timeout)
        self._beats = HttpPool(connect_timeout=connect_timeout, timeout=heartbeat_timeout)

    def _headers(self, token: str | None) -> dict[str, str]:
        headers = {"content-type": protocol.CONTENT_TYPE, "accept": protocol.CONTENT_TYPE}
        if token:
            headers["authorization"] = f"Bearer {token}"
        return headers

    def query(
        self, url: str, request: StateQueryRequest, token: str | None
    ) -> dict[int, QueryResult[Any]]:
        body = protocol.encode_request(request, local=True)
        response = self._pool.request(url, "POST", "/internal/query", body, self._headers(token))
        try:
            if response.status != 200:
                raise _refusal(url, response.status, response.read())
            frames = protocol.read_frames(response.chunks())
            partitions: Iterable[int] | None = (
                sorted(request.partitions) if request.partitions is not None else None
            )
            return protocol.results_from_frames(frames, partitions, response.close)
        except BaseException:
            response.close()
            raise

    def heartbeat(self, url: str, doc: dict[str, Any], token: str | None) -> dict[str, Any]:
        response = self._beats.request(
            url, "POST", "/internal/heartbeat", pack(doc), self._headers(token)
        )
        data = response.read()
        if response.status != 200:
            raise _refusal(url, response.status, data)
        try:
            reply: dict[str, Any] = unpack(data)
        except Exception:  # whatever answered is not a node: its reply is not a heartbeat
            raise protocol.RemoteError(
                f"{url} answered the heartbeat with something that is not one",
                code="invalid_heartbeat",
            ) from None
        return reply

    def close(self) -> None:
        self._pool.close()
        self._beats.close()


def _refusal(url: str, status: int, body: bytes) -> SparkiqError:
    try:
        error = orjson.loads(body)["error"]
        message, code, field = error["message"], error["code"], error.get("field")
    except (ValueError, KeyError, TypeError):
        message, code, field = body[:200].decode(errors="replace"), "http_error", None
    return protocol.RemoteError(
        f"{url} refused the request ({status}): {message}", code=code, field=field
    )
