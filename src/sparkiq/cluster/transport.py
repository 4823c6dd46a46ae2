"""How a node reaches another: one interface, an HTTP implementation and an in-process one.

A :class:`Transport` sends a sub-request (``local``: answer from your own replicas), a
heartbeat or a gossip probe to a member by URL. :class:`HttpTransport` speaks the binary protocol of
:mod:`sparkiq.wire.protocol` over pooled keep-alive connections
(:mod:`sparkiq.cluster.httppool`), signing every request with the node credential when the
node has a cluster secret and accepting a heartbeat reply only when its MAC proves the
member holds the secret too (:mod:`sparkiq.cluster.nodeauth`); it never sends a client's
token. :class:`LocalTransport` calls nodes of the same process directly (tests, and
embedding several nodes in one process: they are one program, so nothing is signed).
Both raise :class:`NodeUnreachableError` when the member cannot be reached, which routers
treat as "try the next replica"; any answer, even a failure, is a value.
"""

from __future__ import annotations

import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from sparkiq.cluster.httppool import HttpPool, NodeTimeoutError
from sparkiq.cluster.nodeauth import REPLY_HEADER, REQUEST_HEADER, NodeKey, SignedRequest
from sparkiq.error_codes import ErrorCode
from sparkiq.errors import NodeUnreachableError, SparkiqError
from sparkiq.principals import current as current_principal
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import QueryResult
from sparkiq.wire import protocol
from sparkiq.wire.values import pack, unpack_plain

__all__ = [
    "MAX_HEARTBEAT_BYTES",
    "HttpTransport",
    "LocalTransport",
    "NodeTimeoutError",
    "NodeUnreachableError",
    "Transport",
]


class Transport(Protocol):
    def query(self, url: str, request: StateQueryRequest) -> dict[int, QueryResult[Any]]:
        """Ask the member at ``url`` to answer ``request`` from its own replicas."""
        ...

    def heartbeat(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Send this node's heartbeat; return the member's (proven to come from a member)."""
        ...

    def probe(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Send a gossip probe (:mod:`sparkiq.cluster.swim_loop`); return the ack (proven
        to come from a member)."""
        ...

    def probe_req(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        """Ask the member at ``url`` to probe another for this node; return its answer."""
        ...

    def close(self) -> None: ...


class LocalTransport:
    """Nodes of this process by URL (``register``); no sockets involved."""

    def __init__(self) -> None:
        self._nodes: dict[str, Any] = {}
        self._lock = threading.Lock()  # guards _nodes

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

    def query(self, url: str, request: StateQueryRequest) -> dict[int, QueryResult[Any]]:
        return dict(self._node(url).query_local(request).partition_results)

    def heartbeat(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._node(url).on_heartbeat(doc)
        return reply

    def probe(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._node(url).on_probe(doc)
        return reply

    def probe_req(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        reply: dict[str, Any] = self._node(url).on_probe_req(doc)
        return reply

    def close(self) -> None:
        pass


#: A heartbeat reply longer than this is not a node's (a member table of MAX_MEMBERS and a
#: hosted map of thousands of partitions fit many times over).
MAX_HEARTBEAT_BYTES = 4 << 20


class HttpTransport:
    """The binary protocol over HTTP/1.1 keep-alive connections, pooled per member.

    Heartbeats use a pool of their own with a short read timeout (``heartbeat_timeout``):
    a reply that late says nothing the failure detector does not already know, and a
    heartbeat must never wait behind a long query on the same connection. With ``key``
    (the cluster secret's) every request is signed as ``node_id`` and heartbeat replies are
    checked before they are decoded; with ``tls`` (the node's current client context,
    :class:`sparkiq.tls.TlsContexts`) members are reached over verified ``https``."""

    def __init__(
        self,
        *,
        node_id: str = "",
        key: NodeKey | None = None,
        tls: Callable[[], ssl.SSLContext] | None = None,
        connect_timeout: float = 1.0,
        read_timeout: float = 30.0,
        heartbeat_timeout: float = 2.0,
    ) -> None:
        self._node_id = node_id
        self._key = key
        self._pool = HttpPool(connect_timeout=connect_timeout, timeout=read_timeout, tls=tls)
        self._beats = HttpPool(connect_timeout=connect_timeout, timeout=heartbeat_timeout, tls=tls)
        #: Bytes of membership messages (heartbeats, gossip) this node sent as requests and
        #: read as replies since start, packed documents without HTTP headers: /metrics
        #: (unlocked: two threads adding at once may lose one count, which a rate ignores).
        self.membership_bytes_sent = 0
        self.membership_bytes_received = 0

    def _signed(self, path: str, body: bytes) -> tuple[dict[str, str], SignedRequest | None]:
        headers = {"content-type": protocol.CONTENT_TYPE, "accept": protocol.CONTENT_TYPE}
        if self._key is None:
            return headers, None
        caller = current_principal.get()  # a routed request runs for its caller
        name = None if caller is None else caller.name
        signed = self._key.sign_request(self._node_id, "POST", path, body, name)
        headers[REQUEST_HEADER] = signed.header
        return headers, signed

    def query(self, url: str, request: StateQueryRequest) -> dict[int, QueryResult[Any]]:
        body = protocol.encode_request(request, local=True)
        headers, _ = self._signed("/internal/query", body)
        response = self._pool.request(url, "POST", "/internal/query", body, headers)
        try:
            if response.status != 200:
                raise _refusal(url, response.status, response.read(MAX_HEARTBEAT_BYTES))
            frames = protocol.read_frames(response.chunks())
            partitions: Iterable[int] | None = (
                sorted(request.partitions) if request.partitions is not None else None
            )
            return protocol.results_from_frames(frames, partitions, response.close)
        except BaseException:
            response.close()
            raise

    def heartbeat(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        return self._membership_call(url, "/internal/heartbeat", doc)

    def probe(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        return self._membership_call(url, "/internal/probe", doc)

    def probe_req(self, url: str, doc: dict[str, Any]) -> dict[str, Any]:
        return self._membership_call(url, "/internal/probe-req", doc)

    def _membership_call(self, url: str, path: str, doc: dict[str, Any]) -> dict[str, Any]:
        """A heartbeat or gossip message, signed; the reply is checked before decoding."""
        body = pack(doc)
        headers, signed = self._signed(path, body)
        self.membership_bytes_sent += len(body)  # sent, whether or not anyone answers
        response = self._beats.request(url, "POST", path, body, headers)
        data = response.read(MAX_HEARTBEAT_BYTES)
        self.membership_bytes_received += len(data)
        if response.status != 200:
            raise _refusal(url, response.status, data)
        if signed is not None and self._key is not None:
            self._key.check_reply(signed, response.header(REPLY_HEADER), data)
        try:
            reply: dict[str, Any] = unpack_plain(data)
        except ValueError:  # whatever answered is not a node: its reply is not a heartbeat
            raise protocol.RemoteError(
                f"{url} answered {path} with something that is not a node's reply",
                code=ErrorCode.INVALID_HEARTBEAT,
            ) from None
        return reply

    def close(self) -> None:
        self._pool.close()
        self._beats.close()


def _refusal(url: str, status: int, body: bytes) -> SparkiqError:
    error = protocol.error_of(body)
    if error is None:
        message, code, field = body[:200].decode(errors="replace"), ErrorCode.HTTP_ERROR, None
    else:
        message, code, field = error["message"], ErrorCode.parse(error["code"]), error.get("field")
    return protocol.RemoteError(
        f"{url} refused the request ({status}): {message}", code=code, field=field
    )
