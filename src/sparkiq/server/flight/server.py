"""The Flight SQL server of a node: pull queries and catalog calls over Arrow Flight (gRPC).

How a query travels (the protocol's two steps):

1. ``GetFlightInfo`` with a ``CommandStatementQuery`` (or a prepared statement's
   ``CommandPreparedStatementQuery``) runs the statement through ``Node.sql`` -- the engine,
   limits and grants of every other endpoint -- and keeps its Arrow table for the one
   ``DoGet`` that fetches it (:mod:`~sparkiq.server.flight.tickets`); the answer carries
   the result's schema, row count and a ticket naming it.
2. ``DoGet`` with that ticket streams the table as record batches (about
   :data:`BATCH_BYTES` each, at most :data:`BATCH_ROWS` rows).

At most :data:`MAX_RUNNING` statements run at once (gRPC gives each call a thread); more
are refused as UNAVAILABLE. Catalog commands (``CommandGetTables``...) answer with a ticket
that is the command itself, run again at ``DoGet`` (it is cheap). Prepared statements are
kept per server (at most :data:`MAX_PREPARED`, the least recently used go first) with their
bound parameters (``DoPut``, :mod:`~sparkiq.server.flight.params`); preparing runs the
statement once (its markers bound to ``NULL``) for the result schema JDBC needs before
executing; an execution always reads again (rows kept from preparing could be older than
what the client has read since: a read going back in time).

Everything that writes is refused, naming the command: updates, ingestion, transactions,
Substrait plans. Errors are Flight errors with sparkiq's error code in brackets
(:mod:`~sparkiq.server.flight.errors`).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.flight as flight

import sparkiq.server.flight.catalog as catalog
from sparkiq.errors import ConfigError, SparkiqError
from sparkiq.principals import Principal, Principals, readable
from sparkiq.principals import current as current_principal
from sparkiq.server.audit import AuditLog
from sparkiq.server.auth_failures import AuthFailures, peer_of
from sparkiq.server.flight.auth import FlightAuth, HandshakeHandler, peer_address
from sparkiq.server.flight.errors import flight_error, read_only, refused
from sparkiq.server.flight.params import bind, markers, parameter_schema
from sparkiq.server.flight.protocol import REFUSED, MessageError, message, pack, unpack
from sparkiq.server.flight.tickets import TICKET_SECONDS, PendingResults
from sparkiq.server.served import ServedNode
from sparkiq.serving.config import NodeConfig
from sparkiq.sql.limits import SqlLimits
from sparkiq.tls import TlsContexts, TlsFiles

__all__ = ["FlightSqlServer", "flight_location"]

log = logging.getLogger("sparkiq.server.flight")

BATCH_ROWS = 65_536
BATCH_BYTES = 2 << 20
MAX_PREPARED = 1024
MAX_RUNNING = 32  # statements running at once; more are refused (UNAVAILABLE)

_CATALOG_COMMANDS = {
    "CommandGetCatalogs",
    "CommandGetDbSchemas",
    "CommandGetTables",
    "CommandGetTableTypes",
    "CommandGetPrimaryKeys",
    "CommandGetImportedKeys",
    "CommandGetExportedKeys",
    "CommandGetSqlInfo",
}


def flight_location(listen: str, tls: bool) -> str:
    """The gRPC URI of ``listen`` (``"host:port"``; port 0 picks a free one; an empty host
    means every interface)."""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(
            f"flight_listen must be 'host:port' (port 0 picks a free one), got {listen!r}"
        )
    host = host.strip("[]") or "0.0.0.0"
    if ":" in host:
        host = f"[{host}]"
    return f"{'grpc+tls' if tls else 'grpc'}://{host}:{port}"


@dataclass
class _Prepared:
    query: str
    principal: str | None
    schema: pa.Schema | None  # None: unknown until executed
    parameters: pa.Table | None = None


class FlightSqlServer(flight.FlightServerBase):  # type: ignore[misc]
    """Serves Flight SQL on ``listen`` until :meth:`stop` (see the module docstring). Over
    TLS with ``tls`` (the node's certificate files, read once at start: a renewed
    certificate needs a restart of the node, unlike the REST and Postgres listeners)."""

    def __init__(
        self,
        node: ServedNode,
        listen: str,
        *,
        principals: Principals,
        auth_failures: AuthFailures | None = None,
        audit: AuditLog | None = None,
        sql_limits: SqlLimits | None = None,
        tls: TlsFiles | None = None,
    ) -> None:
        self.node = node
        self.limits = sql_limits or SqlLimits()
        self.audit = audit
        self._auth = FlightAuth(principals, auth_failures or AuthFailures())
        options: dict[str, Any] = {}
        if tls is not None:
            with open(tls.cert, "rb") as cert, open(tls.key, "rb") as key:
                options["tls_certificates"] = [flight.CertKeyPair(cert.read(), key.read())]
        location = flight_location(listen, tls is not None)
        try:
            super().__init__(
                location,
                auth_handler=HandshakeHandler(),
                middleware=self._auth.middleware(),
                **options,
            )
        except (OSError, pa.ArrowException) as exc:
            raise ConfigError(f"cannot serve Flight SQL on {listen!r}: {exc}") from None
        host = listen.rpartition(":")[0].strip("[]") or "0.0.0.0"
        #: Where the server listens (the port chosen when ``listen`` asked for port 0).
        self.address: tuple[str, int] = (host, self.port)
        self._lock = threading.Lock()  # guards _prepared, _stopping
        self._stopping = False
        self._running = threading.BoundedSemaphore(MAX_RUNNING)
        self._results = PendingResults(4 * self.limits.max_result_bytes)
        self._prepared: OrderedDict[bytes, _Prepared] = OrderedDict()
        self._info = catalog.sql_info_values(
            self.limits.timeout_seconds, self.limits.max_statement_chars
        )
        log.info("serving Flight SQL on %s:%d (tls %s)", *self.address, "on" if tls else "off")

    @classmethod
    def for_node(
        cls,
        node: ServedNode,
        config: NodeConfig,
        tls: TlsContexts | None,
        principals: Principals,
        auth_failures: AuthFailures,
        audit: AuditLog | None,
    ) -> FlightSqlServer:
        """The endpoint of a node configured with ``config`` (its ``flight_listen``, its
        ``sql_limits``, and its TLS files when ``tls`` is on)."""
        assert config.flight_listen, "for_node serves a node with flight_listen"
        return cls(
            node,
            config.flight_listen,
            principals=principals,
            auth_failures=auth_failures,
            audit=audit,
            sql_limits=config.sql_limits,
            tls=None if tls is None else tls.files,
        )

    def stop(self, timeout: float = 5.0) -> None:
        """Stop taking calls and wait up to ``timeout`` seconds for those in flight (pyarrow's
        ``shutdown`` waits for them without a bound: a client that stopped reading a stream
        would hold it forever, so it runs on a thread of its own). Idempotent."""
        with self._lock:
            stopping, self._stopping = self._stopping, True
            self._results.clear()
            self._prepared.clear()
        if stopping:
            return
        closer = threading.Thread(target=self._shutdown, name="sparkiq-flight-stop", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            log.warning("Flight SQL calls still in flight after %.0f s: left to end", timeout)

    def _shutdown(self) -> None:
        with contextlib.suppress(Exception):
            self.shutdown()

    # -- the calls ---------------------------------------------------------------------------

    def get_flight_info(self, context: Any, descriptor: flight.FlightDescriptor) -> Any:
        with self._call(context, "GetFlightInfo") as call:
            name, msg = self._command(descriptor)
            if name in _CATALOG_COMMANDS:
                table = self._catalog(name, msg)
                ticket = flight.Ticket(descriptor.command)
                return flight.FlightInfo(
                    table.schema, descriptor, [flight.FlightEndpoint(ticket, [])], -1, -1
                )
            table = self._query_of(name, msg, call)
            handle = self._results.keep(table, _name(call.principal))
            ticket = flight.Ticket(pack(message("TicketStatementQuery", statement_handle=handle)))
            return flight.FlightInfo(
                table.schema,
                descriptor,
                [flight.FlightEndpoint(ticket, [])],
                table.num_rows,
                table.nbytes,
            )

    def get_schema(self, context: Any, descriptor: flight.FlightDescriptor) -> Any:
        with self._call(context, "GetSchema") as call:
            name, msg = self._command(descriptor)
            if name in _CATALOG_COMMANDS:
                return flight.SchemaResult(self._catalog(name, msg).schema)
            if name == "CommandPreparedStatementQuery":
                prepared = self._prepared_of(msg.prepared_statement_handle, call.principal)
                if prepared.schema is not None:
                    return flight.SchemaResult(prepared.schema)
            return flight.SchemaResult(self._query_of(name, msg, call).schema)

    def do_get(self, context: Any, ticket: flight.Ticket) -> Any:
        with self._call(context, "DoGet") as call:
            name, msg = self._parsed(ticket.ticket)
            if name in _CATALOG_COMMANDS:
                table = self._catalog(name, msg)
            elif name == "TicketStatementQuery":
                found = self._results.take(msg.statement_handle, _name(call.principal))
                if found is None:
                    raise refused(
                        "this ticket's result is gone (fetched already, older than "
                        f"{TICKET_SECONDS:.0f} s, or pushed out by newer results): run the "
                        "statement again"
                    )
                table = found
            else:
                raise refused(f"a DoGet ticket of type {name} is not one this node gave")
            call.rows = table.num_rows
            batches = table.to_batches(max_chunksize=_batch_rows(table))
            return flight.RecordBatchStream(
                pa.RecordBatchReader.from_batches(table.schema, batches)
            )

    def do_put(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        with self._call(context, "DoPut") as call:
            name, msg = self._command(descriptor)
            if name != "CommandPreparedStatementQuery":
                raise refused(
                    f"DoPut takes the parameters of a prepared query "
                    f"(CommandPreparedStatementQuery), not {name}"
                )
            handle = msg.prepared_statement_handle
            prepared = self._prepared_of(handle, call.principal)
            parameters = self._parameters(reader)
            with self._lock:
                prepared.parameters = parameters
            result = message("DoPutPreparedStatementResult", prepared_statement_handle=handle)
            writer.write(pa.py_buffer(result.SerializeToString()))

    def _action_request(self, action: str, body: bytes) -> Any:
        """The ``Action<action>Request`` message an action's body must hold."""
        expected = f"Action{action}Request"
        name, msg = self._parsed(body)
        if name != expected:
            raise refused(f"{action} takes an {expected}, not {name}")
        return msg

    def do_action(self, context: Any, action: flight.Action) -> Iterator[bytes]:
        with self._call(context, action.type) as call:
            body = action.body.to_pybytes() if action.body is not None else b""
            if action.type == "CreatePreparedStatement":
                msg = self._action_request(action.type, body)
                return iter([pack(self._prepare(msg, call))])
            if action.type == "ClosePreparedStatement":
                msg = self._action_request(action.type, body)
                self._prepared_of(msg.prepared_statement_handle, call.principal)
                with self._lock:
                    self._prepared.pop(msg.prepared_statement_handle, None)
                return iter([])
            transactional = {
                "BeginTransaction",
                "EndTransaction",
                "BeginSavepoint",
                "EndSavepoint",
                "CreatePreparedSubstraitPlan",
            }
            if action.type in transactional:
                raise read_only(action.type)
            raise refused(
                f"unknown action {action.type!r}: this node serves CreatePreparedStatement "
                "and ClosePreparedStatement"
            )

    def list_actions(self, context: Any) -> list[tuple[str, str]]:
        return [
            ("CreatePreparedStatement", "prepare a pull query (parameters: ?)"),
            ("ClosePreparedStatement", "forget a prepared statement"),
        ]

    def list_flights(self, context: Any, criteria: bytes) -> Iterator[Any]:
        return iter([])

    def do_exchange(self, context: Any, descriptor: Any, reader: Any, writer: Any) -> None:
        raise refused("DoExchange is not part of Flight SQL")

    # -- statements --------------------------------------------------------------------------

    def _query_of(self, name: str, msg: Any, call: _Call) -> pa.Table:
        """The result of a query command (statement or prepared), run now."""
        if name == "CommandStatementQuery":
            if msg.HasField("transaction_id"):
                raise read_only("a transaction")
            return self._run(msg.query, call)
        if name == "CommandPreparedStatementQuery":
            prepared = self._prepared_of(msg.prepared_statement_handle, call.principal)
            with self._lock:
                parameters = prepared.parameters
            return self._run(bind(prepared.query, parameters), call)
        if name in REFUSED:
            raise read_only(name)
        raise refused(
            f"{name} is not served: this node answers queries (CommandStatementQuery, prepared "
            "statements) and the catalog commands (GetTables, GetPrimaryKeys...)"
        )

    def _run(self, text: str, call: _Call) -> pa.Table:
        self.limits.check_statement(text)
        # gRPC gives every call a thread: statements beyond the bound are refused at once
        # rather than piling up behind the engine
        if not self._running.acquire(blocking=False):
            raise flight.FlightUnavailableError(
                f"[too_many_statements] this node runs at most {MAX_RUNNING} Flight SQL "
                "statements at once: retry later or on another node"
            )
        try:
            result = self.node.sql(text)
            tables = set(self.node.tables)
            call.tables = tuple(t for t in result.position.to_map() if t in tables)
            table = result.to_arrow()
        finally:
            self._running.release()
        call.rows = table.num_rows
        return table

    def _prepare(self, msg: Any, call: _Call) -> Any:
        if msg.HasField("transaction_id"):
            raise read_only("a transaction")
        query = msg.query
        self.limits.check_statement(query)
        nulls = pa.table({str(i): pa.nulls(1) for i in range(len(markers(query)))})
        schema: pa.Schema | None = None
        try:
            schema = self._run(bind(query, nulls), call).schema
        except SparkiqError:
            if not markers(query):
                raise  # a statement that fails as written fails when prepared
        handle = os.urandom(16)
        prepared = _Prepared(query, _name(call.principal), schema)
        with self._lock:
            self._prepared[handle] = prepared
            while len(self._prepared) > MAX_PREPARED:
                self._prepared.popitem(last=False)
        return message(
            "ActionCreatePreparedStatementResult",
            prepared_statement_handle=handle,
            dataset_schema=b"" if schema is None else schema.serialize().to_pybytes(),
            parameter_schema=self._parameter_schema(query),
        )

    def _parameters(self, reader: Any) -> pa.Table:
        """The parameter batches of a ``DoPut``, read one at a time and refused as soon as
        they hold more bytes than a statement may have characters."""
        batches = []
        held = 0
        limit = self.limits.max_statement_chars
        for chunk in reader:
            if chunk.data is None:
                continue
            held += chunk.data.nbytes
            if held > limit:
                raise refused(
                    f"more than {limit} bytes of parameters: more than the statement may "
                    f"hold (SqlLimits.max_statement_chars={limit})"
                )
            batches.append(chunk.data)
        return pa.Table.from_batches(batches, schema=reader.schema)

    def _parameter_schema(self, query: str) -> bytes:
        if not markers(query):
            return b""
        visible = readable(self.node.tables)
        schema = parameter_schema(query, visible, self.node.schema)
        return bytes(schema.serialize().to_pybytes())

    def _prepared_of(self, handle: bytes, principal: Principal | None) -> _Prepared:
        with self._lock:
            prepared = self._prepared.get(handle)
            if prepared is not None:
                self._prepared.move_to_end(handle)
        if prepared is None or prepared.principal != _name(principal):
            raise refused(
                "unknown prepared statement handle (closed, never made here, or forgotten "
                f"after {MAX_PREPARED} newer ones): prepare the statement again"
            )
        return prepared

    # -- results waiting for their DoGet -----------------------------------------------------

    # -- catalog -----------------------------------------------------------------------------

    def _catalog(self, name: str, msg: Any) -> pa.Table:
        node = self.node
        opt: Callable[[str], str | None] = lambda f: getattr(msg, f) if msg.HasField(f) else None  # noqa: E731
        if name == "CommandGetCatalogs":
            return catalog.catalogs()
        if name == "CommandGetDbSchemas":
            return catalog.db_schemas(opt("catalog"), opt("db_schema_filter_pattern"))
        if name == "CommandGetTableTypes":
            return catalog.table_types()
        if name == "CommandGetSqlInfo":
            return catalog.sql_info(self._info, list(msg.info))
        if name == "CommandGetTables":
            return catalog.tables(
                node.tables,
                node.schema,
                catalog=opt("catalog"),
                schema_pattern=opt("db_schema_filter_pattern"),
                table_pattern=opt("table_name_filter_pattern"),
                types=list(msg.table_types),
                include_schema=msg.include_schema,
            )
        if name == "CommandGetPrimaryKeys":
            return catalog.primary_keys(
                node.tables,
                node.schema,
                catalog=opt("catalog"),
                db_schema=opt("db_schema"),
                table=msg.table,
            )
        return catalog.foreign_keys()

    # -- plumbing ----------------------------------------------------------------------------

    def _command(self, descriptor: Any) -> tuple[str, Any]:
        if descriptor.descriptor_type != flight.DescriptorType.CMD:
            raise refused(
                "this node serves Flight SQL: send a command descriptor (a Flight SQL command "
                "packed in google.protobuf.Any), not a path"
            )
        return self._parsed(descriptor.command)

    def _parsed(self, data: bytes) -> tuple[str, Any]:
        try:
            name, msg = unpack(data)
        except MessageError as exc:
            raise refused(str(exc)) from None
        if msg is None:
            if name in REFUSED:
                raise read_only(name)
            raise refused(f"the Flight SQL command {name} is not served")
        return name, msg

    @contextlib.contextmanager
    def _call(self, context: Any, kind: str) -> Iterator[_Call]:
        """Authenticate the call, run its body as its principal, translate errors into
        Flight errors and write its audit line."""
        started = time.perf_counter()
        call = _Call(self._auth.principal(context))
        token = current_principal.set(call.principal)
        status = "ok"
        try:
            yield call
        except flight.FlightError as exc:
            status = type(exc).__name__
            raise
        except SparkiqError as exc:
            status = exc.code.wire
            raise flight_error(exc) from None
        except Exception as exc:
            log.exception("Flight SQL %s failed", kind)
            status = "internal"
            raise flight.FlightInternalError(f"the node failed: {exc}") from None
        finally:
            current_principal.reset(token)
            if self.audit is not None and (call.tables or status != "ok" or kind == "DoGet"):
                self.audit.record(
                    listener="flight",
                    principal=_name(call.principal),
                    peer=peer_of(peer_address(context.peer())),
                    kind=kind,
                    tables=call.tables,
                    status=status,
                    seconds=time.perf_counter() - started,
                    rows=call.rows,
                )


@dataclass
class _Call:
    principal: Principal | None
    tables: tuple[str, ...] = ()
    rows: int | None = None


def _batch_rows(table: pa.Table) -> int:
    """Rows per record batch: about :data:`BATCH_BYTES` each (well under gRPC's usual 4 MB
    message limit, and the first rows reach the client early), at most :data:`BATCH_ROWS`."""
    per_row = max(1, int(table.nbytes) // max(1, int(table.num_rows)))
    return max(1, min(BATCH_ROWS, BATCH_BYTES // per_row))


def _name(principal: Principal | None) -> str | None:
    return None if principal is None else principal.name
