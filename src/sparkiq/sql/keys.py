"""Key and window predicates to store accesses: point lookups or one encoded key range.

Given the :class:`~sparkiq.sql.analyze.Term` values of one table and the literal values of
this execution, :func:`bind_access` chooses:

- **point lookups** when every key column is fixed by ``=`` / ``IN`` (at most
  ``max_lookups`` combinations): one ``KeyQuery`` (``WindowKeyQuery`` on a windowed table)
  per key, each answered by its key's partition only;
- otherwise a **key range** ``[lower, upper)`` of encoded store keys: the leading key
  columns fixed by ``=`` form a prefix and the next column's bounds (``<``, ``<=``, ``>``,
  ``>=``, ``BETWEEN``, or the smallest and largest ``IN`` value) narrow it. Encoded key
  order is the key's natural order, so exclusive ends are exact in bytes (``prefix_end``);
- window start bounds (from ``WINDOWSTART`` and ``WINDOWEND`` predicates), inclusive.

A literal that does not convert exactly to its key column's type is simply not pushed (its
value reads as :data:`NO_VALUE`): the query's full ``WHERE`` is always evaluated on what the
stores return, so accesses only ever narrow what is read, never what is answered.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal
from enum import Enum
from itertools import product
from typing import Any, Final

from sqlglot import exp

from sparkiq.errors import InvalidQueryError
from sparkiq.schema.arrowrows import WINDOWEND, WINDOWSTART
from sparkiq.schema.codec import KeyCodec, prefix_end
from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import DataType, TableSchema
from sparkiq.sql.analyze import Term

__all__ = ["NO_VALUE", "KeyAccess", "bind_access", "literal_value"]


#: Largest decimal exponent of a literal that may become a key value: no key type holds
#: more than 38 digits. Checked before any arithmetic, so ``1e99999999999`` costs nothing.
_MAX_EXPONENT = 80


class _Unusable(Enum):
    NO_VALUE = "no value"


#: What a literal that cannot be used as a key value reads as (the predicate stays a filter
#: only): a value of its own, never equal to any key value, so ``None`` stays a literal.
NO_VALUE: Final = _Unusable.NO_VALUE


@dataclass(frozen=True, slots=True)
class KeyAccess:
    """How one table is read: ``keys`` for point lookups (user-form keys), else a range of
    encoded keys ``[lower, upper)`` (None: open) and inclusive window-start bounds in
    internal microseconds. ``exact`` says every term was turned into the lookups.
    ``range_bounds``, set when the terms are only bounds on a one-column key, holds the
    tightest ``(user value, inclusive)`` lower and upper bounds: the range is then exactly
    the terms, answerable by a ``RangeQuery`` filtered for exclusive ends."""

    keys: tuple[Any, ...] | None = None
    lower: bytes | None = None
    upper: bytes | None = None
    window_from: int | None = None
    window_to: int | None = None
    exact: bool = True
    range_bounds: tuple[tuple[Any, bool] | None, tuple[Any, bool] | None] | None = None

    @property
    def is_lookup(self) -> bool:
        return self.keys is not None


FULL_SCAN = KeyAccess(exact=False)


def literal_value(node: exp.Expr, params: Sequence[Any]) -> Any:
    """The Python value of a literal-like node (see ``analyze.literal_like``), or
    :data:`NO_VALUE`."""
    if isinstance(node, exp.Placeholder):
        index = int(str(node.name)[2:])
        return params[index]
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Neg):
        value = literal_value(node.this, params)
        if isinstance(value, Decimal):
            return value.copy_negate()  # exact: no context, so no overflow
        if isinstance(value, int) and not isinstance(value, bool):
            return -value
        return NO_VALUE
    if isinstance(node, exp.Cast):
        value = literal_value(node.this, params)
        target = node.to.this
        if not isinstance(value, str):
            return NO_VALUE
        try:
            if target == exp.DataType.Type.DATE:
                return dt.date.fromisoformat(value)
            if target in (exp.DataType.Type.TIMESTAMP, exp.DataType.Type.TIMESTAMPNTZ):
                return dt.datetime.fromisoformat(value)
        except ValueError:
            return NO_VALUE
        return NO_VALUE
    if isinstance(node, exp.Literal):
        text = str(node.this)
        if node.is_string:
            return text
        try:
            return int(text)
        except ValueError:
            number = Decimal(text)
        if not number.is_finite() or abs(number.adjusted()) > _MAX_EXPONENT:
            return NO_VALUE  # no key column holds it; DuckDB's filter decides alone
        return number
    return NO_VALUE


def _typed(value: Any, dtype: DataType) -> Any:
    """A literal's value as a user key value of ``dtype``, or :data:`NO_VALUE`."""
    kind = KINDS.get(dtype.name)
    python = None if kind is None else kind.python
    if value is None or value is NO_VALUE or (isinstance(value, bool) and python is not bool):
        return NO_VALUE
    if python is str and isinstance(value, str):
        return value
    if python is int and isinstance(value, int):
        return value
    if python is bool and isinstance(value, bool):
        return value
    if python is Decimal and isinstance(value, int | Decimal):
        return value
    try:
        if python is dt.date:
            if isinstance(value, str):
                return dt.date.fromisoformat(value)
            if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
                return value
        if python is dt.datetime:
            if isinstance(value, str):
                return dt.datetime.fromisoformat(value)
            if isinstance(value, dt.datetime):
                return value
            if isinstance(value, dt.date):
                return dt.datetime(value.year, value.month, value.day)
    except ValueError:
        return NO_VALUE
    return NO_VALUE


def _window_micros(value: Any, schema: TableSchema) -> int | None:
    """A window start bound in internal microseconds; None when ``value`` is not one."""
    start_type, start = schema.window_start_type, schema.window_start
    assert start_type is not None and start is not None
    typed = _typed(value, start_type)
    return None if typed is NO_VALUE else start.to_internal(typed)


def _encode_prefix(codec: KeyCodec, width: int, internal: Sequence[Any]) -> bytes:
    """Encoding of the leading ``len(internal)`` key columns (each column's encoding is
    self-delimiting; a null column encodes as one byte, which is cut off again)."""
    padding = width - len(internal)
    encoded = codec.encode(tuple(internal) + (None,) * padding)
    return encoded[: len(encoded) - padding] if padding else encoded


def bind_access(
    schema: TableSchema,
    codec: KeyCodec,
    terms: Sequence[Term],
    params: Sequence[Any],
    max_lookups: int,
) -> KeyAccess:
    """The narrowest access the terms allow (see the module docstring)."""
    if not terms:
        return FULL_SCAN
    if len(terms) == 1 and terms[0].op == "=" and schema.window_column is None:
        term = terms[0]  # the lookup fast path: one key column, one value
        if len(schema.key_columns) == 1:
            try:
                value = _typed(
                    literal_value(term.values[0], params), schema.field(term.column).type
                )
                if value is NO_VALUE:
                    return KeyAccess(exact=False)
                codec.to_internal(value)
            except (IndexError, InvalidQueryError):
                return KeyAccess(exact=False)
            return KeyAccess((value,))
    columns = schema.key_columns
    width = len(columns)
    exact = True
    converted = True  # every key term's literals are values of its column
    sets: dict[str, list[Any]] = {}
    ranges: dict[str, list[tuple[str, Any]]] = {}
    window_from: int | None = None
    window_to: int | None = None
    for term in terms:
        try:
            if term.column in (WINDOWSTART, WINDOWEND):
                exact = converted = False
                found = [_window_micros(literal_value(v, params), schema) for v in term.values]
                micros = [m for m in found if m is not None]
                if len(micros) < len(found):
                    continue
                if term.column == WINDOWSTART and term.op in ("=", ">", ">=", "in"):
                    low = min(micros)
                    window_from = low if window_from is None else max(window_from, low)
                if term.op in ("=", "<", "<=", "in"):
                    high = max(micros)
                    window_to = high if window_to is None else min(window_to, high)
                continue
            dtype = schema.field(term.column).type
            values = [_typed(literal_value(v, params), dtype) for v in term.values]
        except (IndexError, OverflowError):
            exact = converted = False
            continue
        if any(v is NO_VALUE for v in values):
            exact = converted = False
            continue
        if term.op in ("=", "in"):
            previous = sets.get(term.column)
            sets[term.column] = values if previous is None else [v for v in previous if v in values]
        else:
            ranges.setdefault(term.column, []).append((term.op, values[0]))
            exact = False
    index = {c: i for i, c in enumerate(columns)}

    def internal(column: str, value: Any) -> Any:
        key = [None] * width
        key[index[column]] = value
        full = codec.to_internal(key[0] if width == 1 else tuple(key))
        return full[index[column]]

    try:
        fixed = [sets.get(c) for c in columns]
        if all(f is not None for f in fixed) and not ranges and schema.window_column is None:
            combos = 1
            for f in fixed:
                combos *= len(f or ())
            if combos <= max_lookups:
                keys = [
                    k[0] if width == 1 else tuple(k) for k in product(*(f or () for f in fixed))
                ]
                for key in keys:
                    codec.to_internal(key)
                return KeyAccess(tuple(dict.fromkeys(keys)), exact=exact)
        if all(f is not None for f in fixed) and schema.window_column is not None:
            combos = 1
            for f in fixed:
                combos *= len(f or ())
            if combos <= max_lookups:
                keys = [
                    k[0] if width == 1 else tuple(k) for k in product(*(f or () for f in fixed))
                ]
                for key in keys:
                    codec.to_internal(key)
                return KeyAccess(
                    tuple(dict.fromkeys(keys)),
                    window_from=window_from,
                    window_to=window_to,
                    exact=exact and window_from is None and window_to is None,
                )
        prefix: list[Any] = []
        lower: bytes | None = None
        upper: bytes | None = None
        low_value: tuple[Any, bool] | None = None  # (user value, inclusive)
        high_value: tuple[Any, bool] | None = None
        for column in columns:
            fixed_values = sets.get(column)
            if fixed_values is not None and len(fixed_values) == 1 and column not in ranges:
                prefix.append(internal(column, fixed_values[0]))
                continue
            bounds: list[tuple[str, Any]] = list(ranges.get(column, ()))
            if fixed_values:
                encoded = sorted(
                    fixed_values,
                    key=lambda v: _encode_prefix(codec, width, [*prefix, internal(column, v)]),
                )
                bounds += [(">=", encoded[0]), ("<=", encoded[-1])]
            for op, value in bounds:
                enc = _encode_prefix(codec, width, [*prefix, internal(column, value)])
                if op in (">", ">="):
                    candidate = enc if op == ">=" else prefix_end(enc)
                    if lower is None or candidate > lower:
                        lower, low_value = candidate, (value, op == ">=")
                else:
                    candidate = prefix_end(enc) if op == "<=" else enc
                    if upper is None or candidate < upper:
                        upper, high_value = candidate, (value, op == "<=")
            break
        if prefix:
            enc = _encode_prefix(codec, width, prefix)
            lower = enc if lower is None else max(lower, enc)
            upper = prefix_end(enc) if upper is None else min(upper, prefix_end(enc))
    except InvalidQueryError:
        return KeyAccess(window_from=window_from, window_to=window_to, exact=False)
    bounds_only = converted and width == 1 and not sets and schema.window_column is None
    return KeyAccess(
        None,
        lower,
        upper,
        window_from,
        window_to,
        exact=False,
        range_bounds=(low_value, high_value) if bounds_only else None,
    )
