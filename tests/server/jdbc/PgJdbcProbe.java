// pgJDBC as DBeaver and Metabase use it, against a sparkiq node's Postgres endpoint.
// Run with Java's single-file launcher (no compile step), jars from `make jvm-jars`:
//   java -cp '.jvm/pg-jdbc/*' PgJdbcProbe.java HOST PORT PASSWORD TABLE KEYCOLUMN KEYVALUE
// Prints one JSON object (tests/server/test_pgwire_jdbc.py compares it with Node.sql).
// Every value is printed as text (getString), as JDBC tools show it.

import java.sql.*;
import java.util.*;

public class PgJdbcProbe {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:postgresql://" + args[0] + ":" + args[1] + "/sparkiq";
        Properties props = new Properties();
        props.setProperty("user", "analyst");
        props.setProperty("password", args[2]);
        props.setProperty("ApplicationName", "PgJdbcProbe");
        String table = args[3], keyColumn = args[4], keyValue = args[5];
        StringBuilder out = new StringBuilder("{");
        try (Connection c = DriverManager.getConnection(url, props)) {
            DatabaseMetaData md = c.getMetaData();
            field(out, "product", md.getDatabaseProductName());
            field(out, "version", md.getDatabaseProductVersion());
            field(out, "major", String.valueOf(md.getDatabaseMajorVersion()));
            field(out, "driver", md.getDriverVersion());
            field(out, "user", md.getUserName());
            field(out, "catalog", c.getCatalog());
            field(out, "schema", c.getSchema());
            field(out, "quote", md.getIdentifierQuoteString());
            field(out, "keywords", md.getSQLKeywords());
            rows(out, "catalogs", md.getCatalogs());
            rows(out, "schemas", md.getSchemas());
            rows(out, "schemas_like", md.getSchemas("sparkiq", "pub%"));
            rows(out, "table_types", md.getTableTypes());
            rows(out, "tables", md.getTables(null, "public", "%", new String[] {"TABLE", "VIEW"}));
            rows(out, "all_tables", md.getTables("sparkiq", null, null, null));
            rows(out, "columns", md.getColumns(null, "public", table, "%"));
            rows(out, "all_columns", md.getColumns(null, null, "%", null));
            rows(out, "primary_keys", md.getPrimaryKeys(null, "public", table));
            rows(out, "imported_keys", md.getImportedKeys(null, "public", table));
            rows(out, "exported_keys", md.getExportedKeys(null, "public", table));
            rows(out, "index_info", md.getIndexInfo(null, "public", table, false, true));
            rows(out, "type_info", md.getTypeInfo());
            rows(out, "functions", md.getFunctions(null, "public", "%"));
            rows(out, "procedures", md.getProcedures(null, "public", "%"));
            rows(out, "table_privileges", md.getTablePrivileges(null, "public", table));
            rows(out, "version_row", c.createStatement().executeQuery("SELECT version()"));
            // Metabase's sync asks this before reading a table
            try (Statement s = c.createStatement()) {
                s.setFetchSize(100);
                rows(out, "select_all", s.executeQuery("SELECT * FROM " + table));
            }
            try (PreparedStatement p = c.prepareStatement(
                    "SELECT * FROM " + table + " WHERE " + keyColumn + " = ?")) {
                p.setString(1, keyValue);
                rows(out, "lookup", p.executeQuery());
                ResultSetMetaData rmd = p.getMetaData();
                List<String> types = new ArrayList<>();
                for (int i = 1; i <= rmd.getColumnCount(); i++) {
                    types.add(rmd.getColumnLabel(i) + ":" + rmd.getColumnTypeName(i));
                }
                field(out, "lookup_types", String.join(",", types));
            }
            try (Statement s = c.createStatement()) {
                rows(out, "aggregate", s.executeQuery(
                    "SELECT count(*) AS n, min(" + keyColumn + ") AS low FROM " + table));
            }
        }
        out.setLength(out.length() - 1);
        System.out.println(out.append("}"));
    }

    static void field(StringBuilder out, String name, String value) {
        out.append(quote(name)).append(':').append(quote(value)).append(',');
    }

    // A result set as {"columns": [...], "rows": [[...], ...]}, every value as text.
    static void rows(StringBuilder out, String name, ResultSet rs) throws SQLException {
        ResultSetMetaData md = rs.getMetaData();
        int n = md.getColumnCount();
        out.append(quote(name)).append(":{\"columns\":[");
        for (int i = 1; i <= n; i++) {
            out.append(i > 1 ? "," : "").append(quote(md.getColumnLabel(i)));
        }
        out.append("],\"rows\":[");
        boolean first = true;
        while (rs.next()) {
            out.append(first ? "[" : ",[");
            first = false;
            for (int i = 1; i <= n; i++) {
                out.append(i > 1 ? "," : "").append(quote(rs.getString(i)));
            }
            out.append(']');
        }
        rs.close();
        out.append("]},");
    }

    static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') {
                b.append('\\').append(ch);
            } else if (ch < 0x20) {
                b.append(String.format("\\u%04x", (int) ch));
            } else {
                b.append(ch);
            }
        }
        return b.append('"').toString();
    }
}
