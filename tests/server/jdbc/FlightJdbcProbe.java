// Arrow's Flight SQL JDBC driver against a sparkiq node's Flight SQL endpoint.
// Run with Java's single-file launcher (no compile step), the jar from `make jvm-jars`:
//   java --add-opens=java.base/java.nio=ALL-UNNAMED -cp '.jvm/flight-jdbc/*' \
//       FlightJdbcProbe.java HOST PORT USER PASSWORD TABLE KEYCOLUMN KEYVALUE
// Prints one JSON object (tests/server/test_flight_jdbc.py compares it with Node.sql):
// `SELECT *` of TABLE ordered by its first two columns, a PreparedStatement lookup with a
// string parameter, and what DatabaseMetaData says of the tables, TABLE's columns and key.
// Every value is printed as text (getString), as JDBC tools show it.

import java.sql.*;
import java.util.*;

public class FlightJdbcProbe {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:arrow-flight-sql://" + args[0] + ":" + args[1] + "/?useEncryption=false";
        Properties props = new Properties();
        props.setProperty("user", args[2]);
        props.setProperty("password", args[3]);
        String table = args[4], keyColumn = args[5], keyValue = args[6];
        StringBuilder out = new StringBuilder("{");
        try (Connection c = DriverManager.getConnection(url, props)) {
            DatabaseMetaData md = c.getMetaData();
            field(out, "product", md.getDatabaseProductName());
            try (Statement s = c.createStatement()) {
                rows(out, "select_all", s.executeQuery("SELECT * FROM " + table + " ORDER BY 1, 2"));
            }
            try (PreparedStatement p = c.prepareStatement(
                    "SELECT * FROM " + table + " WHERE " + keyColumn + " = ? ORDER BY 1, 2")) {
                p.setString(1, keyValue);
                rows(out, "lookup", p.executeQuery());
            }
            rows(out, "tables", md.getTables(null, null, "%", null));
            rows(out, "columns", md.getColumns(null, null, table, null));
            rows(out, "primary_keys", md.getPrimaryKeys(null, null, table));
        }
        out.setLength(out.length() - 1);
        System.out.println(out.append("}"));
    }

    static void field(StringBuilder out, String name, String value) {
        out.append(quote(name)).append(":").append(quote(value)).append(",");
    }

    // {"columns": [labels], "rows": [[values as text]]}
    static void rows(StringBuilder out, String name, ResultSet rs) throws SQLException {
        try (rs) {
            ResultSetMetaData md = rs.getMetaData();
            List<String> head = new ArrayList<>();
            for (int i = 1; i <= md.getColumnCount(); i++) {
                head.add(quote(md.getColumnLabel(i)));
            }
            List<String> body = new ArrayList<>();
            while (rs.next()) {
                List<String> row = new ArrayList<>();
                for (int i = 1; i <= md.getColumnCount(); i++) {
                    row.add(quote(rs.getString(i)));
                }
                body.add("[" + String.join(",", row) + "]");
            }
            out.append(quote(name)).append(":{\"columns\":[").append(String.join(",", head))
                .append("],\"rows\":[").append(String.join(",", body)).append("]},");
        }
    }

    static String quote(String s) {
        if (s == null) return "null";
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') b.append('\\').append(ch);
            else if (ch < 0x20) b.append(String.format("\\u%04x", (int) ch));
            else b.append(ch);
        }
        return b.append('"').toString();
    }
}
