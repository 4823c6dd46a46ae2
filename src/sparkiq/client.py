"""``sparkiq.Client``: the node API over HTTP, with the same result types as in-process.

A client talks to any node of a cluster (each routes to the nodes hosting the partitions
it needs). It learns the other nodes from ``/metadata`` and, when the node it uses cannot
be reached or answers that it cannot answer now (``unavailable``: a fault of its own;
``upstream_unavailable``, ``partition_failed`` or a typed query's ``NOT_PRESENT``: it could
not reach the nodes it needed -- a node whose clock or secret its peers refuse), retries on
another (:mod:`sparkiq.failover`). When every node fails, the first of these answers is
raised (a note lists the other nodes' failures); with no answer at all, a
:class:`~sparkiq.errors.NodeUnreachableError`. Typed queries use the binary node protocol,
so rows come back exactly as in-process (datetimes, decimals, tuples); the range rows of a
request for one partition stream, and a request spanning partitions is read at one batch
through one node.

Consistency: with ``monotonic=True`` (the default) the client remembers the newest position
it has seen per store and sends it as the bound of later requests that carry none, so the
positions it sees never go back, even when it is served by another replica after a
failover; a replica behind that position answers ``NOT_UP_TO_BOUND`` and the client retries
for up to ``bound_wait`` seconds (replicas catch up within milliseconds) before returning
the failure.

Hedged reads. A node that stops answering (paused, partitioned away, overloaded) is not
waited on alone for the whole ``timeout`` while another node could answer: a read that has
had no answer within a delay learned from this client's own latencies
(:class:`~sparkiq.cluster.hedge.HedgeDelay`: 3 x p99 of recent answers of the same kind,
between ``hedge_floor`` and ``hedge_ceiling``; ``hedge_ceiling`` until the client has
latencies to go by) is sent to the next node *as well*, and the first answer wins; the slow
node moves to the end of the list for later reads. Nothing is given up: a node that is
merely slow -- such as one itself waiting on a partitioned peer before its own router asks
another replica -- still answers, and whichever answer comes first is used (the others are
closed when they arrive). Each copy has the whole ``timeout``. Reads only: every copy
carries the same bound (or pinned batch), so whichever node answers keeps the consistency
rules above.
"""

from __future__ import annotations

import ssl
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from sparkiq.cluster.hedge import Copies, Copy, HedgeDelay, close_results
from sparkiq.cluster.httppool import HttpPool, PooledResponse
from sparkiq.errors import (
    ErrorCode,
    NodeUnreachableError,
    SparkiqError,
    UnknownStoreError,
    exception_class,
)
from sparkiq.failover import Failures
from sparkiq.pools import ElasticPool
from sparkiq.query.position import Position, PositionBound
from sparkiq.query.queries import KeyQuery
from sparkiq.query.request import StateQueryRequest
from sparkiq.query.result import FailureReason, QueryResult, StateQueryResult
from sparkiq.serving.metadata import KeyQueryMetadata
from sparkiq.sql.change import Change
from sparkiq.sql.errors import push_query_error
from sparkiq.sql.result import SqlResult
from sparkiq.sql.statement import is_push_query
from sparkiq.wire import arrowipc, jsonapi, protocol
from sparkiq.wire.values import unpack

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["ChangeStream", "Client"]

T = TypeVar("T")

#: Threads sending hedged reads (one per copy in flight; created as needed).
_MAX_IN_FLIGHT = 64


class Client:
    """A connection to a sparkiq cluster through one or more node URLs (all ``http://``
    or all ``https://``; with ``https``, ``ca`` is the PEM bundle the nodes' certificates
    are verified against, default the system's authorities)."""

    def __init__(
        self,
        url: str | list[str],
        token: str | None = None,
        *,
        timeout: float = 30.0,
        monotonic: bool = True,
        bound_wait: float = 2.0,
        hedge_floor: float = 0.25,
        hedge_ceiling: float = 1.0,
        ca: str | None = None,
    ) -> None:
        urls = [url] if isinstance(url, str) else list(url)
        if not urls:
            raise ValueError("Client needs at least one node URL")
        self._urls = [u.rstrip("/") for u in urls]
        schemes = {u.split("://", 1)[0] for u in self._urls}
        if len(schemes) != 1 or not schemes <= {"http", "https"}:
            raise ValueError(f"node URLs must all be http:// or all https://, got {self._urls}")
        # https: nodes' certificates verified against ``ca`` (a PEM bundle; default: the
        # system's authorities); one keep-alive pool for the REST API and the node protocol,
        # the one routers use (sparkiq.cluster.httppool)
        tls = ssl.create_default_context(cafile=ca) if schemes == {"https"} else None
        self.token = token
        self.monotonic = monotonic
        self.bound_wait = bound_wait
        self.timeout = timeout
        self._conns = HttpPool(timeout=timeout, tls=None if tls is None else lambda: tls)
        self._hedge = HedgeDelay(floor=hedge_floor, ceiling=max(hedge_floor, hedge_ceiling))
        self._seen: dict[str, Position] = {}
        self._stores: dict[str, dict[str, Any]] = {}
        # guards _urls' order, _seen and _senders' creation
        self._lock = threading.Lock()
        self._senders: ElasticPool | None = None  # hedged reads; made on first use

    def close(self) -> None:
        with self._lock:
            senders, self._senders = self._senders, None
        if senders is not None:
            senders.shutdown(wait=False)  # copies still out end on their own
        self._conns.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- typed queries -----------------------------------------------------------------------

    def query(self, request: StateQueryRequest) -> StateQueryResult[Any]:
        """Like :meth:`sparkiq.Node.query`, over HTTP.

        A request spanning partitions goes to one node as a whole: that node pins it to one
        batch of the table and routes each partition there (asked one partition at a time,
        each would be read at its own newest batch). A request reading ``as_of`` a batch or
        time gets no monotonic bound: it asks for the past on purpose."""
        if (
            self.monotonic
            and request.bound.is_unbounded
            and request.at_batch is None
            and request.at_time is None
        ):
            seen = self._seen.get(request.store)
            if seen is not None:
                request = request.with_position_bound(PositionBound.at(seen))
        result = StateQueryResult(self._ask(request))
        self._saw(request.store, result)
        return result

    def _ask(self, request: StateQueryRequest) -> dict[int, QueryResult[Any]]:
        """The request's results from the first node that answers; a node that could not
        reach any replica of a partition (``NOT_PRESENT``: its router tried them all, and
        its peers may be refusing it) is demoted and each other node asked once, since
        from where another node stands the replicas may answer; replicas behind the bound
        are given ``bound_wait`` seconds."""
        deadline = time.monotonic() + self.bound_wait
        kind = f"query:{type(request.query).__name__}"
        elsewhere = len(self._urls) - 1  # other nodes to ask for an unreachable partition
        while True:
            url, results = self._call(
                lambda url: (url, self._send(url, request)),
                kind,
                discard=lambda answer: close_results(answer[1]),
            )
            reasons = {r.failure_reason for r in results.values()}
            if FailureReason.NOT_PRESENT in reasons and elsewhere > 0:
                elsewhere -= 1
                self._demote(url)
                close_results(results)
                continue
            if FailureReason.NOT_UP_TO_BOUND not in reasons or time.monotonic() > deadline:
                return results
            time.sleep(0.02)

    def _send(self, url: str, request: StateQueryRequest) -> dict[int, QueryResult[Any]]:
        body = protocol.encode_request(request, local=False)
        response = self._conns.request(
            url, "POST", "/internal/query", body, self._headers(binary=True)
        )
        try:
            if response.status != 200:
                _body(response)  # raises the error it holds
            partitions = None if request.partitions is None else sorted(request.partitions)
            frames = protocol.read_frames(response.chunks())
            return protocol.results_from_frames(frames, partitions, response.close)
        except BaseException:
            response.close()
            raise

    def _saw(self, store: str, result: StateQueryResult[Any]) -> None:
        with self._lock:
            seen = self._seen.get(store, Position.empty())
            self._seen[store] = seen.merge(result.position)

    def get(self, store: str, key: Any) -> dict[str, Any] | None:
        """The current row of ``key`` in ``store``, or None."""
        request = StateQueryRequest.in_store(store).with_query(KeyQuery.with_key(key))
        result = self.query(request).only_partition_result()
        if result.is_failure:
            raise SparkiqError(
                f"{store!r} key {key!r}: {result.failure_reason.name}: "  # type: ignore[union-attr]
                f"{result.failure_message}",
                store=store,
            )
        row: dict[str, Any] | None = result.result
        return row

    def metadata_for_key(self, store: str, key: Any) -> KeyQueryMetadata:
        """The key's partition, active host and standby hosts."""
        text = urllib.parse.quote(_key_text(key), safe="")
        doc = self._get_json(f"/metadata/stores/{urllib.parse.quote(store, safe='')}/keys/{text}")
        return KeyQueryMetadata.from_dict(doc)

    def stores(self) -> list[dict[str, Any]]:
        """The tables the cluster serves, as ``GET /stores`` lists them: name, key_columns,
        window_column, partitions and the Spark schema's JSON."""
        stores: list[dict[str, Any]] = self._get_json("/stores")["stores"]
        return stores

    def all_metadata(self) -> list[dict[str, Any]]:
        nodes: list[dict[str, Any]] = self._get_json("/metadata")["nodes"]
        return nodes

    # -- SQL ---------------------------------------------------------------------------------

    def sql(
        self,
        text: str,
        *,
        bound: PositionBound | Position | str | None = None,
        format: str = "rows",
        **options: Any,
    ) -> SqlResult:
        """A SQL pull query; ``bound`` (a bound, a position or its token) for read-your-writes
        (``PositionBound.after(ack)``: a producer's own Kafka records).

        The answer is a :class:`~sparkiq.SqlResult`, as in-process. ``format="arrow"``
        fetches it as an Arrow IPC stream instead of rows: ``to_arrow()`` is then the table
        the node sent (each column with its Spark type's Arrow type), ``to_pandas()`` its
        DataFrame, and ``rows`` are built from it only when first read. Use it for large
        results and for dataframes; the default suits small answers read as dicts.
        ``options`` are ``page_token`` and ``page_size`` (docs/rest.md)."""
        if format not in ("rows", "arrow"):
            raise ValueError(f"format must be 'rows' or 'arrow', got {format!r}")
        if isinstance(text, str) and is_push_query(text):
            raise push_query_error()  # POST /query would stream its changes forever
        doc: dict[str, Any] = {"sql": text, **options}
        if isinstance(bound, PositionBound):
            bound = bound.position
        if bound is not None:
            doc["bound"] = bound if isinstance(bound, str) else bound.to_token()
        if format == "arrow":
            return self._call(lambda url: self._sql_arrow(url, doc), "sql:arrow")

        def call(url: str) -> SqlResult:
            body = self._post(url, "/query", orjson.dumps(doc), self._headers(binary=True))
            answer = unpack(body)
            return SqlResult(
                answer["columns"],
                answer["rows"],
                Position.from_token(answer["position"]),
                answer.get("next_page_token"),
                answer.get("explain"),
            )

        return self._call(call, "sql")

    def _sql_arrow(self, url: str, doc: dict[str, Any]) -> SqlResult:
        headers = self._headers()
        headers["accept"] = arrowipc.CONTENT_TYPE
        response = self._conns.request(url, "POST", "/query", orjson.dumps(doc), headers)
        body = _body(response)
        kind = response.header("content-type") or ""
        if not kind.startswith(arrowipc.CONTENT_TYPE):
            raise SparkiqError(
                f"{url} answered {kind or 'no content type'}, not an Arrow stream: the node "
                'predates Arrow results; upgrade it or use format="rows"'
            )
        table = arrowipc.read_table(body)
        position = Position.from_token(response.header(arrowipc.POSITION_HEADER) or "")
        return _ArrowResult(table, position, response.header(arrowipc.PAGE_TOKEN_HEADER))

    def stream(
        self, text: str, *, from_position: Position | str | None = None, snapshot: bool = False
    ) -> ChangeStream:
        """A push query (``... EMIT CHANGES``): a closeable iterator of
        :class:`~sparkiq.sql.change.Change`, as in-process."""
        doc: dict[str, Any] = {"sql": text, "snapshot": snapshot}
        if from_position is not None:
            doc["from"] = (
                from_position if isinstance(from_position, str) else from_position.to_token()
            )

        def call(url: str) -> ChangeStream:
            response = self._conns.request(
                url, "POST", "/query", orjson.dumps(doc), self._headers()
            )
            if response.status != 200:
                _body(response)  # raises the error it holds
            return ChangeStream(response)

        return self._call(call)

    # -- plumbing ----------------------------------------------------------------------------

    def _post(self, url: str, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        """The body of a 200 answer to a POST; an error answer raises its error."""
        return _body(self._conns.request(url, "POST", path, body, headers))

    def _headers(self, binary: bool = False) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if binary:
            headers = {"content-type": protocol.CONTENT_TYPE, "accept": protocol.CONTENT_TYPE}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    def _call(
        self,
        fn: Callable[[str], T],
        kind: str | None = None,
        *,
        discard: Callable[[T], None] | None = None,
    ) -> T:
        """``fn(url)`` on the first node that answers; learns the others on the way. A read
        (``kind`` given: its latencies teach the hedge delay) is hedged across the nodes
        (see the module docstring); ``discard`` releases an answer that lost the race."""
        urls = list(self._urls)
        if kind is not None and len(urls) > 1:
            return self._race(fn, kind, urls, discard)
        failed = Failures()
        for url in urls:
            started = time.monotonic()
            try:
                answer = fn(url)
            except SparkiqError as exc:
                failed.add(url, exc)  # raises an error that is the node's verdict on the request
                self._demote(url)
                self._learn_nodes()
                continue
            if kind is not None:
                self._hedge.record(kind, time.monotonic() - started)
            return answer
        raise failed.error()

    def _race(
        self,
        fn: Callable[[str], T],
        kind: str,
        urls: list[str],
        discard: Callable[[T], None] | None,
    ) -> T:
        """The first answer of ``fn`` from ``urls``, asked in order: the next node is asked
        as soon as every node asked so far has been out for the hedge delay without an
        answer, or has failed. An answer's latency teaches the delay; a failure other than
        "unreachable" or "cannot answer now" (the node's verdict on the request) is raised
        as it comes."""
        delay = self._hedge.delay(kind)
        queue, asked = deque(urls), set(urls)
        copies: Copies[T] = Copies(self._sender_pool(), release=discard)
        failed = Failures()

        def overdue(copy: Copy[T]) -> bool:
            return delay is not None and time.monotonic() - copy.sent_at >= delay

        try:
            while queue or copies:
                if queue and copies.all_overdue(overdue):
                    for slow in copies:
                        self._demote(slow.target)  # later reads start elsewhere
                    url = queue.popleft()
                    copies.send(url, fn, url)
                    continue
                wait = None
                if queue and delay is not None:  # until the newest copy is overdue
                    wait = max(0.0, copies.newest_sent() + delay - time.monotonic())
                for copy in copies.wait(wait):
                    try:
                        answer = copy.future.result()
                    except SparkiqError as exc:
                        failed.add(copy.target, exc)  # raises the node's verdict on the request
                        self._demote(copy.target)
                        self._learn_nodes()
                        for known in list(self._urls):
                            if known not in asked:
                                asked.add(known)
                                queue.append(known)
                        continue
                    self._hedge.record(kind, time.monotonic() - copy.sent_at)
                    return answer
        finally:
            copies.abandon_all()  # lost the race: cut, and released if they answer
        raise failed.error()

    def _sender_pool(self) -> ElasticPool:
        with self._lock:
            if self._senders is None:
                self._senders = ElasticPool("sparkiq-client-hedge", _MAX_IN_FLIGHT)
            return self._senders

    def _demote(self, url: str) -> None:
        with self._lock:
            if url in self._urls:
                self._urls.remove(url)
                self._urls.append(url)

    def _learn_nodes(self) -> None:
        for url in list(self._urls):
            try:
                response = self._conns.request(
                    url, "GET", "/metadata", b"", self._headers(), timeout=2.0
                )
                if response.status != 200:
                    response.close()
                    continue
                nodes = orjson.loads(response.read())["nodes"]
                known = [n["url"] for n in nodes if n.get("url")]
            except (NodeUnreachableError, ValueError, KeyError, TypeError):
                continue
            with self._lock:
                for node_url in known:
                    if node_url.rstrip("/") not in self._urls:
                        self._urls.append(node_url.rstrip("/"))
            return

    def _get_json(self, path: str) -> Any:
        def call(url: str) -> Any:
            response = self._conns.request(url, "GET", path, b"", self._headers())
            return orjson.loads(_body(response))

        return self._call(call)

    def _store(self, store: str) -> dict[str, Any]:
        found = self._stores.get(store)
        if found is None:
            for doc in self._get_json("/stores")["stores"]:
                self._stores[doc["name"]] = doc
            found = self._stores.get(store)
            if found is None:
                raise UnknownStoreError(
                    f"unknown store {store!r}; the cluster serves {sorted(self._stores)}",
                    store=store,
                )
        return found


class _ArrowResult(SqlResult):
    """A :class:`~sparkiq.SqlResult` received as an Arrow IPC stream: :meth:`to_arrow` is
    the table as received; ``rows`` are built from it on first use (and kept)."""

    __slots__ = ("_rows", "_table")
    _rows: list[dict[str, Any]] | None
    _table: pa.Table

    def __init__(self, table: pa.Table, position: Position, next_page_token: str | None) -> None:
        # SqlResult is frozen: its fields are set the way its own __init__ sets them.
        for name, value in (
            ("columns", list(table.column_names)),
            ("position", position),
            ("next_page_token", next_page_token),
            ("explain", None),
            ("_table", table),
            ("_rows", None),
        ):
            object.__setattr__(self, name, value)

    @property
    def rows(self) -> list[dict[str, Any]]:
        rows = self._rows
        if rows is None:
            rows = arrowipc.table_rows(self._table)
            object.__setattr__(self, "_rows", rows)
        return rows

    def to_arrow(self) -> pa.Table:
        return self._table


class ChangeStream(Iterator[Change]):
    """The changes of a push query as they are committed; ``close()`` ends it."""

    def __init__(self, response: PooledResponse) -> None:
        self._response = response
        self._lines = _lines(response.chunks())
        self.closed = False

    def __iter__(self) -> ChangeStream:
        return self

    def __next__(self) -> Change:
        while not self.closed:
            try:
                line = next(self._lines)
            except (StopIteration, NodeUnreachableError):
                self.close()
                break
            if not line.strip():
                continue  # keep-alive
            doc = orjson.loads(line)
            if "error" in doc:
                self.close()
                error = doc["error"]
                message = f"push query failed: {error['message']}"
                raise _raised({"code": ErrorCode.PUSH_FAILED.wire, **error, "message": message})
            position = Position.from_token(doc["position"])
            return Change(
                doc["key"],
                doc["row"],
                position,
                batch_id=doc["batch_id"],
                snapshot=doc["snapshot"],
            )
        raise StopIteration

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._response.close()

    def __enter__(self) -> ChangeStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _key_text(key: Any) -> str:
    if isinstance(key, tuple | list):
        return jsonapi.dumps(list(key)).decode()
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if hasattr(key, "isoformat"):
        return str(key.isoformat())
    return str(key)


def _body(response: PooledResponse) -> bytes:
    """The body of a 200 answer; any other raises the error it stands for."""
    body = response.read()
    if response.status != 200:
        raise _error(response.status, body)
    return body


def _lines(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """The lines of a body that arrives in ``chunks`` (without their newlines)."""
    held = b""
    for chunk in chunks:
        held += chunk
        *lines, held = held.split(b"\n")
        yield from lines
    if held:
        yield held


def _error(status: int, body: bytes) -> SparkiqError:
    """The error an error answer stands for: its code's class in the table (``raises``),
    built from the body; a body that is no sparkiq error is an ``http_error``."""
    doc = protocol.error_of(body)
    if doc is None:
        text = body[:300].decode("utf-8", "replace")
        doc = {"code": ErrorCode.HTTP_ERROR.wire, "message": text}
    return _raised(doc, status)


def _raised(doc: dict[str, Any], status: int | None = None) -> SparkiqError:
    """The error for ``doc`` (an answer's ``error`` member) of an answer of ``status``
    (a push stream's last line has none: its code's)."""
    code = ErrorCode.parse(str(doc["code"]))
    return exception_class(code).from_answer(code, doc, code.status if status is None else status)
