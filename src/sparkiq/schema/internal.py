"""Internal values: how every sparkiq layer holds a key value, and PySpark's formulas to and
from the Python values users pass and receive.

Between validation and encoding (and in the partitioner, which hashes the same values as
Spark), a key is a tuple with one *internal* value per key column:

=========================================  ===============================================
Spark type                                 internal value
=========================================  ===============================================
string                                     ``str``
binary                                     ``bytes``
byte / short / integer / long              ``int``
boolean                                    ``bool``
float / double                             ``float`` (float keys rounded to float32;
                                           ``-0.0`` normalized to ``0.0``)
date                                       ``int`` days since 1970-01-01
timestamp / timestamp_ntz                  ``int`` microseconds since the epoch
decimal(p, s)                              ``int`` unscaled value (value * 10**s)
(any, null)                                ``None``
=========================================  ===============================================

The *checkers* below turn a user's Python value into its internal value and reject anything
else with advice; :class:`~sparkiq.schema.kinds.Kind` names the checker of each key type and
the key codec builds one per key column, once per schema.
"""

from __future__ import annotations

import datetime as dt
import math
import numbers
import struct
import time
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NoReturn, Protocol

__all__ = [
    "Checker",
    "Reject",
    "TypeParams",
    "binary_checker",
    "boolean_checker",
    "date_checker",
    "decimal_checker",
    "float_checker",
    "int_checker",
    "string_checker",
    "timestamp_checker",
    "timestamp_ntz_checker",
    "date_from_internal",
    "date_to_internal",
    "decimal_from_internal",
    "decimal_unscaled",
    "MAX_DECIMAL_DIGITS",
    "timestamp_from_internal",
    "timestamp_ntz_from_internal",
    "timestamp_ntz_to_internal",
    "timestamp_to_internal",
]

_EPOCH_ORDINAL = dt.date(1970, 1, 1).toordinal()
_EPOCH = dt.datetime(1970, 1, 1)
_NO_OFFSET = dt.timedelta(0)
_ONE_US = dt.timedelta(microseconds=1)
_FLOAT32 = struct.Struct("<f")


class TypeParams(Protocol):
    """What a converter needs of a column's type (a :class:`~sparkiq.schema.types.DataType`)."""

    @property
    def name(self) -> str: ...

    @property
    def precision(self) -> int: ...

    @property
    def scale(self) -> int: ...


#: ``reject(value, advice)`` raises the caller's error for a value that does not fit.
Reject = Callable[[Any, str], NoReturn]
#: Builds, once per column, the function from a user value to its internal value.
Checker = Callable[[TypeParams, Reject], Callable[[Any], Any]]


# --- Conversions between Python values and internal values (PySpark's own formulas) --------


def date_to_internal(value: dt.date) -> int:
    """Days since 1970-01-01, as PySpark's ``DateType.toInternal``."""
    return value.toordinal() - _EPOCH_ORDINAL


def date_from_internal(days: int) -> dt.date:
    return dt.date.fromordinal(days + _EPOCH_ORDINAL)


def timestamp_to_internal(value: dt.datetime) -> int:
    """Microseconds since the epoch, as PySpark's ``TimestampType.toInternal``.

    A naive datetime is *local* time (the process's ``TZ``); an aware one is converted to UTC.
    """
    if value.tzinfo is not None:
        # timedelta arithmetic, exact: utctimetuple() fails where the instant's UTC date
        # leaves datetime's range (year 1 at +14:00 is year 0 in UTC)
        offset = value.utcoffset() or _NO_OFFSET
        return (value.replace(tzinfo=None) - _EPOCH - offset) // _ONE_US
    seconds = time.mktime(value.timetuple())
    return int(seconds) * 1_000_000 + value.microsecond


def timestamp_from_internal(micros: int) -> dt.datetime:
    """A naive *local* datetime, exactly as PySpark's ``TimestampType.fromInternal``."""
    return dt.datetime.fromtimestamp(micros // 1_000_000).replace(microsecond=micros % 1_000_000)


def timestamp_ntz_to_internal(value: dt.datetime) -> int:
    """The wall clock of a datetime as microseconds since 1970-01-01 00:00 (a time zone is
    ignored, as PySpark's ``TimestampNTZType.toInternal`` does)."""
    return (value.replace(tzinfo=None) - _EPOCH) // _ONE_US


def timestamp_ntz_from_internal(micros: int) -> dt.datetime:
    return _EPOCH + dt.timedelta(microseconds=micros)


#: Spark's largest decimal precision (``DecimalType.MAX_PRECISION``).
MAX_DECIMAL_DIGITS = 38


def decimal_unscaled(
    value: Decimal, scale: int, max_digits: int = MAX_DECIMAL_DIGITS
) -> int | None:
    """``value * 10**scale`` as an exact int, or None if that is not an integer (or NaN/inf).

    Raises :class:`OverflowError` when the result would have more than ``max_digits`` digits.
    Both are decided from the digit count and the exponent *before* any arithmetic: a key
    like ``1e30000000`` arrives from the network, and ``10**30000000`` would hold the GIL
    for a minute. Integer arithmetic on the digits: ``Decimal.scaleb`` would round to the
    context's 28 digits, and Spark decimals have up to 38.
    """
    sign, digits, exponent = value.as_tuple()
    if not isinstance(exponent, int):
        return None
    significant = len(digits)
    while significant and digits[significant - 1] == 0:
        significant -= 1  # trailing zeros move into the exponent
    if not significant:
        return 0  # zero, whatever its exponent
    shift = exponent + len(digits) - significant + scale
    if shift < 0:
        return None  # the last significant digit is not zero, so this is no integer
    if significant + shift > max_digits:
        raise OverflowError(f"more than {max_digits} digits")
    unscaled: int = int("".join(map(str, digits[:significant]))) * 10**shift
    return -unscaled if sign else unscaled


def decimal_from_internal(unscaled: int, scale: int) -> Decimal:
    """A Decimal with exactly ``scale`` fractional digits (string parsing is exact)."""
    return Decimal(f"{unscaled}E{-scale}")


# --- Checkers: user values to internal values ---------------------------------------------


def _as_int(value: Any) -> int | None:
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)  # numpy integers
    return None


def string_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    def check_string(value: Any) -> Any:
        if value is None or (type(value) is str and value.isascii()):
            return value
        if not isinstance(value, str):
            reject(value, "pass a str")
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            reject(value, "pass a str without lone surrogates (it must encode as UTF-8)")
        return str(value)

    return check_string


def int_checker(bits: int) -> Checker:
    """The checker of a signed integer type of ``bits`` bits."""
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1

    def checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
        def check_int(value: Any) -> Any:
            if value is None:
                return None
            number = _as_int(value)
            if number is None:
                reject(value, "pass an int")
            if not low <= number <= high:
                reject(value, f"outside [{low}, {high}]; pass an int in that range")
            return number

        return check_int

    return checker


def boolean_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    def check_bool(value: Any) -> Any:
        if value is None or isinstance(value, bool):
            return value
        reject(value, "pass True or False")

    return check_bool


def float_checker(bits: int) -> Checker:
    """The checker of a float (``bits=32``) or double (64) type."""
    narrow = bits == 32

    def checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
        def check_float(value: Any) -> Any:
            if value is None:
                return None
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                reject(value, "pass a float or an int")
            try:
                number = float(value)
                if narrow and not math.isinf(number):
                    # a FloatType column holds float32 values: match what Spark stores
                    number = _FLOAT32.unpack(_FLOAT32.pack(number))[0]
            except OverflowError:
                reject(value, f"outside the range of {dtype.name}; pass a smaller number")
            if number != number:
                return math.nan
            return number + 0.0  # -0.0 -> 0.0, as Spark normalizes keys

        return check_float

    return checker


def date_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    def check_date(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dt.date) or isinstance(value, dt.datetime):
            reject(value, "pass a datetime.date (not a datetime)")
        return date_to_internal(value)

    return check_date


def timestamp_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    def check_timestamp(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            reject(value, "pass a datetime.datetime (naive means local time)")
        try:
            return timestamp_to_internal(value)
        except (OverflowError, ValueError) as exc:
            reject(value, f"cannot convert it ({exc}); pass a datetime in Spark's range")

    return check_timestamp


def timestamp_ntz_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    def check_timestamp_ntz(value: Any) -> Any:
        if value is None:
            return None
        if not isinstance(value, dt.datetime):
            reject(value, "pass a naive datetime.datetime")
        if value.tzinfo is not None:
            reject(value, "pass a naive datetime.datetime (timestamp_ntz has no time zone)")
        return timestamp_ntz_to_internal(value)

    return check_timestamp_ntz


def binary_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    def check_binary(value: Any) -> Any:
        if value is None or type(value) is bytes:
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            return bytes(value)
        reject(value, "pass bytes, bytearray or memoryview")

    return check_binary


def decimal_checker(dtype: TypeParams, reject: Reject) -> Callable[[Any], Any]:
    precision, scale = dtype.precision, dtype.scale
    limit = 10**precision
    largest = decimal_from_internal(limit - 1, scale)
    advice = (
        f"it needs more than {precision} digits ({precision - scale} before the point): "
        f"decimal({precision},{scale}) holds -{largest} to {largest}; pass a smaller value"
    )

    def check_decimal(value: Any) -> Any:
        if value is None:
            return None
        number = _as_int(value)
        if number is None and not isinstance(value, Decimal):
            reject(value, "pass a decimal.Decimal (e.g. Decimal('1.25')) or an int")
        if number is not None and number.bit_length() > 4 * precision:
            reject(value, advice)  # far out of range: no Decimal of a huge int
        try:
            unscaled = decimal_unscaled(
                value if number is None else Decimal(number), scale, precision
            )
        except OverflowError:
            reject(value, advice)
        if unscaled is None:
            reject(
                value,
                f"it has more than {scale} fractional digits (or is not finite); "
                "pass a Decimal rounded to the column's scale",
            )
        if abs(unscaled) >= limit:
            reject(value, advice)
        return unscaled

    return check_decimal
