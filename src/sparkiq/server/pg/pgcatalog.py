"""The emulated Postgres catalog: ``pg_catalog`` and ``information_schema`` as small tables
that describe the node's tables, built into an in-memory DuckDB of their own.

DuckDB has a ``pg_catalog`` and an ``information_schema`` of its own, but they describe
DuckDB (its databases ``memory``/``system``/``temp``, its settings, its type ids), so the
endpoint never lets a client read them: its catalog lives in two schemas of its own,
:data:`PG_CATALOG` and :data:`INFORMATION_SCHEMA`, which
:mod:`~sparkiq.server.pg.translate` substitutes for the names a client writes. They hold:

- one namespace per schema a client sees (``pg_catalog``, ``public``, ``information_schema``),
  one database (:data:`DATABASE`), one role (:data:`OWNER`);
- one ``pg_class`` row per served table (``relkind 'r'``) with its columns in
  ``pg_attribute`` and ``information_schema.columns``, typed with the Postgres type of
  each column's kind (:data:`~sparkiq.schema.kinds.KINDS`; numeric with its typmod);
- ``pg_type`` rows of every type the endpoint sends (:data:`CATALOG_TYPES`);
- ``pg_settings`` rows of the parameters reported at login;
- empty tables for the objects sparkiq has none of (indexes, constraints, policies,
  descriptions, publications, extensions...), so tools' joins on them find nothing;
- ``public``: one *empty* table per served table (the node's rows are never here);
- macros for the Postgres functions catalog queries call (``format_type``, ``quote_ident``,
  ``parse_ident``, ``pg_get_expr``, ``has_table_privilege``...).

Object ids: namespaces and catalog relations have Postgres' own (``pg_catalog`` 11,
``public`` 2200, ``pg_class`` 1259...); served tables get 16384 and up in name order, so
an id stays the same while the set of tables does.

Over 600 lines because it is mostly data: the column lists of the ~50 emulated relations
and the rows that describe a served table. They are one concept (what the catalog holds)
and read best next to the code that fills them.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from sparkiq.schema.kinds import KINDS
from sparkiq.schema.types import TableSchema
from sparkiq.server.pg.pgextras import EXTRA_MACROS, EXTRA_PG_TABLES, EXTRA_SETTINGS

__all__ = [
    "CATALOG_RELATIONS",
    "CATALOG_TYPES",
    "DATABASE",
    "INFORMATION_SCHEMA",
    "OWNER",
    "PG_CATALOG",
    "build_catalog",
    "catalog_cursor",
    "relation_oids",
]

#: The DuckDB schemas that stand for ``pg_catalog`` and ``information_schema``.
PG_CATALOG = "sparkiq_pg_catalog"
INFORMATION_SCHEMA = "sparkiq_information_schema"
#: The one database and the one role the catalog names.
DATABASE = "sparkiq"
OWNER = "sparkiq"

_NAMESPACES = (("pg_catalog", 11), ("public", 2200), ("information_schema", 13_000))
_FIRST_TABLE_OID = 16_384
# A table's primary key index and constraint: OIDs of their own, far above the tables'.
_KEY_OID_OFFSET = 1_000_000


@dataclass(frozen=True, slots=True)
class CatalogType:
    """One row of ``pg_type``: OID, name, length, category and Postgres' display name."""

    oid: int
    name: str
    length: int
    category: str
    display: str


#: Every type a result column or a served column can have, plus the ones catalogs use.
CATALOG_TYPES: tuple[CatalogType, ...] = (
    CatalogType(16, "bool", 1, "B", "boolean"),
    CatalogType(17, "bytea", -1, "U", "bytea"),
    CatalogType(18, "char", 1, "Z", '"char"'),
    CatalogType(19, "name", 64, "S", "name"),
    CatalogType(20, "int8", 8, "N", "bigint"),
    CatalogType(21, "int2", 2, "N", "smallint"),
    CatalogType(23, "int4", 4, "N", "integer"),
    CatalogType(25, "text", -1, "S", "text"),
    CatalogType(26, "oid", 4, "N", "oid"),
    CatalogType(114, "json", -1, "U", "json"),
    CatalogType(700, "float4", 4, "N", "real"),
    CatalogType(701, "float8", 8, "N", "double precision"),
    CatalogType(1043, "varchar", -1, "S", "character varying"),
    CatalogType(1082, "date", 4, "D", "date"),
    CatalogType(1114, "timestamp", 8, "D", "timestamp without time zone"),
    CatalogType(1184, "timestamptz", 8, "D", "timestamp with time zone"),
    CatalogType(1700, "numeric", -1, "N", "numeric"),
)
_BY_NAME = {t.name: t for t in CATALOG_TYPES}
# Types whose I/O functions Postgres names with an underscore (numeric_recv, not
# numericrecv): clients that map types by those names (ADBC reads typreceive) need them right.
_UNDERSCORED_IO = frozenset({"json", "date", "timestamp", "timestamptz", "numeric"})


def _io_function(type_name: str, kind: str) -> str:
    """The name of a type's input, output, receive or send function, as Postgres has it."""
    return f"{type_name}_{kind}" if type_name in _UNDERSCORED_IO else f"{type_name}{kind}"


#: Postgres' OIDs of the catalog relations tools name in ``'pg_class'::regclass``.
CATALOG_RELATIONS: dict[str, int] = {
    "pg_type": 1247,
    "pg_attribute": 1249,
    "pg_proc": 1255,
    "pg_class": 1259,
    "pg_database": 1262,
    "pg_am": 2601,
    "pg_constraint": 2606,
    "pg_description": 2609,
    "pg_namespace": 2615,
    "pg_trigger": 2620,
}

# name -> (columns as "name TYPE", rows). Rows of the tables that describe served tables
# are filled by build_catalog.
_V, _B, _I, _L = "VARCHAR", "BOOLEAN", "INTEGER", "BIGINT"


def _cols(spec: str) -> list[str]:
    """``"a:V b:L"`` -> ``["a VARCHAR", "b BIGINT"]`` (a compact spelling of the tables)."""
    kinds = {"V": _V, "B": _B, "I": _I, "L": _L, "F": "DOUBLE", "A": "VARCHAR[]", "N": "BIGINT[]"}
    out = []
    for item in spec.split():
        name, kind = item.split(":")
        out.append(f'"{name}" {kinds[kind]}')
    return out


_PG_TABLES: dict[str, str] = {
    "pg_namespace": "oid:L nspname:V nspowner:L nspacl:A",
    "pg_class": (
        "oid:L relname:V relnamespace:L reltype:L reloftype:L relowner:L relam:L "
        "relfilenode:L reltablespace:L relpages:I reltuples:F relallvisible:I reltoastrelid:L "
        "relhasindex:B relisshared:B relpersistence:V relkind:V relnatts:I relchecks:I "
        "relhasrules:B relhastriggers:B relhassubclass:B relrowsecurity:B "
        "relforcerowsecurity:B relispopulated:B relreplident:V relispartition:B relrewrite:L "
        "relfrozenxid:L relminmxid:L relacl:A reloptions:A relpartbound:V"
    ),
    "pg_attribute": (
        "attrelid:L attname:V atttypid:L attstattarget:I attlen:I attnum:I attndims:I "
        "attcacheoff:I atttypmod:I attbyval:B attalign:V attstorage:V attcompression:V "
        "attnotnull:B atthasdef:B atthasmissing:B attidentity:V attgenerated:V "
        "attisdropped:B attislocal:B attinhcount:I attcollation:L attacl:A attoptions:A "
        "attfdwoptions:A attmissingval:V"
    ),
    "pg_type": (
        "oid:L typname:V typnamespace:L typowner:L typlen:I typbyval:B typtype:V "
        "typcategory:V typispreferred:B typisdefined:B typdelim:V typrelid:L typsubscript:V "
        "typelem:L typarray:L typinput:V typoutput:V typreceive:V typsend:V typmodin:V "
        "typmodout:V typanalyze:V typalign:V typstorage:V typnotnull:B typbasetype:L "
        "typtypmod:I typndims:I typcollation:L typdefaultbin:V typdefault:V typacl:A"
    ),
    "pg_database": (
        "oid:L datname:V datdba:L encoding:I datlocprovider:V datistemplate:B "
        "datallowconn:B datconnlimit:I datlastsysoid:L datfrozenxid:L datminmxid:L "
        "dattablespace:L datcollate:V datctype:V daticulocale:V datcollversion:V datacl:A"
    ),
    "pg_am": "oid:L amname:V amhandler:V amtype:V",
    "pg_roles": (
        "oid:L rolname:V rolsuper:B rolinherit:B rolcreaterole:B rolcreatedb:B "
        "rolcanlogin:B rolreplication:B rolconnlimit:I rolpassword:V rolvaliduntil:V "
        "rolbypassrls:B rolconfig:A"
    ),
    "pg_user": (
        "usename:V usesysid:L usecreatedb:B usesuper:B userepl:B usebypassrls:B passwd:V "
        "valuntil:V useconfig:A"
    ),
    "pg_settings": (
        "name:V setting:V unit:V category:V short_desc:V extra_desc:V context:V vartype:V "
        "source:V min_val:V max_val:V enumvals:A boot_val:V reset_val:V sourcefile:V "
        "sourceline:I pending_restart:B"
    ),
    "pg_tables": (
        "schemaname:V tablename:V tableowner:V tablespace:V hasindexes:B hasrules:B "
        "hastriggers:B rowsecurity:B"
    ),
    "pg_views": "schemaname:V viewname:V viewowner:V definition:V",
    "pg_matviews": (
        "schemaname:V matviewname:V matviewowner:V tablespace:V hasindexes:B ispopulated:B "
        "definition:V"
    ),
    "pg_indexes": "schemaname:V tablename:V indexname:V tablespace:V indexdef:V",
    "pg_description": "objoid:L classoid:L objsubid:I description:V",
    "pg_shdescription": "objoid:L classoid:L description:V",
    "pg_attrdef": "oid:L adrelid:L adnum:I adbin:V",
    "pg_depend": ("classid:L objid:L objsubid:I refclassid:L refobjid:L refobjsubid:I deptype:V"),
    "pg_index": (
        "indexrelid:L indrelid:L indnatts:I indnkeyatts:I indisunique:B indisprimary:B "
        "indisexclusion:B indimmediate:B indisclustered:B indisvalid:B indcheckxmin:B "
        "indisready:B indislive:B indisreplident:B indkey:N indcollation:N indclass:N "
        "indoption:N indexprs:V indpred:V"
    ),
    "pg_constraint": (
        "oid:L conname:V connamespace:L contype:V condeferrable:B condeferred:B "
        "convalidated:B conrelid:L contypid:L conindid:L conparentid:L confrelid:L "
        "confupdtype:V confdeltype:V confmatchtype:V conislocal:B coninhcount:I "
        "connoinherit:B conkey:N confkey:N conpfeqop:N conppeqop:N conffeqop:N conexclop:N "
        "conbin:V"
    ),
    "pg_inherits": "inhrelid:L inhparent:L inhseqno:I inhdetachpending:B",
    "pg_policy": (
        "oid:L polname:V polrelid:L polcmd:V polpermissive:B polroles:N polqual:V polwithcheck:V"
    ),
    "pg_statistic_ext": (
        "oid:L stxrelid:L stxname:V stxnamespace:L stxowner:L stxstattarget:I stxkeys:N "
        "stxkind:A stxexprs:V"
    ),
    "pg_publication": (
        "oid:L pubname:V pubowner:L puballtables:B pubinsert:B pubupdate:B pubdelete:B "
        "pubtruncate:B pubviaroot:B"
    ),
    "pg_publication_rel": "oid:L prpubid:L prrelid:L",
    "pg_extension": (
        "oid:L extname:V extowner:L extnamespace:L extrelocatable:B extversion:V "
        "extconfig:N extcondition:A"
    ),
    "pg_enum": "oid:L enumtypid:L enumsortorder:F enumlabel:V",
    "pg_range": (
        "rngtypid:L rngsubtype:L rngmultitypid:L rngcollation:L rngsubopc:L "
        "rngcanonical:V rngsubdiff:V"
    ),
    "pg_proc": (
        "oid:L proname:V pronamespace:L proowner:L prolang:L prokind:V prorettype:L "
        "proargtypes:N proargnames:A prosrc:V proallargtypes:N proargmodes:A proretset:B "
        "proargdefaults:V proisagg:B proiswindow:B"
    ),
    "pg_collation": (
        "oid:L collname:V collnamespace:L collowner:L collprovider:V collisdeterministic:B "
        "collencoding:I collcollate:V collctype:V"
    ),
    "pg_tablespace": "oid:L spcname:V spcowner:L spcacl:A spcoptions:A",
    "pg_trigger": (
        "oid:L tgrelid:L tgparentid:L tgname:V tgfoid:L tgtype:I tgenabled:V tgisinternal:B"
    ),
    "pg_rewrite": "oid:L rulename:V ev_class:L ev_type:V ev_enabled:V is_instead:B",
    "pg_sequence": (
        "seqrelid:L seqtypid:L seqstart:L seqincrement:L seqmax:L seqmin:L seqcache:L seqcycle:B"
    ),
    "pg_sequences": "schemaname:V sequencename:V sequenceowner:V data_type:V last_value:L",
    "pg_prepared_statements": ("name:V statement:V prepare_time:V parameter_types:A from_sql:B"),
    "pg_foreign_table": "ftrelid:L ftserver:L ftoptions:A",
    "pg_partitioned_table": "partrelid:L partstrat:V partnatts:I partdefid:L",
    "pg_default_acl": "oid:L defaclrole:L defaclnamespace:L defaclobjtype:V defaclacl:A",
    "pg_event_trigger": "oid:L evtname:V evtevent:V evtowner:L evtfoid:L evtenabled:V",
    "pg_language": "oid:L lanname:V lanowner:L lanispl:B lanpltrusted:B",
    "pg_stat_activity": (
        "datid:L datname:V pid:I usename:V application_name:V client_addr:V state:V query:V"
    ),
}

_INFO_TABLES: dict[str, str] = {
    "schemata": (
        "catalog_name:V schema_name:V schema_owner:V default_character_set_catalog:V "
        "default_character_set_schema:V default_character_set_name:V sql_path:V"
    ),
    "tables": (
        "table_catalog:V table_schema:V table_name:V table_type:V "
        "self_referencing_column_name:V reference_generation:V "
        "user_defined_type_catalog:V user_defined_type_schema:V user_defined_type_name:V "
        "is_insertable_into:V is_typed:V commit_action:V"
    ),
    "columns": (
        "table_catalog:V table_schema:V table_name:V column_name:V ordinal_position:I "
        "column_default:V is_nullable:V data_type:V character_maximum_length:I "
        "character_octet_length:I numeric_precision:I numeric_precision_radix:I "
        "numeric_scale:I datetime_precision:I interval_type:V interval_precision:I "
        "character_set_catalog:V character_set_schema:V character_set_name:V "
        "collation_catalog:V collation_schema:V collation_name:V domain_catalog:V "
        "domain_schema:V domain_name:V udt_catalog:V udt_schema:V udt_name:V "
        "scope_catalog:V scope_schema:V scope_name:V maximum_cardinality:I "
        "dtd_identifier:V is_self_referencing:V is_identity:V identity_generation:V "
        "identity_start:V identity_increment:V identity_maximum:V identity_minimum:V "
        "identity_cycle:V is_generated:V generation_expression:V is_updatable:V"
    ),
    "views": (
        "table_catalog:V table_schema:V table_name:V view_definition:V check_option:V "
        "is_updatable:V is_insertable_into:V"
    ),
    "table_constraints": (
        "constraint_catalog:V constraint_schema:V constraint_name:V table_catalog:V "
        "table_schema:V table_name:V constraint_type:V is_deferrable:V "
        "initially_deferred:V enforced:V"
    ),
    "key_column_usage": (
        "constraint_catalog:V constraint_schema:V constraint_name:V table_catalog:V "
        "table_schema:V table_name:V column_name:V ordinal_position:I "
        "position_in_unique_constraint:I"
    ),
    "referential_constraints": (
        "constraint_catalog:V constraint_schema:V constraint_name:V "
        "unique_constraint_catalog:V unique_constraint_schema:V unique_constraint_name:V "
        "match_option:V update_rule:V delete_rule:V"
    ),
    "check_constraints": (
        "constraint_catalog:V constraint_schema:V constraint_name:V check_clause:V"
    ),
    "constraint_column_usage": (
        "table_catalog:V table_schema:V table_name:V column_name:V constraint_catalog:V "
        "constraint_schema:V constraint_name:V"
    ),
    "constraint_table_usage": (
        "table_catalog:V table_schema:V table_name:V constraint_catalog:V "
        "constraint_schema:V constraint_name:V"
    ),
    "character_sets": (
        "character_set_catalog:V character_set_schema:V character_set_name:V "
        "character_repertoire:V form_of_use:V default_collate_catalog:V "
        "default_collate_schema:V default_collate_name:V"
    ),
    "routines": "routine_catalog:V routine_schema:V routine_name:V routine_type:V data_type:V",
    "parameters": "specific_catalog:V specific_schema:V specific_name:V parameter_name:V",
}

_TYPE_SQL = "CASE t " + " ".join(
    f"WHEN {t.oid} THEN '{t.display.replace(chr(39), chr(39) * 2)}'"
    for t in CATALOG_TYPES
    if t.name != "numeric"
)
# Postgres functions catalog queries call, as DuckDB macros (created in the public schema).
_MACROS = (
    # numeric's typmod is ((precision << 16) | scale) + 4; -1 means unconstrained.
    "CREATE MACRO format_type(t, m) AS CASE WHEN t IS NULL THEN NULL "
    "WHEN t = 1700 THEN CASE WHEN m >= 4 THEN 'numeric(' || ((m - 4) >> 16) || ',' "
    f"|| ((m - 4) & 65535) || ')' ELSE 'numeric' END ELSE coalesce({_TYPE_SQL} END, '???') END",
    "CREATE MACRO quote_ident(s) AS CASE WHEN regexp_full_match(s, '[a-z_][a-z0-9_$]*') "
    "THEN s ELSE '\"' || replace(s, '\"', '\"\"') || '\"' END",
    "CREATE MACRO parse_ident(s) AS list_transform(string_split(s, '.'), lambda p: "
    "CASE WHEN p LIKE '\"%\"' THEN replace(p[2:-2], '\"\"', '\"') ELSE lower(p) END)",
    "CREATE MACRO array_lower(a, d) AS CASE WHEN len(a) > 0 THEN 1 END",
    "CREATE MACRO array_upper(a, d) AS CASE WHEN len(a) > 0 THEN len(a) END",
    "CREATE MACRO array_to_string(a, sep) AS list_aggr(a, 'string_agg', sep)",
    f"CREATE MACRO pg_get_userbyid(id) AS '{OWNER}'",
    "CREATE MACRO pg_encoding_to_char(id) AS 'UTF8'",
    "CREATE MACRO pg_get_expr(e, r) AS NULL::VARCHAR, (e, r, p) AS NULL::VARCHAR",
    "CREATE MACRO pg_get_partkeydef(id) AS NULL::VARCHAR",
    "CREATE MACRO pg_get_serial_sequence(t, c) AS NULL::VARCHAR",  # no serial columns
    "CREATE MACRO pg_collation_is_visible(id) AS true",
    # psycopg's TypeInfo.fetch: a type's OID by name (NULL for a type there is not)
    f"CREATE MACRO to_regtype(t) AS (SELECT min(oid) FROM {PG_CATALOG}.pg_type WHERE typname = t)",
    "CREATE MACRO pg_get_constraintdef(id) AS NULL::VARCHAR, (id, p) AS NULL::VARCHAR",
    # the primary key indexes' definitions (psql's \d shows what follows "USING")
    f"CREATE MACRO pg_get_indexdef(id) AS (SELECT min(i.indexdef) FROM {PG_CATALOG}.pg_indexes "
    f"i JOIN {PG_CATALOG}.pg_class c ON c.relname = i.indexname WHERE c.oid = id), "
    # with a column number n > 0 (pgJDBC's getIndexInfo), the n-th key column's name
    f"(id, n, p) AS CASE WHEN n = 0 THEN (SELECT min(i.indexdef) FROM {PG_CATALOG}.pg_indexes "
    f"i JOIN {PG_CATALOG}.pg_class c ON c.relname = i.indexname WHERE c.oid = id) ELSE "
    f"(SELECT min(a.attname) FROM {PG_CATALOG}.pg_index x JOIN {PG_CATALOG}.pg_attribute a "
    "ON a.attrelid = x.indrelid AND a.attnum = x.indkey[n] WHERE x.indexrelid = id) END",
    "CREATE MACRO pg_get_viewdef(id) AS NULL::VARCHAR, (id, p) AS NULL::VARCHAR",
    "CREATE MACRO pg_get_statisticsobjdef_columns(id) AS NULL::VARCHAR",
    "CREATE MACRO pg_relation_is_publishable(id) AS false",
    "CREATE MACRO obj_description(id) AS NULL::VARCHAR, (id, c) AS NULL::VARCHAR",
    "CREATE MACRO col_description(id, n) AS NULL::VARCHAR",
    "CREATE MACRO shobj_description(id, c) AS NULL::VARCHAR",
    "CREATE MACRO pg_table_is_visible(id) AS true",
    "CREATE MACRO pg_type_is_visible(id) AS true",
    "CREATE MACRO pg_function_is_visible(id) AS true",
    "CREATE MACRO has_table_privilege(a, b) AS true, (a, b, c) AS true",
    "CREATE MACRO has_schema_privilege(a, b) AS true, (a, b, c) AS true",
    "CREATE MACRO has_database_privilege(a, b) AS true, (a, b, c) AS true",
    "CREATE MACRO has_column_privilege(a, b, c) AS true, (a, b, c, d) AS true",
    "CREATE MACRO pg_relation_size(id) AS 0, (id, f) AS 0",
    "CREATE MACRO pg_table_size(id) AS 0",
    "CREATE MACRO pg_total_relation_size(id) AS 0",
    "CREATE MACRO pg_database_size(id) AS 0",
    "CREATE MACRO pg_tablespace_location(id) AS ''",
    "CREATE MACRO pg_is_in_recovery() AS false",
    "CREATE MACRO pg_backend_pid() AS 0",
    "CREATE MACRO txid_current() AS 0",
)


def relation_oids(tables: Sequence[str]) -> dict[str, int]:
    """The ``pg_class`` OID of each served table (16384 and up, in name order)."""
    return {name: _FIRST_TABLE_OID + i for i, name in enumerate(sorted(tables))}


def _column_type(data_type: Any) -> tuple[CatalogType, int]:
    """A served column's ``pg_type`` row and typmod (-1 unless numeric(p,s))."""
    kind = KINDS.get(data_type.name)
    pg_type = _BY_NAME.get(kind.pg if kind is not None else "text", _BY_NAME["text"])
    if pg_type.name == "numeric":
        return pg_type, ((data_type.precision << 16) | data_type.scale) + 4
    return pg_type, -1


def column_type_name(data_type: Any) -> str:
    """The Postgres name of a served column's type, as ``information_schema`` shows it."""
    return _column_type(data_type)[0].display


def _quoted_if_needed(name: str) -> str:
    """``name`` as Postgres prints it in a definition: quoted only when it must be."""
    return name if re.fullmatch(r"[a-z_][a-z0-9_$]*", name) else _ident(name)


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _duck_type(pg_type: CatalogType, typmod: int) -> str:
    """The DuckDB type of a served column's empty stand-in table in ``public``."""
    if pg_type.name == "numeric" and typmod >= 4:
        return f"DECIMAL({(typmod - 4) >> 16},{(typmod - 4) & 65535})"
    return {
        "json": "JSON",
        "float4": "REAL",
        "float8": "DOUBLE",
        "timestamptz": "TIMESTAMPTZ",
    }.get(pg_type.name, pg_type.name)


def build_catalog(
    tables: Mapping[str, TableSchema], parameters: Mapping[str, str]
) -> duckdb.DuckDBPyConnection:
    """A locked in-memory DuckDB holding the emulated catalog of ``tables``."""
    db = duckdb.connect(
        ":memory:",
        config={
            "enable_external_access": False,
            "autoload_known_extensions": False,
            "autoinstall_known_extensions": False,
            "threads": 1,
            "memory_limit": "64MB",
        },
    )
    db.execute(f"CREATE SCHEMA {PG_CATALOG}")
    db.execute(f"CREATE SCHEMA {INFORMATION_SCHEMA}")
    db.execute("CREATE SCHEMA public")
    for name, spec in _PG_TABLES.items():
        db.execute(f"CREATE TABLE {PG_CATALOG}.{name} ({', '.join(_cols(spec))})")
    for name, spec in _INFO_TABLES.items():
        db.execute(f"CREATE TABLE {INFORMATION_SCHEMA}.{name} ({', '.join(_cols(spec))})")
    for name, spec in EXTRA_PG_TABLES.items():
        db.execute(f"CREATE TABLE {PG_CATALOG}.{name} ({', '.join(_cols(spec))})")
    for macro in _MACROS + EXTRA_MACROS:
        db.execute(macro.replace("CREATE MACRO ", "CREATE MACRO public.", 1))
    _fill(db, tables, parameters)
    # GLOBAL: every cursor (catalog_cursor) inherits it, and none may change it once locked
    db.execute("SET GLOBAL integer_division = true")  # Postgres' int / int is an int
    db.execute(_SEARCH_PATH)
    db.execute("SET lock_configuration = true")
    return db


# A session setting in DuckDB (it cannot be global): each cursor sets it.
_SEARCH_PATH = f"SET search_path = '{PG_CATALOG},public'"


def catalog_cursor(db: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """A connection of its own to ``db`` (made by :func:`build_catalog`), set up as ``db``
    is, for one query in one thread. Close it after the query."""
    cursor = db.cursor()
    try:
        cursor.execute(_SEARCH_PATH)
    except BaseException:
        cursor.close()
        raise
    return cursor


def _insert(db: duckdb.DuckDBPyConnection, table: str, rows: Sequence[Mapping[str, Any]]) -> None:
    if not rows:
        return
    names = list(rows[0])
    columns = ", ".join(_ident(n) for n in names)
    marks = ", ".join("?" for _ in names)
    db.executemany(
        f"INSERT INTO {table} ({columns}) VALUES ({marks})",
        [[row[n] for n in names] for row in rows],
    )


def _primary_key(schema: TableSchema) -> tuple[str, ...]:
    """The columns that identify a row: the key columns, and a windowed table's window."""
    window = (schema.window_column,) if schema.window_column else ()
    return (*schema.key_columns, *window)


def _primary_key_rows(
    table: str, oid: int, table_class: Mapping[str, Any], names: Sequence[str], attnums: list[int]
) -> list[tuple[str, list[dict[str, Any]]]]:
    r"""The catalog rows of ``table``'s primary key (its key columns), as tools read it:
    ``pg_constraint`` and ``pg_index`` (SQLAlchemy's ``inspect``, pgJDBC's
    ``getPrimaryKeys``), the index's ``pg_class`` and ``pg_indexes`` rows (psql's ``\d``),
    and ``information_schema``'s
    ``table_constraints`` and ``key_column_usage``. Keys are ``NOT NULL`` in ``pg_attribute``
    and ``columns`` (see :func:`_fill`): Spark's grouping keys may hold a null, but a served
    key column never does (a row's key is what finds it)."""
    index_oid, constraint_oid = oid + _KEY_OID_OFFSET, oid + 2 * _KEY_OID_OFFSET
    name = f"{table}_pkey"
    public = dict(_NAMESPACES)["public"]
    index_class = {
        **table_class,
        "oid": index_oid,
        "relname": name,
        "relfilenode": index_oid,
        "relam": 403,  # btree
        "relkind": "i",
        "relnatts": len(attnums),
        "relhasindex": False,
    }
    index = {
        "indexrelid": index_oid,
        "indrelid": oid,
        "indnatts": len(attnums),
        "indnkeyatts": len(attnums),
        "indisunique": True,
        "indisprimary": True,
        "indisexclusion": False,
        "indimmediate": True,
        "indisclustered": False,
        "indisvalid": True,
        "indcheckxmin": False,
        "indisready": True,
        "indislive": True,
        "indisreplident": False,
        "indkey": attnums,
        "indcollation": [0] * len(attnums),
        "indclass": [0] * len(attnums),
        "indoption": [0] * len(attnums),
    }
    constraint = {
        "oid": constraint_oid,
        "conname": name,
        "connamespace": public,
        "contype": "p",
        "condeferrable": False,
        "condeferred": False,
        "convalidated": True,
        "conrelid": oid,
        "contypid": 0,
        "conindid": index_oid,
        "conparentid": 0,
        "confrelid": 0,
        "conislocal": True,
        "coninhcount": 0,
        "connoinherit": True,
        "conkey": attnums,
    }
    where = {"table_catalog": DATABASE, "table_schema": "public", "table_name": table}
    named = {"constraint_catalog": DATABASE, "constraint_schema": "public", "constraint_name": name}
    usage = [
        {**named, **where, "column_name": column, "ordinal_position": position}
        for position, column in enumerate(names, start=1)
    ]
    listed = ", ".join(_quoted_if_needed(n) for n in names)
    on = _quoted_if_needed(table)
    definition = f"CREATE UNIQUE INDEX {name} ON public.{on} USING btree ({listed})"
    return [
        (f"{PG_CATALOG}.pg_class", [index_class]),
        (
            f"{PG_CATALOG}.pg_indexes",
            [
                {
                    "schemaname": "public",
                    "tablename": table,
                    "indexname": name,
                    "tablespace": None,
                    "indexdef": definition,
                }
            ],
        ),
        (f"{PG_CATALOG}.pg_index", [index]),
        (f"{PG_CATALOG}.pg_constraint", [constraint]),
        (
            f"{INFORMATION_SCHEMA}.table_constraints",
            [
                {
                    **named,
                    **where,
                    "constraint_type": "PRIMARY KEY",
                    "is_deferrable": "NO",
                    "initially_deferred": "NO",
                    "enforced": "YES",
                }
            ],
        ),
        (f"{INFORMATION_SCHEMA}.key_column_usage", usage),
    ]


def _fill(
    db: duckdb.DuckDBPyConnection,
    tables: Mapping[str, TableSchema],
    parameters: Mapping[str, str],
) -> None:
    public = dict(_NAMESPACES)["public"]
    pg_catalog = dict(_NAMESPACES)["pg_catalog"]
    _insert(
        db,
        f"{PG_CATALOG}.pg_namespace",
        [{"oid": oid, "nspname": name, "nspowner": 10} for name, oid in _NAMESPACES],
    )
    _insert(
        db,
        f"{INFORMATION_SCHEMA}.schemata",
        [
            {"catalog_name": DATABASE, "schema_name": name, "schema_owner": OWNER}
            for name, _ in _NAMESPACES
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_database",
        [
            {
                "oid": 16_383,
                "datname": DATABASE,
                "datdba": 10,
                "encoding": 6,
                "datlocprovider": "c",
                "datistemplate": False,
                "datallowconn": True,
                "datconnlimit": -1,
                "dattablespace": 1663,
                "datcollate": "C.UTF-8",
                "datctype": "C.UTF-8",
            }
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_roles",
        [
            {
                "oid": 10,
                "rolname": OWNER,
                "rolsuper": False,
                "rolinherit": True,
                "rolcreaterole": False,
                "rolcreatedb": False,
                "rolcanlogin": True,
                "rolreplication": False,
                "rolconnlimit": -1,
                "rolbypassrls": False,
            }
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_am",
        [
            {"oid": 2, "amname": "heap", "amhandler": "heap_tableam_handler", "amtype": "t"},
            # the primary key indexes' access method (pg_class.relam 403)
            {"oid": 403, "amname": "btree", "amhandler": "bthandler", "amtype": "i"},
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_tablespace",
        [{"oid": 1663, "spcname": "pg_default", "spcowner": 10}],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_type",
        [
            {
                "oid": t.oid,
                "typname": t.name,
                "typnamespace": pg_catalog,
                "typowner": 10,
                "typlen": t.length,
                "typbyval": 0 < t.length <= 8,
                "typtype": "b",
                "typcategory": t.category,
                "typispreferred": t.name in ("bool", "text", "float8", "oid", "timestamptz"),
                "typisdefined": True,
                "typdelim": ",",
                "typrelid": 0,
                "typelem": 0,
                "typarray": 0,
                "typinput": _io_function(t.name, "in"),
                "typoutput": _io_function(t.name, "out"),
                "typreceive": _io_function(t.name, "recv"),
                "typsend": _io_function(t.name, "send"),
                "typalign": "d" if t.length == 8 else "i",
                "typstorage": "x" if t.length < 0 else "p",
                "typnotnull": False,
                "typbasetype": 0,
                "typtypmod": -1,
                "typndims": 0,
                "typcollation": 100 if t.category == "S" else 0,
            }
            for t in CATALOG_TYPES
        ],
    )
    _insert(
        db,
        f"{PG_CATALOG}.pg_settings",
        [
            {"name": name, "setting": value, "context": "user", "vartype": "string"}
            for name, value in sorted({**EXTRA_SETTINGS, **parameters}.items())
        ],
    )
    oids = relation_oids(list(tables))
    classes, attributes, info_tables, info_columns, pg_tables = [], [], [], [], []
    keys: dict[str, list[dict[str, Any]]] = {}
    for table, oid in oids.items():
        schema = tables[table]
        key_names = _primary_key(schema)
        classes.append(
            {
                "oid": oid,
                "relname": table,
                "relnamespace": public,
                "reltype": 0,
                "reloftype": 0,
                "relowner": 10,
                "relam": 2,
                "relfilenode": oid,
                "reltablespace": 0,
                "relpages": 0,
                "reltuples": -1.0,
                "relallvisible": 0,
                "reltoastrelid": 0,
                "relhasindex": True,
                "relisshared": False,
                "relpersistence": "p",
                "relkind": "r",
                "relnatts": len(schema.fields),
                "relchecks": 0,
                "relhasrules": False,
                "relhastriggers": False,
                "relhassubclass": False,
                "relrowsecurity": False,
                "relforcerowsecurity": False,
                "relispopulated": True,
                "relreplident": "d",
                "relispartition": False,
                "relrewrite": 0,
            }
        )
        info_tables.append(
            {
                "table_catalog": DATABASE,
                "table_schema": "public",
                "table_name": table,
                "table_type": "BASE TABLE",
                "is_insertable_into": "NO",
                "is_typed": "NO",
            }
        )
        pg_tables.append(
            {
                "schemaname": "public",
                "tablename": table,
                "tableowner": OWNER,
                "hasindexes": False,
                "hasrules": False,
                "hastriggers": False,
                "rowsecurity": False,
            }
        )
        columns = []
        for number, f in enumerate(schema.fields, start=1):
            pg_type, typmod = _column_type(f.type)
            columns.append(f"{_ident(f.name)} {_duck_type(pg_type, typmod)}")
            attributes.append(
                {
                    "attrelid": oid,
                    "attname": f.name,
                    "atttypid": pg_type.oid,
                    "attstattarget": -1,
                    "attlen": pg_type.length,
                    "attnum": number,
                    "attndims": 0,
                    "attcacheoff": -1,
                    "atttypmod": typmod,
                    "attbyval": 0 < pg_type.length <= 8,
                    "attalign": "d" if pg_type.length == 8 else "i",
                    "attstorage": "x" if pg_type.length < 0 else "p",
                    "attcompression": "",
                    "attnotnull": f.name in key_names,
                    "atthasdef": False,
                    "atthasmissing": False,
                    "attidentity": "",
                    "attgenerated": "",
                    "attisdropped": False,
                    "attislocal": True,
                    "attinhcount": 0,
                    "attcollation": 100 if pg_type.category == "S" else 0,
                }
            )
            numeric = pg_type.name == "numeric" and typmod >= 4
            info_columns.append(
                {
                    "table_catalog": DATABASE,
                    "table_schema": "public",
                    "table_name": table,
                    "column_name": f.name,
                    "ordinal_position": number,
                    "is_nullable": "NO" if f.name in key_names else "YES",
                    "data_type": pg_type.display,
                    "numeric_precision": (typmod - 4) >> 16 if numeric else None,
                    "numeric_precision_radix": 10 if numeric else None,
                    "numeric_scale": (typmod - 4) & 65535 if numeric else None,
                    "udt_catalog": DATABASE,
                    "udt_schema": "pg_catalog",
                    "udt_name": pg_type.name,
                    "dtd_identifier": str(number),
                    "is_self_referencing": "NO",
                    "is_identity": "NO",
                    "is_generated": "NEVER",
                    "is_updatable": "NO",
                }
            )
        db.execute(f"CREATE TABLE public.{_ident(table)} ({', '.join(columns)})")
        attnums = [n for n, f in enumerate(schema.fields, start=1) if f.name in key_names]
        for relation, rows in _primary_key_rows(table, oid, classes[-1], key_names, attnums):
            keys.setdefault(relation, []).extend(rows)
    _insert(db, f"{PG_CATALOG}.pg_class", classes)
    _insert(db, f"{PG_CATALOG}.pg_attribute", attributes)
    _insert(db, f"{PG_CATALOG}.pg_tables", pg_tables)
    _insert(db, f"{INFORMATION_SCHEMA}.tables", info_tables)
    _insert(db, f"{INFORMATION_SCHEMA}.columns", info_columns)
    for relation, rows in keys.items():
        _insert(db, relation, rows)
