"""The shape of the emulated Postgres catalog, as data: the schemas that stand for
``pg_catalog`` and ``information_schema``, the types ``pg_type`` lists, the column lists of the
~50 relations tools read, and the Postgres functions their queries call (as DuckDB macros).

:mod:`~sparkiq.server.pg.pgcatalog` builds the catalog database from it and fills the rows
that describe the served tables; :mod:`~sparkiq.server.pg.pgextras` adds what pgcli and
pgJDBC need beyond it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "CATALOG_RELATIONS",
    "CATALOG_TYPES",
    "DATABASE",
    "FIRST_TABLE_OID",
    "INFORMATION_SCHEMA",
    "INFO_TABLES",
    "KEY_OID_OFFSET",
    "MACROS",
    "NAMESPACES",
    "OWNER",
    "PG_CATALOG",
    "PG_TABLES",
    "TYPES_BY_NAME",
    "CatalogType",
    "column_definitions",
    "io_function",
]

#: The DuckDB schemas that stand for ``pg_catalog`` and ``information_schema``.
PG_CATALOG = "sparkiq_pg_catalog"
INFORMATION_SCHEMA = "sparkiq_information_schema"
#: The one database and the one role the catalog names.
DATABASE = "sparkiq"
OWNER = "sparkiq"

NAMESPACES = (("pg_catalog", 11), ("public", 2200), ("information_schema", 13_000))
FIRST_TABLE_OID = 16_384
# A table's primary key index and constraint: OIDs of their own, far above the tables'.
KEY_OID_OFFSET = 1_000_000


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
TYPES_BY_NAME = {t.name: t for t in CATALOG_TYPES}
# Types whose I/O functions Postgres names with an underscore (numeric_recv, not
# numericrecv): clients that map types by those names (ADBC reads typreceive) need them right.
_UNDERSCORED_IO = frozenset({"json", "date", "timestamp", "timestamptz", "numeric"})


def io_function(type_name: str, kind: str) -> str:
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


def column_definitions(spec: str) -> list[str]:
    """``"a:V b:L"`` -> ``["a VARCHAR", "b BIGINT"]`` (a compact spelling of the tables)."""
    kinds = {"V": _V, "B": _B, "I": _I, "L": _L, "F": "DOUBLE", "A": "VARCHAR[]", "N": "BIGINT[]"}
    out = []
    for item in spec.split():
        name, kind = item.split(":")
        out.append(f'"{name}" {kinds[kind]}')
    return out


PG_TABLES: dict[str, str] = {
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

INFO_TABLES: dict[str, str] = {
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
MACROS = (
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
