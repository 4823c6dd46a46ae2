"""The pure-Python partitioner against Spark itself.

One DataFrame holds 10,000 random keys per supported type (with nulls and edge values) as
columns; Spark computes ``hash(col)`` and ``pmod(hash(col), P)`` for every column and a few
composite keys in a single job, and every row is compared with :mod:`sparkiq.schema.partitioner`.
Data goes in and out through Arrow, which keeps the module well under a minute on 2 cores.
Typed columns are built by Spark from plain ones (``timestamp_micros(long)``,
``cast(string as decimal(p,s))``...), so no Python-side time zone or rounding is involved.
"""

from __future__ import annotations

import decimal
import math
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest

from sparkiq.errors import ConfigError, InvalidQueryError
from sparkiq.schema.partitioner import Partitioner, partition_for, spark_hash
from sparkiq.schema.types import DataType, parse_type

ROWS = 10_000
PARTITION_COUNTS = (1, 7, 8, 200)
NULL_RATE = 0.05
_EXACT = decimal.Context(prec=100)


# --- random internal values --------------------------------------------------------------


def _random_text(rng: random.Random) -> str:
    ranges = [(0x20, 0x7E), (0x00, 0x7F), (0x80, 0x7FF), (0x800, 0xD7FF), (0xE000, 0xFFFF)]
    ranges.append((0x10000, 0x10FFFF))  # astral plane: 4 UTF-8 bytes, a surrogate pair in Java
    length = rng.choice([rng.randrange(0, 12), rng.randrange(0, 300)])
    chars = []
    for _ in range(length):
        low, high = rng.choice(ranges)
        chars.append(chr(rng.randint(low, high)))
    return "".join(chars)


def _random_ascii(rng: random.Random) -> str:
    """ASCII text, NUL included, of every length modulo 4 (the partitioner's fast path)."""
    return "".join(chr(rng.randrange(0, 0x80)) for _ in range(rng.randrange(0, 40)))


def _float32(bits: int) -> float:
    return float(struct.unpack("<f", struct.pack("<I", bits))[0])


def _narrow(value: float) -> float:
    """Java's (float) cast: round to float32, overflowing to infinity."""
    try:
        return float(struct.unpack("<f", struct.pack("<f", value))[0])
    except OverflowError:
        return math.copysign(math.inf, value)


def _float64(bits: int) -> float:
    return float(struct.unpack("<d", struct.pack("<Q", bits))[0])


def _random_float(rng: random.Random) -> float:
    pick = rng.random()
    if pick < 0.7:  # any float32 bit pattern: subnormals, NaN payloads, infinities
        return _float32(rng.getrandbits(32))
    if pick < 0.9:  # a double that Spark must narrow to float32 (rounding, underflow)
        return rng.uniform(-1e6, 1e6)
    return _float64(rng.getrandbits(64))  # often beyond float32's range: narrows to +-inf


def _int_range(bits: int) -> tuple[int, int]:
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _ints(bits: int) -> Callable[[random.Random], int]:
    low, high = _int_range(bits)
    near = min(high, 300)  # small values too, where most real keys are
    return lambda rng: rng.randint(low, high) if rng.random() < 0.8 else rng.randint(-near, near)


def _random_decimal(precision: int) -> Callable[[random.Random], int]:
    def draw(rng: random.Random) -> int:
        digits = rng.randint(1, precision)
        return rng.choice([-1, 1]) * rng.randrange(10 ** (digits - 1), 10**digits)

    return draw


def _decimal_edges(precision: int) -> list[Any]:
    top = 10**precision - 1
    edges = [0, 1, -1, 127, 128, -128, -129, 255, 256, -256, -257, 32767, -32768, top, -top]
    edges += [v for v in (2**31, -(2**31) - 1, 2**63 - 1, -(2**63), 2**63, 10**18) if abs(v) <= top]
    return edges


F32_EDGES = [0.0, -0.0, math.nan, math.inf, -math.inf, 1.0, -1.0, 0.1, 1e39, -1e39, 1e-50]
F32_EDGES += [-1e-50, 3.4028234663852886e38, 3.4028235677973366e38]
F32_EDGES += [_float32(b) for b in (1, 0x80000001, 0x007FFFFF, 0x00800000, 0x7F800001)]
F32_EDGES += [_float32(b) for b in (0xFFC00000, 0x7FC00001, 0xFFFFFFFF)]
F64_EDGES = [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, -5e-324, 2.2250738585072014e-308]
F64_EDGES += [1.7976931348623157e308, -1.7976931348623157e308, 0.1, -1.5]
F64_EDGES += [_float64(b) for b in (0x7FF0000000000001, 0xFFF8000000000000, 0x7FFFFFFFFFFFFFFF)]
STRING_EDGES = ["", "a", "ab", "abc", "abcd", "abcde", "\x00", "\u00e9", "\u20ac", "\U0001f600"]
STRING_EDGES += ["\U0010ffff", "x" * 1001, "\u00e9" * 333, "\U0001f600" * 77, "AA", "Spark"]
BINARY_EDGES = [b"", b"\x00", b"\x7f", b"\x80", b"\xff", b"\xff\xff\xff", b"\x80" * 7, b"ab" * 501]
MIN_DAY, MAX_DAY = -719_162, 2_932_896  # 0001-01-01 and 9999-12-31
MIN_MICROS, MAX_MICROS = -62_135_596_800_000_000, 253_402_300_799_999_999
TS_EDGES = [0, 1, -1, -999_999, -1_000_000, -1_000_001, MIN_MICROS, MAX_MICROS]
TS_EDGES += [-86_400_000_000 * 365 * 70 + 123_456, 1_700_000_000_123_456]


@dataclass(frozen=True)
class Case:
    """One key type: how to draw internal values and how Spark builds the typed column."""

    name: str
    type_name: str  # Spark JSON type name, as the partitioner receives it
    source: pa.DataType  # Arrow type of the column handed to createDataFrame
    draw: Callable[[random.Random], Any]
    edges: tuple[Any, ...] = ()
    to_source: Callable[[Any], Any] = lambda v: v
    build: str = "{c}"  # SQL building the typed column from the source column {c}
    back: str = "{c}"  # SQL recovering the internal value from the typed column {c}

    def values(self) -> list[Any]:
        rng = random.Random(f"sparkiq-partitioner-{self.name}")
        drawn = [None if rng.random() < NULL_RATE else self.draw(rng) for _ in range(ROWS)]
        values = [*self.edges, None, *drawn][:ROWS]
        rng.shuffle(values)
        return values


def _decimal_case(precision: int, scale: int) -> Case:
    def to_source(unscaled: int) -> str:
        return str(_EXACT.scaleb(decimal.Decimal(unscaled), -scale))

    return Case(
        name=f"decimal_{precision}_{scale}",
        type_name=f"decimal({precision},{scale})",
        source=pa.string(),
        draw=_random_decimal(precision),
        edges=tuple(_decimal_edges(precision)),
        to_source=to_source,
        build=f"cast({{c}} as decimal({precision},{scale}))",
    )


CASES = [
    Case("string", "string", pa.string(), _random_text, tuple(STRING_EDGES)),
    Case("ascii_string", "string", pa.string(), _random_ascii, ("", "a", "key-00000001")),
    Case(
        "binary",
        "binary",
        pa.binary(),
        lambda rng: rng.randbytes(rng.choice([rng.randrange(0, 9), rng.randrange(0, 200)])),
        tuple(BINARY_EDGES),
    ),
    Case("boolean", "boolean", pa.bool_(), lambda rng: rng.random() < 0.5, (True, False)),
    Case("byte", "byte", pa.int8(), _ints(8), (-128, 127, 0, -1)),
    Case("short", "short", pa.int16(), _ints(16), (-32768, 32767, 0, -1)),
    Case("integer", "integer", pa.int32(), _ints(32), (*_int_range(32), 0, -1, 1)),
    Case("long", "long", pa.int64(), _ints(64), (*_int_range(64), 0, -1, 2**32, -(2**32))),
    Case(
        "float",
        "float",
        pa.float64(),
        _random_float,
        tuple(F32_EDGES),
        build="cast({c} as float)",  # Spark narrows the double, as Java's (float) does
    ),
    Case(
        "double",
        "double",
        pa.float64(),
        lambda rng: _float64(rng.getrandbits(64)),
        tuple(F64_EDGES),
    ),
    Case(
        "date",
        "date",
        pa.int32(),
        lambda rng: rng.randint(MIN_DAY, MAX_DAY) if rng.random() < 0.8 else rng.randint(-99, 99),
        (0, -1, 1, MIN_DAY, MAX_DAY, *_int_range(32)),
        build="date_from_unix_date({c})",
        back="unix_date({c})",
    ),
    Case(
        "timestamp",
        "timestamp",
        pa.int64(),
        lambda rng: rng.randint(MIN_MICROS, MAX_MICROS),
        (*TS_EDGES, *_int_range(64)),
        build="timestamp_micros({c})",
        back="unix_micros({c})",
    ),
    Case(
        "timestamp_ntz",
        "timestamp_ntz",
        pa.int64(),
        lambda rng: rng.randint(MIN_MICROS, MAX_MICROS),
        tuple(TS_EDGES),
        # The session time zone is UTC (conftest), so this cast keeps the wall-clock micros.
        build="cast(timestamp_micros({c}) as timestamp_ntz)",
        back="unix_micros(cast({c} as timestamp))",
    ),
    _decimal_case(5, 2),
    _decimal_case(18, 6),
    _decimal_case(19, 0),
    _decimal_case(38, 10),
    _decimal_case(38, 0),
]
CASES_BY_NAME = {case.name: case for case in CASES}
COMPOSITES = [
    ("string", "long", "decimal_38_10"),
    ("date", "boolean", "double"),
    ("binary", "timestamp", "decimal_5_2"),
    ("float", "short", "string"),
]


def _composite_name(columns: tuple[str, ...]) -> str:
    return "__".join(columns)


@dataclass(frozen=True)
class SparkRun:
    values: dict[str, list[Any]]  # internal values per case, by row index
    results: dict[str, list[Any]]  # what Spark computed, per output column, by row index
    typed: Any  # the DataFrame of typed key columns plus "idx"


@pytest.fixture(scope="module")
def spark_run(spark: Any) -> SparkRun:
    from pyspark.sql import functions as F

    values = {case.name: case.values() for case in CASES}
    source = pa.table(
        {
            "idx": pa.array(range(ROWS), pa.int32()),
            **{
                case.name: pa.array(
                    [None if v is None else case.to_source(v) for v in values[case.name]],
                    case.source,
                )
                for case in CASES
            },
        }
    )
    typed = spark.createDataFrame(source).select(
        "idx", *(F.expr(case.build.format(c=case.name)).alias(case.name) for case in CASES)
    )

    exprs = [F.col("idx")]
    for columns in [*((case.name,) for case in CASES), *COMPOSITES]:
        name = _composite_name(columns)
        hashed = F.hash(*columns)
        exprs.append(hashed.alias(f"{name}__hash"))
        exprs += [F.pmod(hashed, F.lit(p)).alias(f"{name}__pmod{p}") for p in PARTITION_COUNTS]
    exprs += [F.expr(case.back.format(c=case.name)).alias(f"{case.name}__back") for case in CASES]
    # Over the rows as they came (a LocalRelation), Spark's optimizer would compute the whole
    # projection itself, row by row, through its interpreted projection (the tests' sessions
    # generate no code), whose cost grows with the square of the 129 columns: 10,000 rows
    # took seconds there. Shuffled first, the rows go through the executors' projection.
    results = typed.repartition(2).select(*exprs).toArrow().sort_by("idx").to_pydict()
    assert results["idx"] == list(range(ROWS))
    return SparkRun(values, results, typed)


def _same_internal(case: Case, internal: Any, back: Any) -> bool:
    """Whether Spark's column holds the internal value we meant to give it."""
    if internal is None or back is None:
        return internal is None and back is None
    if case.type_name == "float":
        return math.isnan(back) if math.isnan(internal) else back == _narrow(internal)
    if case.type_name == "double":
        return math.isnan(back) if math.isnan(internal) else back == internal
    if case.type_name.startswith("decimal"):
        return int(_EXACT.scaleb(back, parse_type(case.type_name).scale)) == internal
    return bool(back == internal)


def _assert_rows_match(run: SparkRun, columns: tuple[str, ...]) -> None:
    types = [CASES_BY_NAME[c].type_name for c in columns]
    name = _composite_name(columns)
    spark_columns = [f"{name}__hash", *(f"{name}__pmod{p}" for p in PARTITION_COUNTS)]
    keys = zip(*(run.values[c] for c in columns), strict=True)
    wants = zip(*(run.results[c] for c in spark_columns), strict=True)
    mismatches = []
    for key, want in zip(keys, wants, strict=True):
        got = (spark_hash(key, types), *(partition_for(key, types, p) for p in PARTITION_COUNTS))
        if got != want:
            mismatches.append((key, got, want))
    assert not mismatches, f"{len(mismatches)} of {ROWS} keys differ; first: {mismatches[:3]}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_single_column_hash_and_partition_equal_spark(spark_run: SparkRun, case: Case) -> None:
    column_type = spark_run.typed.schema[case.name].dataType.jsonValue()
    assert column_type == parse_type(case.type_name).to_json()
    values = spark_run.values[case.name]
    assert values.count(None) > ROWS * NULL_RATE / 2
    backs = spark_run.results[f"{case.name}__back"]
    wrong = [(v, b) for v, b in zip(values, backs, strict=True) if not _same_internal(case, v, b)]
    assert not wrong, f"Spark holds other values than intended: {wrong[:3]}"
    _assert_rows_match(spark_run, (case.name,))


@pytest.mark.parametrize("columns", COMPOSITES, ids=_composite_name)
def test_composite_hash_and_partition_equal_spark(
    spark_run: SparkRun, columns: tuple[str, ...]
) -> None:
    nulls = sum(any(spark_run.values[c][i] is None for c in columns) for i in range(ROWS))
    assert nulls > ROWS * NULL_RATE
    _assert_rows_match(spark_run, columns)


@pytest.mark.parametrize("columns", [("string",), ("integer", "decimal_19_0", "timestamp")])
def test_repartition_puts_each_row_in_the_computed_partition(
    spark_run: SparkRun, columns: tuple[str, ...]
) -> None:
    from pyspark.sql import functions as F

    partitions = 7
    placed = (
        spark_run.typed.repartition(partitions, *columns)
        .select("idx", F.spark_partition_id().alias("pid"))
        .toArrow()
        .sort_by("idx")
    )
    partitioner = Partitioner([CASES_BY_NAME[c].type_name for c in columns], partitions)
    expected = [
        partitioner(key) for key in zip(*(spark_run.values[c] for c in columns), strict=True)
    ]
    assert placed.column("idx").to_pylist() == list(range(ROWS))
    assert placed.column("pid").to_pylist() == expected
    assert len(set(expected)) == partitions


# --- without Spark -----------------------------------------------------------------------


def test_null_leaves_the_running_hash_unchanged() -> None:
    assert spark_hash([None], ["string"]) == 42
    assert spark_hash([None, None], ["long", "binary"]) == 42
    assert spark_hash(["k", None], ["string", "integer"]) == spark_hash(["k"], ["string"])
    assert partition_for([None], ["string"], 7) == 42 % 7


def test_type_names_and_data_types_agree() -> None:
    key = ["Ab\u00e9\U0001f600", 12345, 10**30 + 7]
    names = ["string", "long", "decimal(38,4)"]
    types = [parse_type(n) for n in names]
    assert spark_hash(key, names) == spark_hash(key, types) == spark_hash(key, tuple(names))
    assert partition_for(key, names, 200) == Partitioner(types, 200)(key)
    assert Partitioner(types, 200).hash(key) == spark_hash(key, names)


def test_partitioner_is_an_immutable_value() -> None:
    first, second = Partitioner(("string", "decimal(5,2)"), 8), Partitioner(["string"], 8)
    assert first == Partitioner([DataType("string"), "decimal(5,2)"], 8)
    assert first != second and hash(first) == hash(Partitioner(("string", "decimal(5,2)"), 8))
    assert first.types == (DataType("string"), DataType("decimal", precision=5, scale=2))
    assert first.partitions == 8
    assert repr(first) == "Partitioner(types=[string, decimal(5,2)], partitions=8)"
    with pytest.raises(AttributeError):
        first.partitions = 9  # type: ignore[misc]


def test_float_and_double_canonicalize_zero_and_nan() -> None:
    nan_payload = _float32(0xFFC00123)
    assert spark_hash([-0.0], ["float"]) == spark_hash([0.0], ["float"])
    assert spark_hash([-1e-50], ["float"]) == spark_hash([0.0], ["float"])  # narrows to -0.0f
    assert spark_hash([nan_payload], ["float"]) == spark_hash([math.nan], ["float"])
    assert spark_hash([-0.0], ["double"]) == spark_hash([0.0], ["double"])
    assert spark_hash([_float64(0xFFF0000000000001)], ["double"]) == spark_hash(
        [math.nan], ["double"]
    )
    assert spark_hash([1e39], ["float"]) == spark_hash([math.inf], ["float"])


@pytest.mark.parametrize(
    "bad_type",
    [
        "array",
        "interval",
        "string collate UTF8_LCASE",
        "decimal(39,2)",
        DataType("struct"),
        {"type": "map", "keyType": "string", "valueType": "long"},
        17,
    ],
    ids=repr,
)
def test_a_type_that_cannot_be_a_key_is_rejected(bad_type: Any) -> None:
    with pytest.raises(InvalidQueryError, match=r"cannot be hashed|not a valid|neither"):
        spark_hash(["x"], [bad_type])
    with pytest.raises(InvalidQueryError):
        Partitioner([bad_type], 4)
    with pytest.raises(InvalidQueryError):
        partition_for(["x"], [bad_type], 4)


def test_collated_string_error_says_why() -> None:
    with pytest.raises(InvalidQueryError, match="UTF8_BINARY collation"):
        Partitioner(["string collate UNICODE_CI"], 4)


@pytest.mark.parametrize("values", [[], ["a"], ["a", 1, 2]], ids=["none", "fewer", "more"])
def test_arity_mismatch_is_rejected(values: list[Any]) -> None:
    with pytest.raises(InvalidQueryError, match=r"value\(s\) but 2 key column.*one value per"):
        partition_for(values, ["string", "long"], 4)
    with pytest.raises(InvalidQueryError, match="one value per column"):
        spark_hash(values, ["string", "long"])


def test_no_key_columns_is_rejected() -> None:
    with pytest.raises(InvalidQueryError, match="at least one column"):
        Partitioner([], 4)


@pytest.mark.parametrize("partitions", [0, -3, True, 1.5, "8", None])
def test_partitions_must_be_a_positive_int(partitions: Any) -> None:
    with pytest.raises(ConfigError, match="positive int"):
        Partitioner(["string"], partitions)
    with pytest.raises(ConfigError, match="positive int"):
        partition_for(["a"], ["string"], partitions)


def test_partition_for_caches_by_type_of_partitions() -> None:
    assert partition_for(["a"], ["string"], 1) == 0
    with pytest.raises(ConfigError):  # True == 1, but a bool is not a partition count
        partition_for(["a"], ["string"], True)


@pytest.mark.parametrize(
    ("type_name", "value"),
    [
        ("string", b"bytes"),
        ("string", 5),
        ("string", "\ud800"),  # a lone surrogate has no UTF-8 form
        ("binary", "text"),
        ("binary", ""),
        ("integer", 2**31),
        ("byte", -129),
        ("long", 2**63),
        ("integer", 1.0),
        ("integer", True),
        ("boolean", 1),
        ("float", "1.0"),
        ("double", True),
        ("date", "2024-01-01"),
        ("decimal(5,2)", 100_000),
        ("decimal(38,2)", -(10**38)),
        ("decimal(38,2)", 1.5),
    ],
)
def test_a_value_its_column_cannot_hold_is_rejected(type_name: str, value: Any) -> None:
    with pytest.raises(InvalidQueryError, match=r"key column 1 has type .*expected .* got"):
        spark_hash(["ok", value], ["string", type_name])
