"""Binding a ``Bind`` message's parameter values into statement text as SQL literals.

Values are decoded lazily, one at a time as the text names them, and every size is
checked before the work it bounds: how many values a Bind carries
(``PgLimits.max_parameters``), how long each literal may become
(``max_parameter_chars``; for a binary ``numeric``, its digit counts from its header,
``max_numeric_digits``, before any digit is expanded), and how long the bound statement may
grow (``SqlLimits.max_statement_chars``, checked as each literal is appended). A value over
a limit fails the Bind with SQLSTATE 54000 naming the parameter and the limit; a malformed
binary value with 22023. So a few bytes on the wire never become a large literal: a binary
numeric of one digit with weight 32,767 is 131,072 digits as text.
"""

from __future__ import annotations

import datetime as dt
import decimal
import re
import struct
from collections.abc import Callable, Sequence
from decimal import Decimal

from sparkiq.error_codes import ErrorCode
from sparkiq.limits import PgLimits
from sparkiq.server.pg.arrays import ARRAY_ELEMENTS, array_parameter
from sparkiq.server.pg.statements import code_segments
from sparkiq.sql.errors import SqlError, SqlLimitError, SqlUnsupportedError

__all__ = ["BINARY_PARAMETER_OIDS", "Slots", "bind_parameters", "parameter_slots"]

_NUMERIC_OIDS = frozenset({20, 21, 23, 26, 700, 701, 1700})
_PG_EPOCH = dt.datetime(2000, 1, 1)
_PG_EPOCH_DAYS = dt.date(2000, 1, 1).toordinal()
_NUMERIC_SIGNS = {0x0000: "", 0x4000: "-"}
_NUMERIC_NAN = 0xC000
_PARAM = re.compile(r"\$(\d+)")
_DEFAULT_LIMITS = PgLimits()


class _Invalid(Exception):
    """A binary value that is not what its type says (the caller names the parameter)."""


def _numeric(data: bytes, max_digits: int) -> str:
    """Postgres' binary numeric (base-10000 digits, weight, sign, display scale), its
    sizes checked against ``max_digits`` before a digit is expanded."""
    if len(data) < 8:
        raise _Invalid("a binary numeric has an 8-byte header")
    count, weight, sign, scale = struct.unpack("!hhHH", data[:8])
    if sign == _NUMERIC_NAN:
        return "'NaN'::DOUBLE"
    if sign not in _NUMERIC_SIGNS or count < 0 or len(data) != 8 + 2 * count:
        raise _Invalid("not a binary numeric (sign, digit count or length is wrong)")
    # Digits the value spans before and after the point: weight counts base-10000 digits
    # before it (minus one), a negative weight puts zeros right after it.
    before = 4 * (weight + 1) if count else 0
    after = max(scale, 4 * (count - weight - 1))
    if before > max_digits or after > max_digits:
        raise SqlLimitError(
            f"a numeric of {max(before, 0)} digits before the point and {after} after, more "
            f"than SPARKIQ_PG_MAX_NUMERIC_DIGITS={max_digits}",
            code=ErrorCode.PARAMETER_TOO_LARGE,
        )
    digits = struct.unpack(f"!{count}H", data[8:])
    if any(d > 9999 for d in digits):
        raise _Invalid("a binary numeric digit is over 9999")
    with decimal.localcontext() as context:
        context.prec = 4 * (abs(weight) + count + 1) + scale  # exact: every digit fits
        value = sum((Decimal(d).scaleb(4 * (weight - i)) for i, d in enumerate(digits)), Decimal(0))
        value = value.quantize(Decimal(1).scaleb(-scale))
    return _NUMERIC_SIGNS[sign] + format(value, "f")


def _timestamp(micros: int) -> dt.datetime:
    return _PG_EPOCH + dt.timedelta(microseconds=micros)


def _timestamptz(data: bytes) -> str:
    # An instant, as the naive local time PySpark's timestamp values hold (types.py sends
    # them the other way).
    instant = _timestamp(struct.unpack("!q", data)[0]).replace(tzinfo=dt.UTC)
    return f"TIMESTAMP '{instant.astimezone().replace(tzinfo=None).isoformat(sep=' ')}'"


_BINARY_DECODERS: dict[int, Callable[[bytes], str]] = {
    16: lambda b: "TRUE" if b != b"\x00" else "FALSE",
    20: lambda b: str(struct.unpack("!q", b)[0]),
    21: lambda b: str(struct.unpack("!h", b)[0]),
    23: lambda b: str(struct.unpack("!i", b)[0]),
    700: lambda b: repr(struct.unpack("!f", b)[0]),
    701: lambda b: repr(struct.unpack("!d", b)[0]),
    1082: lambda b: (
        f"DATE '{dt.date.fromordinal(_PG_EPOCH_DAYS + struct.unpack('!i', b)[0]).isoformat()}'"
    ),
    1114: lambda b: f"TIMESTAMP '{_timestamp(struct.unpack('!q', b)[0]).isoformat(sep=' ')}'",
    1184: _timestamptz,
}
_TEXT_OIDS = frozenset({0, 18, 19, 25, 705, 1042, 1043})
#: Parameter types the endpoint reads in the binary format (and so may describe a
#: parameter as: clients that ask, asyncpg, then send values in that format).
BINARY_PARAMETER_OIDS = frozenset(_BINARY_DECODERS) | {25, 1700}


#: A statement's text cut around its ``$n``: pieces of text, and ``(index, length)`` of each
#: parameter (its 0-based index, and how many characters ``$n`` takes).
Slots = tuple[str | tuple[int, int], ...]


def parameter_slots(text: str) -> Slots:
    """``text`` cut around the ``$n`` of its code (not those in literals, quoted identifiers
    or comments): what :func:`bind_parameters` fills, cut once per prepared statement."""
    out: list[str | tuple[int, int]] = []
    for kind, start, end in code_segments(text):
        last = start
        if kind == "code":
            for match in _PARAM.finditer(text, start, end):
                out.append(text[last : match.start()])
                out.append((int(match.group(1)) - 1, match.end() - match.start()))
                last = match.end()
        out.append(text[last:end])
    return tuple(piece for piece in out if piece != "")


def bind_parameters(
    text: str,
    values: Sequence[bytes | None],
    formats: Sequence[int],
    oids: Sequence[int],
    *,
    limits: PgLimits = _DEFAULT_LIMITS,
    max_chars: int = 100_000,
    slots: Slots | None = None,
) -> str:
    """``text`` with each ``$n`` replaced by the SQL literal of the n-th value (Bind's
    values, format codes and the statement's parameter type OIDs; 0 = unspecified), each
    value decoded when first named. The result is at most ``max_chars`` characters (the
    caller's ``SqlLimits.max_statement_chars``); see the module docstring for the rest.
    ``slots``: :func:`parameter_slots` of ``text``, when the caller keeps them."""
    if not values:
        return text
    if len(values) > limits.max_parameters:
        raise SqlLimitError(
            f"the Bind carries {len(values)} parameter values, more than "
            f"SPARKIQ_PG_MAX_PARAMETERS={limits.max_parameters}",
            code=ErrorCode.TOO_MANY_PARAMETERS,
        )
    literals: dict[int, str] = {}
    size = 0
    out: list[str] = []
    for slot in parameter_slots(text) if slots is None else slots:
        if isinstance(slot, str):
            out.append(slot)
            continue
        index, length = slot
        if not 0 <= index < len(values):
            raise SqlUnsupportedError(
                f"parameter ${index + 1} has no value ({len(values)} were bound)",
                code=ErrorCode.PARAMETERS,
            )
        value = literals.get(index)
        if value is None:
            oid = oids[index] if index < len(oids) else 0
            value = literals[index] = _bounded_literal(
                index, values[index], _format_of(formats, index), oid, limits
            )
        size += len(value) - length
        if size > max_chars - len(text):
            raise SqlLimitError(
                f"the statement with its parameters bound (as far as ${index + 1}) is longer "
                f"than SqlLimits.max_statement_chars={max_chars} characters "
                "(SPARKIQ_SQL_MAX_STATEMENT_CHARS)",
                code=ErrorCode.STATEMENT_TOO_LONG,
            )
        out.append(value)
    return "".join(out)


def _bounded_literal(index: int, value: bytes | None, fmt: int, oid: int, limits: PgLimits) -> str:
    """The literal of parameter ``$index+1``, or an error that names it."""
    name = f"parameter ${index + 1}"
    if value is not None and len(value) > limits.max_parameter_chars:
        raise SqlLimitError(
            f"{name} is {len(value)} bytes, more than "
            f"SPARKIQ_PG_MAX_PARAMETER_CHARS={limits.max_parameter_chars}",
            code=ErrorCode.PARAMETER_TOO_LARGE,
        )
    try:
        out = _literal(value, fmt, oid, limits)
    except SqlLimitError as exc:
        raise SqlLimitError(f"{name}: {exc.message}", code=exc.code) from None
    except (_Invalid, struct.error, ValueError, OverflowError) as exc:
        # struct.error: a fixed-size type of the wrong length; ValueError, OverflowError: a
        # date or timestamp out of Python's range, or bytes that are not UTF-8.
        reason = str(exc) if isinstance(exc, _Invalid) else "it cannot be read as its type"
        raise SqlError(
            f"{name} is not a valid value of type OID {oid} in format {fmt}: {reason}",
            code=ErrorCode.INVALID_PARAMETER,
        ) from None
    if len(out) > limits.max_parameter_chars:  # quoting doubles quotes; numbers grow
        raise SqlLimitError(
            f"{name} is {len(out)} characters as a SQL literal, more than "
            f"SPARKIQ_PG_MAX_PARAMETER_CHARS={limits.max_parameter_chars}",
            code=ErrorCode.PARAMETER_TOO_LARGE,
        )
    return out


def _format_of(formats: Sequence[int], index: int) -> int:
    if not formats:
        return 0
    return formats[0] if len(formats) == 1 else formats[index]


def _quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _literal(value: bytes | None, fmt: int, oid: int, limits: PgLimits) -> str:
    if value is None:
        return "NULL"
    if fmt == 1:
        if oid == 1700:
            return _numeric(value, limits.max_numeric_digits)
        if oid in _BINARY_DECODERS:
            return _BINARY_DECODERS[oid](value)
        if oid in _TEXT_OIDS:
            return _quote(value.decode())
        raise SqlUnsupportedError(
            f"binary parameters of type OID {oid} are not supported; send it as text",
            code=ErrorCode.PARAMETERS,
        )
    text = value.decode()
    if oid in _NUMERIC_OIDS:
        try:
            Decimal(text)
        except ArithmeticError:
            raise SqlUnsupportedError(
                f"parameter {text!r} is not a number", code=ErrorCode.PARAMETERS
            ) from None
        return text
    if oid in ARRAY_ELEMENTS:  # a list of values for a catalog query's ANY(...)
        return array_parameter(text, oid)
    if oid == 16:
        return "TRUE" if text.lower() in ("t", "true", "1", "yes", "on") else "FALSE"
    return _quote(text)
