"""The one table of error codes: what every sparkiq error says on every wire.

Each :class:`ErrorCode` member is one row: its wire string (``code`` in a REST error body, a
node-protocol error frame and a push stream's last line), the HTTP status a REST answer
carries, the SQLSTATE a Postgres ``ErrorResponse`` carries, whether asking again unchanged
may succeed (``retryable``), the exception class a :class:`~sparkiq.Client` raises for it
(``raises``, a dotted name resolved by :func:`sparkiq.errors.exception_class`) and one line
of what to do. Every :class:`~sparkiq.errors.SparkiqError` carries one; the REST renderer,
the Postgres renderer and the client's error parser read this table and nothing else.

Wire strings are a public contract: never rename one (clients match on them). A code this
version does not know (sent by a newer node) still parses, as an unlisted code with
:attr:`ErrorCode.UPSTREAM_UNAVAILABLE`'s status and SQLSTATE.

docs/rest.md holds the same table for people; ``tests/test_error_codes.py`` fails when the
two disagree. This module imports nothing from the rest of the package.
"""

from __future__ import annotations

from enum import StrEnum

__all__ = ["ErrorCode"]

# The classes a client raises, by dotted name (this module imports none of them).
_INVALID = "sparkiq.errors.InvalidQueryError"
_AUTH = "sparkiq.errors.AuthenticationError"
_FORBIDDEN = "sparkiq.errors.ForbiddenError"
_STORE = "sparkiq.errors.UnknownStoreError"
_SQL = "sparkiq.sql.errors.SqlError"
_SYNTAX = "sparkiq.sql.errors.SqlSyntaxError"
_UNSUPPORTED = "sparkiq.sql.errors.SqlUnsupportedError"
_NAME = "sparkiq.sql.errors.SqlUnknownNameError"
_LIMIT = "sparkiq.sql.errors.SqlLimitError"
_PUSH = "sparkiq.sql.push_plan.PushQueryError"
_SUBSCRIPTION = "sparkiq.sql.subscription.SubscriptionError"
_SLOW = "sparkiq.sql.subscription.SlowConsumerError"
_EXPIRED = "sparkiq.sql.subscription.PositionExpiredError"
_REMOTE = "sparkiq.wire.protocol.RemoteError"


class ErrorCode(StrEnum):
    """A stable error code and how every door renders it (see the module docstring).

    A member is its wire string (``ErrorCode.SYNTAX == "syntax"``)."""

    status: int
    sqlstate: str
    retryable: bool
    raises: str
    todo: str

    def __new__(
        cls, wire: str, status: int, sqlstate: str, retryable: bool, raises: str, todo: str
    ) -> ErrorCode:
        member = str.__new__(cls, wire)
        member._value_ = wire
        member.status, member.sqlstate, member.retryable = status, sqlstate, retryable
        member.raises, member.todo = raises, todo
        return member

    @property
    def wire(self) -> str:
        """The wire string as a plain ``str`` (for encoders that refuse subclasses)."""
        return str.__str__(self)

    @classmethod
    def parse(cls, text: str) -> ErrorCode:
        """The code whose wire string is ``text``: a member, or an unlisted code for one this
        version does not know (a newer node's). ``ValueError`` for an empty string."""
        found = cls._value2member_map_.get(text)
        if isinstance(found, ErrorCode):
            return found
        unlisted = cls._missing_(text)
        if unlisted is None:
            raise ValueError(f"an error code is a non-empty string, got {text!r}")
        return unlisted

    @classmethod
    def _missing_(cls, value: object) -> ErrorCode | None:
        """An unlisted code read from the wire (a newer node's): itself, rendered as an
        upstream failure."""
        if not isinstance(value, str) or not value:
            return None
        like = cls.UPSTREAM_UNAVAILABLE
        member = str.__new__(cls, value)
        member._name_, member._value_ = "UNLISTED", value
        member.status, member.sqlstate, member.retryable = like.status, like.sqlstate, False
        member.raises, member.todo = _REMOTE, "a code this sparkiq version does not know"
        return member

    # -- the request itself -----------------------------------------------------------------
    INVALID_QUERY = (
        "invalid_query", 400, "22023", False, _INVALID,
        "fix the request field that `field` names",
    )  # fmt: skip
    MALFORMED_JSON = (
        "malformed_json", 400, "22P02", False, _INVALID,
        "send a well-formed JSON body",
    )  # fmt: skip
    INVALID_REQUEST = (
        "invalid_request", 400, "22023", False, _INVALID,
        "send the fields the endpoint expects; `field` names the one at fault",
    )  # fmt: skip
    DISCONNECTED = (
        "disconnected", 400, "08006", True, _INVALID,
        "the client left before its body ended: send the request again",
    )  # fmt: skip
    INVALID_HEARTBEAT = (
        "invalid_heartbeat", 400, "22023", False, _INVALID,
        "a node sent a malformed heartbeat: run one sparkiq version on every node",
    )  # fmt: skip
    NESTING_TOO_DEEP = (
        "nesting_too_deep", 400, "54000", False, _LIMIT,
        "flatten the statement or body: it nests deeper than can be read",
    )  # fmt: skip
    PROTOCOL_VIOLATION = (
        "protocol_violation", 400, "08P01", False, _REMOTE,
        "use a client that follows the protocol (here: SCRAM-SHA-256 as RFC 5802 says)",
    )  # fmt: skip
    UNAUTHORIZED = (
        "unauthorized", 401, "28P01", False, _AUTH,
        "send the node's token (or a principal's); after many failures wait "
        "retry_after_seconds",
    )  # fmt: skip
    FORBIDDEN = (
        "forbidden", 403, "42501", False, _FORBIDDEN,
        "grant the token's principal the table, or read only granted tables",
    )  # fmt: skip
    CROSS_ORIGIN = (
        "cross_origin", 403, "42501", False, _REMOTE,
        "post from the node's own pages, or from a program (no Origin header)",
    )  # fmt: skip
    UNKNOWN_STORE = (
        "unknown_store", 404, "42P01", False, _STORE,
        "name a table the node serves (GET /stores lists them)",
    )  # fmt: skip
    KEY_NOT_FOUND = (
        "key_not_found", 404, "02000", False, _REMOTE,
        "nothing to fix: the table has no row for that key",
    )  # fmt: skip
    NOT_FOUND = (
        "not_found", 404, "42704", False, _REMOTE,
        "use a route that /openapi.json lists",
    )  # fmt: skip
    METHOD_NOT_ALLOWED = (
        "method_not_allowed", 405, "0A000", False, _REMOTE,
        "use the method the message names",
    )  # fmt: skip
    NOT_ACCEPTABLE = (
        "not_acceptable", 406, "0A000", False, _REMOTE,
        "drop the Accept header the message names",
    )  # fmt: skip
    REQUEST_TIMEOUT = (
        "request_timeout", 408, "57014", True, _REMOTE,
        "send headers and body within the node's timeouts",
    )  # fmt: skip
    BODY_TOO_LARGE = (
        "body_too_large", 413, "54000", False, _REMOTE,
        "send a smaller body (at most 1 MiB)",
    )  # fmt: skip
    UNSUPPORTED_CONTENT_TYPE = (
        "unsupported_content_type", 415, "0A000", False, _REMOTE,
        "send content-type: application/json",
    )  # fmt: skip
    HOST_NOT_ALLOWED = (
        "host_not_allowed", 421, "08004", False, _REMOTE,
        "reach the node by a name it answers, or add it (--allowed-host, SPARKIQ_ALLOWED_HOSTS)",
    )  # fmt: skip
    HEADERS_TOO_LARGE = (
        "headers_too_large", 431, "54000", False, _REMOTE,
        "send smaller request headers (at most 64 KiB)",
    )  # fmt: skip
    # -- SQL: the statement ----------------------------------------------------------------
    SQL_ERROR = (
        "sql_error", 400, "22023", False, _SQL,
        "fix the statement as the message says",
    )  # fmt: skip
    SYNTAX = (
        "syntax", 400, "42601", False, _SYNTAX,
        "fix the statement at the line and column shown",
    )  # fmt: skip
    UNKNOWN_NAME = (
        "unknown_name", 400, "42P01", False, _NAME,
        "use a name that exists; `candidates` lists the closest",
    )  # fmt: skip
    UNKNOWN_TABLE = (
        "unknown_table", 400, "42P01", False, _NAME,
        "name a served table; `candidates` lists the closest",
    )  # fmt: skip
    UNKNOWN_COLUMN = (
        "unknown_column", 400, "42703", False, _NAME,
        "name a column of the table; `candidates` lists the closest",
    )  # fmt: skip
    UNKNOWN_FUNCTION = (
        "unknown_function", 400, "42883", False, _NAME,
        "use a function the SQL engine has (see docs/sql.md)",
    )  # fmt: skip
    UNKNOWN_FIELD = (
        "unknown_field", 400, "42P01", False, _NAME,
        "name a field the struct has",
    )  # fmt: skip
    UNKNOWN_STATEMENT = (
        "unknown_statement", 400, "42P01", False, _NAME,
        "prepare the statement (or open the portal) before using it",
    )  # fmt: skip
    UNSUPPORTED = (
        "unsupported", 400, "0A000", False, _UNSUPPORTED,
        "rewrite the statement without what the message names",
    )  # fmt: skip
    UNSUPPORTED_STATEMENT = (
        "unsupported_statement", 400, "0A000", False, _UNSUPPORTED,
        "send a SELECT (or EXPLAIN / SHOW): pull queries only read",
    )  # fmt: skip
    MULTIPLE_STATEMENTS = (
        "multiple_statements", 400, "0A000", False, _UNSUPPORTED,
        "send one statement per request",
    )  # fmt: skip
    FORBIDDEN_STATEMENT = (
        "forbidden_statement", 400, "42501", False, _UNSUPPORTED,
        "send a SELECT: statements that write or change settings are refused",
    )  # fmt: skip
    FORBIDDEN_TABLE = (
        "forbidden_table", 400, "42501", False, _UNSUPPORTED,
        "read only the tables the message names",
    )  # fmt: skip
    FORBIDDEN_FUNCTION = (
        "forbidden_function", 400, "42501", False, _UNSUPPORTED,
        "drop the function: it reads files, settings or the network",
    )  # fmt: skip
    QUALIFIED_FUNCTION = (
        "qualified_function", 400, "0A000", False, _UNSUPPORTED,
        "call the function by its bare name",
    )  # fmt: skip
    QUALIFIED_TABLE = (
        "qualified_table", 400, "0A000", False, _UNSUPPORTED,
        "name the table without a schema or catalog",
    )  # fmt: skip
    PARAMETERS = (
        "parameters", 400, "0A000", False, _UNSUPPORTED,
        "write the values into the statement, or bind them as the message says",
    )  # fmt: skip
    UNSUPPORTED_AS_OF = (
        "unsupported_as_of", 400, "0A000", False, _UNSUPPORTED,
        "use AS OF as docs/sql.md shows (a batch id or a timestamp literal)",
    )  # fmt: skip
    BAD_AS_OF = (
        "bad_as_of", 400, "22023", False, _SQL,
        "give AS OF a batch id or time the table still holds",
    )  # fmt: skip
    COPY_OPTION = (
        "copy_option", 400, "0A000", False, _UNSUPPORTED,
        "use COPY ... TO STDOUT with FORMAT text, csv or binary",
    )  # fmt: skip
    CATALOG = (
        "catalog", 400, "0A000", False, _UNSUPPORTED,
        "ask the catalog only what docs/postgres.md lists",
    )  # fmt: skip
    PUSH_QUERY = (
        "push_query", 400, "0A000", False, _UNSUPPORTED,
        "run EMIT CHANGES with stream(); sql() answers pull queries",
    )  # fmt: skip
    PUSH_QUERY_INVALID = (
        "push_query_invalid", 400, "22023", False, _PUSH,
        "write the push query as docs/sql.md shows",
    )  # fmt: skip
    # -- SQL: values -----------------------------------------------------------------------
    EXECUTION = (
        "execution", 400, "22023", False, _SQL,
        "fix the statement as the message says",
    )  # fmt: skip
    INVALID_VALUE = (
        "invalid_value", 400, "22023", False, _SQL,
        "give a value of the type the message names",
    )  # fmt: skip
    OUT_OF_RANGE = (
        "out_of_range", 400, "22023", False, _SQL,
        "use a value within the type's range",
    )  # fmt: skip
    IMPOSSIBLE_CAST = (
        "impossible_cast", 400, "22023", False, _SQL,
        "cast to a type the value converts to",
    )  # fmt: skip
    TYPE_MISMATCH = (
        "type_mismatch", 400, "22023", False, _SQL,
        "compare or combine values of matching types (CAST one)",
    )  # fmt: skip
    GROUPING = (
        "grouping", 400, "22023", False, _SQL,
        "GROUP BY every selected column that is not aggregated",
    )  # fmt: skip
    INVALID_LIMIT = (
        "invalid_limit", 400, "22023", False, _SQL,
        "give LIMIT and OFFSET values of zero or more",
    )  # fmt: skip
    SET_OPERATION = (
        "set_operation", 400, "22023", False, _SQL,
        "give both sides of UNION / EXCEPT / INTERSECT the same number of columns",
    )  # fmt: skip
    BAD_PAGE_TOKEN = (
        "bad_page_token", 400, "22023", False, _SQL,
        "send next_page_token exactly as received, with the same statement",
    )  # fmt: skip
    INVALID_PARAMETER = (
        "invalid_parameter", 400, "22023", False, _SQL,
        "bind a value of the parameter's type",
    )  # fmt: skip
    INVALID_PARAMETER_VALUE = (
        "invalid_parameter_value", 400, "22023", False, _SQL,
        "set the setting to a value of the form the message shows",
    )  # fmt: skip
    UNKNOWN_SETTING = (
        "unknown_setting", 400, "22023", False, _SQL,
        "set or show only the settings docs/postgres.md lists",
    )  # fmt: skip
    CLOSED = (
        "closed", 400, "22023", True, _SQL,
        "the node is shutting down: ask another node",
    )  # fmt: skip
    # -- SQL: limits -----------------------------------------------------------------------
    LIMIT = (
        "limit", 400, "54000", False, _LIMIT,
        "stay within the limit the message names (docs/sql.md#limits)",
    )  # fmt: skip
    STATEMENT_TOO_LONG = (
        "statement_too_long", 400, "54000", False, _LIMIT,
        "send a shorter statement, or raise SPARKIQ_SQL_MAX_STATEMENT_CHARS",
    )  # fmt: skip
    TOO_MANY_TERMS = (
        "too_many_terms", 400, "54000", False, _LIMIT,
        "send fewer IN values or key predicates",
    )  # fmt: skip
    PAGE_TOO_LARGE = (
        "page_too_large", 400, "54000", False, _LIMIT,
        "ask for a smaller page_size",
    )  # fmt: skip
    TOO_MANY_ROWS = (
        "too_many_rows", 400, "54000", False, _LIMIT,
        "page the result (page_size) or narrow it",
    )  # fmt: skip
    RESULT_ROWS = (
        "result_rows", 400, "54000", False, _LIMIT,
        "narrow the catalog query, or raise SPARKIQ_SQL_MAX_RESULT_ROWS",
    )  # fmt: skip
    RESULT_TOO_LARGE = (
        "result_too_large", 400, "54000", False, _LIMIT,
        "select fewer columns or rows",
    )  # fmt: skip
    VALUE_TOO_LARGE = (
        "value_too_large", 400, "54000", False, _LIMIT,
        "build smaller values (strings, lists) in the statement",
    )  # fmt: skip
    TOO_COSTLY = (
        "too_costly", 400, "54000", False, _LIMIT,
        "narrow the query: it would read or build too much",
    )  # fmt: skip
    OUT_OF_MEMORY = (
        "out_of_memory", 400, "54000", True, _LIMIT,
        "narrow the query, or retry when the node is less busy",
    )  # fmt: skip
    PARAMETER_TOO_LARGE = (
        "parameter_too_large", 400, "54000", False, _LIMIT,
        "bind a smaller value",
    )  # fmt: skip
    TOO_MANY_PARAMETERS = (
        "too_many_parameters", 400, "54000", False, _LIMIT,
        "bind fewer parameters",
    )  # fmt: skip
    TIMEOUT = (
        "timeout", 400, "57014", False, _LIMIT,
        "narrow the query, or raise SPARKIQ_SQL_TIMEOUT_SECONDS",
    )  # fmt: skip
    CANCELED = (
        "canceled", 400, "57014", False, _LIMIT,
        "its caller canceled the statement: run it again if it is still wanted",
    )  # fmt: skip
    # -- the cluster's state: retry ---------------------------------------------------------
    PARTITION_FAILED = (
        "partition_failed", 503, "57P03", True, _REMOTE,
        "a partition could not answer (behind the bound, no live replica): retry later",
    )  # fmt: skip
    TOO_MANY_SUBSCRIPTIONS = (
        "too_many_subscriptions", 503, "53000", True, _REMOTE,
        "retry later, or on another node",
    )  # fmt: skip
    TOO_MANY_CONNECTIONS = (
        "too_many_connections", 503, "53300", True, _REMOTE,
        "retry later: the node holds its maximum of open connections",
    )  # fmt: skip
    PUSH_FAILED = (
        "push_failed", 503, "58000", True, _SUBSCRIPTION,
        "resume the push query from the last position received",
    )  # fmt: skip
    SLOW_CONSUMER = (
        "slow_consumer", 503, "58000", True, _SLOW,
        "read faster, then resume from the last position received",
    )  # fmt: skip
    POSITION_EXPIRED = (
        "position_expired", 503, "58000", False, _EXPIRED,
        "start again with snapshot=True, or keep the changelog longer",
    )  # fmt: skip
    UNAVAILABLE = (
        "unavailable", 503, "58000", True, _REMOTE,
        "the node could not answer (a store or changelog fault): retry, or ask another node",
    )  # fmt: skip
    UPSTREAM_UNAVAILABLE = (
        "upstream_unavailable", 502, "58000", True, _REMOTE,
        "another node failed while answering: retry",
    )  # fmt: skip
    BAD_FRAME = (
        "bad_frame", 502, "58000", False, _REMOTE,
        "a node answered a malformed frame: run one sparkiq version on every node",
    )  # fmt: skip
    HTTP_ERROR = (
        "http_error", 502, "58000", False, _REMOTE,
        "something other than a sparkiq node answered: check the URL (a proxy?)",
    )  # fmt: skip
    INTERNAL_ERROR = (
        "internal_error", 500, "XX000", False, _REMOTE,
        "a bug: report it with the request id; the node's log has the detail",
    )  # fmt: skip
