"""The part of the emulated catalog added for pgcli/pgspecial and pgJDBC (and the tools
built on them: DBeaver, Metabase): relations and functions their metadata queries read
that psql, the Python drivers and Grafana never asked for.

:func:`~sparkiq.server.pg.pgcatalog.build_catalog` creates these next to its own; they
describe no object sparkiq lacks beyond what the rest of the catalog does (no roles
granted to roles, no user functions), so most answer empty or with the one role.
"""

from __future__ import annotations

__all__ = ["EXTRA_MACROS", "EXTRA_PG_TABLES", "EXTRA_SETTINGS", "TABLE_MACROS"]

#: The table macros below, which catalog queries may call in FROM (translate's walls).
TABLE_MACROS = frozenset({"pg_get_keywords"})

#: pg_catalog relations: name -> columns in catalog_schema's compact spelling ("name:KIND").
EXTRA_PG_TABLES: dict[str, str] = {
    # psql's and pgspecial's \du list the roles each role is a member of
    "pg_auth_members": "oid:L roleid:L member:L grantor:L admin_option:B",
    # SQLAlchemy's get_indexes (Superset) joins the indexes' operator classes; the primary
    # key indexes use the default ones, which it reads as "none named"
    "pg_opclass": (
        "oid:L opcmethod:L opcname:V opcnamespace:L opcowner:L opcfamily:L opcintype:L "
        "opcdefault:B opckeytype:L"
    ),
}

#: pg_settings rows beyond the parameters reported at login: Postgres' compiled-in limits
#: pgJDBC reads (getMaxIndexKeys, which getImportedKeys/getExportedKeys need).
EXTRA_SETTINGS: dict[str, str] = {
    "max_index_keys": "32",
    "max_identifier_length": "63",
    "max_function_args": "100",
}

#: Postgres functions their queries call, as DuckDB macros (created in ``public``).
EXTRA_MACROS: tuple[str, ...] = (
    # pgspecial's \df: a function's result and argument types (there are no user functions)
    "CREATE MACRO pg_get_function_result(id) AS NULL::VARCHAR",
    "CREATE MACRO pg_get_function_arguments(id) AS NULL::VARCHAR",
    "CREATE MACRO pg_get_function_identity_arguments(id) AS NULL::VARCHAR",
    # information_schema._pg_expandarray (pgJDBC's getPrimaryKeys, getIndexInfo...): each
    # element x of an array with its position n, one row each (a set-returning function)
    "CREATE MACRO _pg_expandarray(a) AS "
    "unnest(list_transform(range(1, len(a) + 1), lambda i: {'x': a[i], 'n': i}))",
    # pgJDBC's getSQLKeywords (DBeaver highlights them): DuckDB's parser is Postgres' own
    # (libpg_query), so its keyword list and categories are Postgres' 14 ones near enough.
    "CREATE MACRO pg_get_keywords() AS TABLE SELECT lower(keyword_name) AS word, "
    "CASE keyword_category WHEN 'reserved' THEN 'R' WHEN 'unreserved' THEN 'U' "
    "WHEN 'column_name' THEN 'C' ELSE 'T' END AS catcode, "
    "keyword_category <> 'reserved' AS barelabel, keyword_category AS catdesc, "
    "CASE WHEN keyword_category = 'reserved' THEN 'requires AS' ELSE 'can be bare label' "
    "END AS baredesc FROM duckdb_keywords()",
)
