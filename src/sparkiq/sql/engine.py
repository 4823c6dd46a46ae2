"""The SQL pull query engine: plan caching, the Python fast path, DuckDB execution, paging.

``SqlEngine(source).execute(text)``:

1. **Plan lookup.** Plans are cached by exact text and, for key lookups, by *shape* (the
   text with literals replaced by placeholders): ``SELECT * FROM t WHERE k = 'x'`` and
   ``... k = 'y'`` share one plan, so a lookup pays a regular-expression scan, not a parse.
2. **Fast path.** A single-table statement whose ``WHERE`` fixes every key column with
   ``=``/``IN`` and whose select list is only columns runs as ``KeyQuery`` (or
   ``WindowKeyQuery``) requests with the projection done in Python: no DuckDB.
3. **Columnar path.** When the source hosts every table the statement scans
   (:class:`~sparkiq.sql.source.ColumnarSource`: a node hosting them all), each table is its
   partitions' Arrow versions at one batch, handed to DuckDB without copying behind a CTE
   that keeps the rows valid at that batch, and the statement runs as one DuckDB query.
4. **General path.** Otherwise each table reference is one request of a
   :class:`~sparkiq.sql.fragment.SqlFragmentQuery` (exact keys, as on the columnar path, or a
   key range; pushed filter, top-N or partial aggregate) each partition answers as Arrow, and
   the final query runs in DuckDB over the concatenated Arrow results.

The engine is thread-safe: DuckDB connections are per thread and caches are replaced, not
mutated in place, under a lock.
"""

from __future__ import annotations

import datetime as dt
import re
import threading
import time
from collections import OrderedDict
from typing import Any

import pyarrow as pa
from sqlglot import exp

from sparkiq.error_codes import ErrorCode
from sparkiq.errors import InvalidQueryError
from sparkiq.principals import check_read
from sparkiq.query.position import Position, PositionBound
from sparkiq.schema.arrowrows import KEY_COLUMN, ArrowRows
from sparkiq.schema.codec import KeyCodec
from sparkiq.schema.partitioner import Partitioner
from sparkiq.schema.types import TableSchema
from sparkiq.sql.analyze import analyze
from sparkiq.sql.duck import DuckPool, run
from sparkiq.sql.errors import SqlError, SqlLimitError, SqlUnsupportedError, locate
from sparkiq.sql.explain import explain_plan, explain_rows
from sparkiq.sql.keys import KeyAccess, bind_access
from sparkiq.sql.limits import SqlLimits
from sparkiq.sql.paging import PageToken, Reading
from sparkiq.sql.parse import DIALECT, parse, shape_of
from sparkiq.sql.plan import (
    Plan,
    TablePlan,
    build_plan,
    digest_of,
    key_page_queries,
    literal_int,
    with_versions,
)
from sparkiq.sql.reader import NotHere, batch_of, lookup_rows, range_rows, read_table
from sparkiq.sql.result import SqlResult
from sparkiq.sql.result_schema import DUCK_TYPE, from_duck, from_table, strings, zoned_timestamps
from sparkiq.sql.source import ColumnarSource, QuerySource, partitioner_of
from sparkiq.sql.template import bind_template, same_plan

__all__ = ["SqlEngine"]

_CACHE_SIZE = 512
# A shape template pays off for lookups of a few keys; binding one costs time quadratic in
# its literals (sqlglot re-parents every sibling of a replaced node), and a statement with
# thousands (a long IN list) is not going to be repeated with other values anyway.
_TEMPLATE_LITERALS = 64
_CONNECTIVE = re.compile(r"\b(?:and|or)\b", re.IGNORECASE)  # counted, not parsed: no groups
_UNBOUNDED = PositionBound.unbounded()
_NOTHING = pa.schema([])


class SqlEngine:
    """Runs SQL pull queries over ``source`` (a :class:`~sparkiq.sql.source.QuerySource`,
    e.g. a :class:`~sparkiq.Node`) within ``limits``."""

    def __init__(self, source: QuerySource, limits: SqlLimits | None = None) -> None:
        self.source = source
        # decided once: isinstance against a runtime Protocol costs microseconds a call
        self._columnar_source = source if isinstance(source, ColumnarSource) else None
        self.limits = limits if limits is not None else SqlLimits()
        self._pool = DuckPool.for_limits(self.limits)
        self._lock = threading.Lock()
        self._by_text: OrderedDict[str, Plan] = OrderedDict()
        self._by_shape: dict[str, Plan | None] = {}
        self._codecs: dict[str, tuple[TableSchema, KeyCodec, Partitioner]] = {}
        self._columnar_texts: dict[tuple[Any, ...], str] = {}
        # result schemas of Python lookups, by table and projection (with the table
        # schema each was made for); a DuckDB plan keeps its own (Plan.result_schema)
        self._lookup_schemas: dict[tuple[Any, ...], tuple[TableSchema, pa.Schema]] = {}

    # -- planning ------------------------------------------------------------------------

    def _codec(self, table: str) -> tuple[TableSchema, KeyCodec, Partitioner]:
        schema = self.source.schema(table)
        found = self._codecs.get(table)
        if found is None or found[0] is not schema:
            found = (schema, KeyCodec(schema), partitioner_of(self.source, table, schema))
            self._codecs[table] = found
        return found

    def _plan(
        self, text: str, shaped: tuple[str, tuple[Any, ...]] | None = None
    ) -> tuple[Plan, tuple[Any, ...], bool]:
        """``(plan, literal values, is_template)`` for ``text`` (``shaped``: its
        :func:`shape_of`, when the caller has it already)."""
        plan = self._by_text.get(text)
        if plan is not None:
            return plan, (), False
        self.limits.check_statement(text)  # before the shape regex reads it
        if shaped is None:
            shaped = shape_of(text)
        terms = (len(shaped[1]) if shaped is not None else 0) + sum(
            1 for _ in _CONNECTIVE.finditer(text)
        )
        if terms > self.limits.max_terms:
            raise SqlLimitError(
                f"the statement holds {terms} literal values and AND/OR terms, more than "
                f"SqlLimits.max_terms={self.limits.max_terms}; split a long IN list or "
                "OR chain into several statements, or select a key range",
                code=ErrorCode.TOO_MANY_TERMS,
            )
        if shaped is not None:
            template = self._by_shape.get(shaped[0])
            if template is not None:
                return template, shaped[1], True
        plan = self._full_plan(text)
        if (
            shaped is not None
            and len(shaped[1]) <= _TEMPLATE_LITERALS
            and shaped[0] not in self._by_shape
        ):
            self._remember_shape(shaped[0], shaped[1], plan)
        return plan, (), False

    def _full_plan(self, text: str) -> Plan:
        parsed = parse(text)
        analysis = analyze(parsed, self.source, self.source.tables)
        plan = build_plan(analysis)
        if plan.python is None or analysis.aggregate:
            try:  # binds the statement: its errors come before any read
                names, types, described = self._dry_run(plan)
            except SqlError as error:
                raise locate(error, parsed) from None
            if analysis.aggregate:  # its final query reads partial aggregates
                plan = build_plan(analysis, names, types)
            plan.result_schema = self._typed(plan, described)
        with self._lock:
            self._by_text[text] = plan
            if len(self._by_text) > _CACHE_SIZE:
                self._by_text.popitem(last=False)
        return plan

    def _dry_run(self, plan: Plan) -> tuple[list[str], list[str], pa.Schema]:
        """Run the final query over empty relations: DuckDB resolves every name and type.
        Returns the names, DuckDB's type names and the Arrow schema of the result."""
        empty = {
            t.relation: ArrowRows(self.source.schema(t.name), t.columns).out_schema.empty_table()
            for t in plan.tables
        }
        names, table = run(
            self._pool, plan.final_sql, empty, timeout=self.limits.timeout_seconds, arrow=True
        )
        types = [(f.metadata or {}).get(DUCK_TYPE, b"").decode() for f in table.schema]
        return names, types, table.schema

    def _typed(self, plan: Plan, described: pa.Schema) -> pa.Schema:
        zoned = zoned_timestamps(self.source.schema(t.name) for t in plan.tables)
        return from_duck(described, zoned)

    def _duck_schema(self, plan: Plan, holder: Plan) -> pa.Schema:
        """The result schema of a plan DuckDB runs (its final query's, paged or not),
        kept on ``holder`` (the plan, or the template it was bound from)."""
        found = holder.result_schema
        if found is None:  # a plan without a dry run (a lookup's), which binds
            found = holder.result_schema = self._typed(plan, self._dry_run(plan)[2])
        return found

    def _lookup_schema(self, table: str, schema: TableSchema, items: Any) -> pa.Schema:
        """The result schema of a lookup answered in Python."""
        key = (table, items)
        found = self._lookup_schemas.get(key)
        if found is None or found[0] is not schema:
            found = (schema, from_table(schema, items))
            with self._lock:
                if len(self._lookup_schemas) > _CACHE_SIZE:
                    self._lookup_schemas.clear()
                self._lookup_schemas[key] = found
        return found[1]

    def _remember_shape(self, shape: str, params: tuple[Any, ...], plan: Plan) -> None:
        """Keep a template for ``shape`` if binding it reproduces ``plan`` exactly."""
        template: Plan | None = None
        as_of = any(t.as_of is not None for t in plan.tables)
        if plan.aggregation is None and not plan.explain and params and not as_of:
            try:
                parsed = parse(shape, placeholders=True)
                candidate = build_plan(analyze(parsed, self.source, self.source.tables))
                if same_plan(bind_template(candidate, params, plan.text), plan):
                    template = candidate
            except (SqlError, TypeError, IndexError):
                template = None
        with self._lock:
            if len(self._by_shape) > _CACHE_SIZE:
                self._by_shape = {}
            self._by_shape[shape] = template

    # -- execution -----------------------------------------------------------------------

    def execute(
        self,
        text: str,
        *,
        bound: PositionBound | None = None,
        page_token: str | None = None,
        page_size: int | None = None,
    ) -> SqlResult:
        """Run one ``SELECT`` (or ``EXPLAIN SELECT``) and return its rows and position.

        ``bound`` applies to every partition read (monotonic reads, read-your-writes).
        ``page_size`` (at most ``SqlLimits.max_page_size``) returns at most that many rows
        and a ``next_page_token`` when more remain; pass the token back with the same
        statement. Raises :class:`~sparkiq.sql.errors.SqlError` subclasses.
        """
        if not isinstance(text, str):
            raise SqlError(f"the statement must be a str, got {type(text).__name__}")
        try:
            return self._execute(text, bound, page_token, page_size)
        except SqlError as error:
            if error.line is not None or not error.field:
                raise
            # found while reading or running (a value that does not convert): located in
            # the statement the user wrote, which parses again only on this path
            raise locate(error, parse(text)) from None

    def execute_here(self, text: str, *, page_size: int | None = None) -> SqlResult | None:
        """:meth:`execute`'s answer if at hand, else None (call :meth:`execute` on a thread):
        a cached plan (nothing to parse) run in Python as key lookups the source reads itself,
        unbounded, newest batch: nothing blocks. Errors answer None (:meth:`execute` says)."""
        if not isinstance(text, str) or len(text) > 4096:  # a lookup is far shorter
            return None
        shaped = None
        if text not in self._by_text:
            shaped = shape_of(text)
            if shaped is None or self._by_shape.get(shaped[0]) is None:
                return None
        try:
            return self._execute(text, None, None, page_size, here_only=True, shaped=shaped)
        except (SqlError, NotHere):
            return None

    def _execute(
        self,
        text: str,
        bound: PositionBound | None,
        page_token: str | None,
        page_size: int | None,
        *,
        here_only: bool = False,
        shaped: tuple[str, tuple[Any, ...]] | None = None,
    ) -> SqlResult:
        if bound is None:
            bound = _UNBOUNDED
        plan, params, template = self._plan(text, shaped)
        check_read(t.name for t in plan.tables)  # joins and subqueries included
        # A template's digest is its shape's; only a page token needs the statement's own
        # (a hash of the text: not worth computing for a key lookup that is not paged).
        paged = page_token is not None or page_size is not None
        digest = digest_of(text) if template and paged else plan.digest
        token = None
        if page_token is not None:
            token = PageToken.decode(page_token, digest)
            if page_size is None:
                page_size = self.limits.default_page_size
            bound = PositionBound.at(
                token.position if bound.position is None else bound.position.merge(token.position)
            )
        if page_size is not None and (
            isinstance(page_size, bool) or not isinstance(page_size, int) or page_size <= 0
        ):
            raise SqlError(
                f"page_size must be a positive int, got {page_size!r}", field="page_size"
            )
        if page_size is not None and page_size > self.limits.max_page_size:
            raise SqlLimitError(
                f"page_size {page_size} exceeds SqlLimits.max_page_size="
                f"{self.limits.max_page_size}",
                code=ErrorCode.PAGE_TOO_LARGE,
                field="page_size",
            )
        if plan.explain:
            if here_only:
                raise NotHere
            return self._explain(plan)
        deadline = time.monotonic() + self.limits.timeout_seconds
        reading = Reading(digest, token, page_size, self._as_of)
        if plan.python is not None:
            fast = self._python(plan, params, bound, reading, here_only)
            if fast is not None:
                return fast
        if here_only:
            raise NotHere
        holder = plan  # a template's result has one schema whatever its values
        if template:
            plan = bind_template(plan, params, text)
        return self._general(plan, holder, params, bound, reading, deadline)

    def _python(
        self, plan: Plan, args: tuple[Any, ...], bound: PositionBound, reading: Reading, here: bool
    ) -> SqlResult | None:
        table = plan.tables[0]
        if here and table.as_of is not None:  # AS OF TIMESTAMP looks up commit times
            raise NotHere
        schema, codec, _ = self._codec(table.name)
        access = bind_access(schema, codec, table.terms, args, self.limits.max_key_lookups)
        at_batch = reading.at_batch(table.name, table.as_of)
        if access.keys is not None and access.exact:
            rows, position, _ = lookup_rows(
                self.source, table.name, schema, access, bound, at_batch, here_only=here
            )
        elif here:
            raise NotHere
        elif access.range_bounds is not None and reading.page_size is None:
            rows, position = range_rows(self.source, table.name, access, bound, at_batch)
        else:
            return None
        reading.served(table.name, table.as_of, position, batch_of(table.name, position))
        projection = plan.python
        assert projection is not None
        items = projection.items
        typed = self._lookup_schema(table.name, schema, items)
        if projection.whole_rows:  # SELECT *: the decoded rows are fresh dicts already
            return self._page(typed, rows, reading)
        window = projection.window_column
        out: list[dict[str, Any]] = []
        for row in rows:
            shaped: dict[str, Any] = {}
            for name, column in items:
                if column == "WINDOWSTART" or column == "WINDOWEND":
                    member = row[window] if window is not None else None
                    key = "start" if column == "WINDOWSTART" else "end"
                    shaped[name] = None if member is None else member[key]
                else:
                    shaped[name] = row[column]
            out.append(shaped)
        return self._page(typed, out, reading)

    def _page(self, typed: pa.Schema, rows: list[dict[str, Any]], reading: Reading) -> SqlResult:
        """Offset paging over a fully computed result."""
        columns = typed.names
        position = reading.result_position()
        page_size = reading.page_size
        if page_size is None:
            self._check_size(len(rows))
            return SqlResult(columns, rows, position, schema=typed)
        start = reading.offset
        page = rows[start : start + page_size]
        more = start + page_size < len(rows)
        next_token = reading.next_offset_token(len(page)) if more else None
        return SqlResult(columns, page, position, next_token, schema=typed)

    def _check_size(self, count: int) -> None:
        if count > self.limits.max_result_rows:
            raise SqlLimitError(
                f"the result has more than SqlLimits.max_result_rows={self.limits.max_result_rows} "
                "rows; add a LIMIT, narrow the WHERE, or page with page_size=",
                code=ErrorCode.TOO_MANY_ROWS,
            )

    def _general(
        self,
        plan: Plan,
        holder: Plan,
        params: tuple[Any, ...],
        bound: PositionBound,
        reading: Reading,
        deadline: float,
    ) -> SqlResult:
        relations: dict[str, pa.Table] = {}
        accesses = [self._access(t, params) for t in plan.tables]
        token, page_size = reading.token, reading.page_size
        key_mode = (
            page_size is not None
            and plan.key_paging
            and accesses[0].keys is None
            and (token is None or token.mode == "key")
        )
        if not key_mode:
            whole = self._columnar(plan, holder, accesses, bound, reading, deadline)
            if whole is not None:
                return whole
        final = plan.final
        want = page_size or 0
        if key_mode:
            assert page_size is not None
            # key pages read the newest batch each: only AS OF pins a table
            reading = Reading(plan.digest, token, page_size, self._as_of, pin=False)
            final, fragment, access, want = key_page_queries(plan, accesses[0], page_size, token)
            if want <= 0:
                return SqlResult([], [], reading.result_position(), schema=_NOTHING)
            accesses = [access]
            fragments: list[str | None] = [fragment]
            columns = [(*plan.tables[0].columns, KEY_COLUMN)]
        else:
            fragments = [t.fragment_sql for t in plan.tables]
            columns = [t.columns for t in plan.tables]
        for table, access, fragment_sql, cols in zip(
            plan.tables, accesses, fragments, columns, strict=True
        ):
            read = read_table(
                self.source,
                table.name,
                self._codec(table.name),
                cols,
                fragment_sql,
                access,
                bound,
                _remaining(deadline),
                lookup_fragment=plan.aggregation == "partial",
                skip_below=0 if plan.aggregation == "partial" else self.limits.fragment_min_rows,
                at_batch=reading.at_batch(table.name, table.as_of),
            )
            reading.served(
                table.name, table.as_of, read.position, batch_of(table.name, read.position)
            )
            relations[table.relation] = read.table
        position = reading.result_position()
        if page_size is not None and not key_mode:
            final = (
                exp.select("*")
                .from_(final.subquery("__sq_page"))
                .limit(page_size + 1)
                .offset(reading.offset)
            )
        sql = final.sql(dialect=DIALECT) if final is not plan.final else plan.final_sql
        cap = self.limits.max_result_rows + 1 if page_size is None else None
        names, tuples = run(self._pool, sql, relations, timeout=_remaining(deadline), max_rows=cap)
        rows = [dict(zip(names, values, strict=True)) for values in tuples]
        typed = self._duck_schema(plan, holder)
        if page_size is None:
            self._check_size(len(rows))
            return SqlResult(names, rows, position, schema=typed)
        more = len(rows) > want if key_mode else len(rows) > page_size
        rows = rows[: want if key_mode else page_size]
        next_token = None
        if key_mode:
            returned = reading.offset + len(rows)
            limit = literal_int(plan.final, "limit")
            capped = isinstance(limit, int) and limit is not False and returned >= limit
            if more and rows and not capped:
                last = rows[-1][KEY_COLUMN]
                next_token = PageToken(plan.digest, "key", last, returned, position).encode()
            names = [n for n in names if n != KEY_COLUMN]
            for row in rows:
                row.pop(KEY_COLUMN, None)
        elif more:
            next_token = reading.next_offset_token(len(rows))
        return SqlResult(names, rows, position, next_token, schema=typed)

    def _columnar(
        self,
        plan: Plan,
        holder: Plan,
        accesses: list[KeyAccess],
        bound: PositionBound,
        reading: Reading,
        deadline: float,
    ) -> SqlResult | None:
        """The statement as one DuckDB query over whole tables read here, or None when a
        table cannot be read here (the general path then reads it per partition)."""
        source = self._columnar_source
        if plan.whole is None or source is None:
            return None
        relations: dict[str, pa.Table] = {}
        versions: dict[str, tuple[str, tuple[str, ...], int]] = {}
        before = reading.saved()
        for index, (table, access) in enumerate(zip(plan.tables, accesses, strict=True)):
            at_batch = reading.at_batch(table.name, table.as_of)
            if access.keys is not None:  # one request: each partition's keys as Arrow
                read = read_table(
                    self.source, table.name, self._codec(table.name), table.columns, None,
                    access, bound, _remaining(deadline), at_batch=at_batch,
                )  # fmt: skip
                relations[table.relation], read_at = read.table, read.position
                served = batch_of(table.name, read_at)
            else:
                local = source.local_rows(table.name, at_batch, bound)
                if local is None:
                    reading.restore(before)  # the general path reads every table anew
                    return None
                relations[f"__sq_v{index}"] = local.raw
                versions[table.relation] = (f"__sq_v{index}", table.columns, local.batch_id)
                read_at, served = local.position, local.batch_id
            reading.served(table.name, table.as_of, read_at, served)
        position = reading.result_position()
        page_size = reading.page_size
        offset = None if page_size is None else reading.offset
        sql = self._columnar_sql(plan, tuple(versions), page_size, offset)
        params = {f"sq_b{relation[len('__sq_r') :]}": b for relation, (_, _, b) in versions.items()}
        cap = self.limits.max_result_rows + 1 if page_size is None else None
        names, tuples = run(
            self._pool, sql, relations, timeout=_remaining(deadline), max_rows=cap, params=params
        )
        rows = [dict(zip(names, values, strict=True)) for values in tuples]
        typed = self._duck_schema(plan, holder)
        if page_size is None:
            self._check_size(len(rows))
            return SqlResult(names, rows, position, schema=typed)
        next_token = None
        if len(rows) > page_size:
            rows = rows[:page_size]
            next_token = reading.next_offset_token(len(rows))
        return SqlResult(names, rows, position, next_token, schema=typed)

    def _as_of(self, table: str, as_of: object) -> int | None:
        """The batch a table reference's ``AS OF`` names (None: no AS OF)."""
        if as_of is None or isinstance(as_of, int):
            return as_of
        source = self._columnar_source
        if not isinstance(as_of, dt.datetime) or source is None:
            raise SqlUnsupportedError(
                f"AS OF TIMESTAMP on {table!r} is not supported by this source; use a "
                "batch id (AS OF 12)",
                code=ErrorCode.UNSUPPORTED_AS_OF,
            )
        try:
            return source.batch_at_time(table, as_of)
        except InvalidQueryError as exc:
            raise SqlError(exc.message, code=ErrorCode.BAD_AS_OF, field=table) from None

    def _columnar_sql(
        self, plan: Plan, columnar: tuple[str, ...], page_size: int | None, offset: int | None
    ) -> str:
        """The columnar path's SQL text: generated once per plan and paging shape (sqlglot
        takes milliseconds to write a statement), the batches left as parameters."""
        key = (plan.digest, plan.text, columnar, page_size, offset)
        found = self._columnar_texts.get(key)
        if found is not None:
            return found
        assert plan.whole is not None
        by_relation = {t.relation: t for t in plan.tables}
        query = with_versions(
            plan.whole,
            {r: (f"__sq_v{r[len('__sq_r') :]}", by_relation[r].columns) for r in columnar},
        )
        if page_size is not None:
            query = exp.select("*").from_(query.subquery("__sq_page")).limit(page_size + 1)
            query = query.offset(offset or 0)
        text = query.sql(dialect=DIALECT)
        with self._lock:
            if len(self._columnar_texts) > _CACHE_SIZE:
                self._columnar_texts.clear()
            self._columnar_texts[key] = text
        return text

    def _access(self, table: TablePlan, params: tuple[Any, ...] = ()) -> KeyAccess:
        schema, codec, _ = self._codec(table.name)
        return bind_access(schema, codec, table.terms, params, self.limits.max_key_lookups)

    def _explain(self, plan: Plan) -> SqlResult:
        described = explain_plan(plan, [self._access(t) for t in plan.tables], self._codec)
        rows = explain_rows(described)
        columns = ["property", "value"]
        return SqlResult(columns, rows, Position.empty(), None, described, strings(columns))


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SqlLimitError(
            "the query ran out of time (SqlLimits.timeout_seconds); narrow it or raise the limit",
            code=ErrorCode.TIMEOUT,
        )
    return left
