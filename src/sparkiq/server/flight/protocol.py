"""The Flight SQL messages the endpoint reads and writes, as protobuf classes made at run time.

Flight SQL rides on Arrow Flight: a command is a protobuf message of package
``arrow.flight.protocol.sql``, packed in a ``google.protobuf.Any`` and sent as a
``FlightDescriptor``'s ``cmd`` (or an ``Action``'s body, or a ``Ticket``). Only the subset
this read-only endpoint needs is described here, written from the protocol's wire format:
each message has the package, name, field names, numbers and types a client sends, so the
bytes are the same as those of the upstream definition. The descriptor is built in code
(:func:`_file`) and registered in a private pool, not the process-wide default one, so
another library in the process that loads the upstream ``FlightSql.proto`` does not clash.

Commands the endpoint refuses (updates, ingestion, transactions, Substrait plans) are
recognised by their ``Any`` type name alone (:data:`REFUSED`): their bodies are never read.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError, Message

__all__ = ["PACKAGE", "REFUSED", "MessageError", "message", "pack", "unpack"]

PACKAGE = "arrow.flight.protocol.sql"
_TYPE_PREFIX = "type.googleapis.com/"

# proto3 field kinds used below
_STRING = descriptor_pb2.FieldDescriptorProto.TYPE_STRING
_BYTES = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
_BOOL = descriptor_pb2.FieldDescriptorProto.TYPE_BOOL
_INT32 = descriptor_pb2.FieldDescriptorProto.TYPE_INT32
_INT64 = descriptor_pb2.FieldDescriptorProto.TYPE_INT64
_UINT32 = descriptor_pb2.FieldDescriptorProto.TYPE_UINT32
_REPEATED = "repeated"
_OPTIONAL = "optional"  # proto3 explicit presence (a synthetic oneof per field)

# name -> [(field name, number, type, "" | "optional" | "repeated")]
_MESSAGES: dict[str, list[tuple[str, int, int, str]]] = {
    "CommandGetSqlInfo": [("info", 1, _UINT32, _REPEATED)],
    "CommandGetXdbcTypeInfo": [("data_type", 1, _INT32, _OPTIONAL)],
    "CommandGetCatalogs": [],
    "CommandGetDbSchemas": [
        ("catalog", 1, _STRING, _OPTIONAL),
        ("db_schema_filter_pattern", 2, _STRING, _OPTIONAL),
    ],
    "CommandGetTables": [
        ("catalog", 1, _STRING, _OPTIONAL),
        ("db_schema_filter_pattern", 2, _STRING, _OPTIONAL),
        ("table_name_filter_pattern", 3, _STRING, _OPTIONAL),
        ("table_types", 4, _STRING, _REPEATED),
        ("include_schema", 5, _BOOL, ""),
    ],
    "CommandGetTableTypes": [],
    "CommandGetPrimaryKeys": [
        ("catalog", 1, _STRING, _OPTIONAL),
        ("db_schema", 2, _STRING, _OPTIONAL),
        ("table", 3, _STRING, ""),
    ],
    "CommandGetExportedKeys": [
        ("catalog", 1, _STRING, _OPTIONAL),
        ("db_schema", 2, _STRING, _OPTIONAL),
        ("table", 3, _STRING, ""),
    ],
    "CommandGetImportedKeys": [
        ("catalog", 1, _STRING, _OPTIONAL),
        ("db_schema", 2, _STRING, _OPTIONAL),
        ("table", 3, _STRING, ""),
    ],
    "CommandStatementQuery": [
        ("query", 1, _STRING, ""),
        ("transaction_id", 2, _BYTES, _OPTIONAL),
    ],
    "TicketStatementQuery": [("statement_handle", 1, _BYTES, "")],
    "CommandPreparedStatementQuery": [("prepared_statement_handle", 1, _BYTES, "")],
    "ActionCreatePreparedStatementRequest": [
        ("query", 1, _STRING, ""),
        ("transaction_id", 2, _BYTES, _OPTIONAL),
    ],
    "ActionCreatePreparedStatementResult": [
        ("prepared_statement_handle", 1, _BYTES, ""),
        ("dataset_schema", 2, _BYTES, ""),
        ("parameter_schema", 3, _BYTES, ""),
    ],
    "ActionClosePreparedStatementRequest": [("prepared_statement_handle", 1, _BYTES, "")],
    "DoPutPreparedStatementResult": [("prepared_statement_handle", 1, _BYTES, _OPTIONAL)],
    "DoPutUpdateResult": [("record_count", 1, _INT64, "")],
}

#: Commands and actions that would write or open a transaction: refused by type name.
REFUSED = frozenset(
    {
        "CommandStatementUpdate",
        "CommandPreparedStatementUpdate",
        "CommandStatementIngest",
        "CommandStatementSubstraitPlan",
        "ActionBeginTransactionRequest",
        "ActionBeginSavepointRequest",
        "ActionEndTransactionRequest",
        "ActionEndSavepointRequest",
        "ActionCreatePreparedSubstraitPlanRequest",
    }
)


class MessageError(ValueError):
    """Bytes that are not the Flight SQL message expected (the endpoint answers
    INVALID_ARGUMENT with this text)."""


def _file() -> descriptor_pb2.FileDescriptorProto:
    proto = descriptor_pb2.FileDescriptorProto(
        name="sparkiq/flight_sql_subset.proto", package=PACKAGE, syntax="proto3"
    )
    for name, fields in _MESSAGES.items():
        msg = proto.message_type.add(name=name)
        for field_name, number, kind, rule in fields:
            field = msg.field.add(name=field_name, number=number, type=kind)
            field.label = (
                descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
                if rule == _REPEATED
                else descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
            )
            if rule == _OPTIONAL:  # proto3 `optional`: presence through a synthetic oneof
                field.proto3_optional = True
                field.oneof_index = len(msg.oneof_decl)
                msg.oneof_decl.add(name=f"_{field_name}")
    return proto


def _classes() -> dict[str, type[Message]]:
    pool = descriptor_pool.DescriptorPool()
    pool.Add(_file())
    return {
        name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"{PACKAGE}.{name}"))
        for name in _MESSAGES
    }


_CLASSES: dict[str, type[Message]] | None = None


def message(name: str, **fields: Any) -> Any:
    """A new message ``name`` (of :data:`_MESSAGES`) with ``fields`` set."""
    global _CLASSES
    if _CLASSES is None:  # built on first use: no work at import
        _CLASSES = _classes()
    return _CLASSES[name](**fields)


def pack(msg: Message) -> bytes:
    """``msg`` in a ``google.protobuf.Any``, serialized (a descriptor's ``cmd``, a ticket)."""
    wrapper = any_pb2.Any()
    wrapper.Pack(msg)
    return bytes(wrapper.SerializeToString())


def unpack(data: bytes) -> tuple[str, Any]:
    """The message name and the message in ``data`` (a serialized ``Any``); the message is
    None for a Flight SQL message this endpoint does not parse (a refused one, or one it
    does not know). Raises :class:`MessageError` for bytes that are not a Flight SQL
    ``Any``."""
    wrapper = any_pb2.Any()
    try:
        wrapper.ParseFromString(data)
    except DecodeError:
        raise MessageError(
            "the command is not a protobuf Any: send a Flight SQL command "
            f"({PACKAGE}.CommandStatementQuery, ...) packed in google.protobuf.Any"
        ) from None
    full = wrapper.type_url.removeprefix(_TYPE_PREFIX)
    package, _, name = full.rpartition(".")
    if package != PACKAGE or not name:
        raise MessageError(
            f"unknown command type {wrapper.type_url!r}: this endpoint speaks Flight SQL "
            f"({PACKAGE}.*)"
        )
    if name not in _MESSAGES:
        return name, None
    msg = message(name)
    try:
        msg.ParseFromString(wrapper.value)
    except DecodeError:
        raise MessageError(f"the body of {name} is not a valid {PACKAGE}.{name}") from None
    return name, msg
