// Arrow's Flight SQL JDBC driver against a sparkiq node's Flight SQL endpoint.
// Run with Java's single-file launcher (no compile step), the jar from `make jvm-jars`:
//   java -cp '.jvm/flight-jdbc/*' FlightJdbcProbe.java HOST PORT USER PASSWORD SQL
// Prints the result as JSON lines: first the column labels and type names, then one line
// per row, every value as text (getString), as JDBC tools show it; then the tables
// DatabaseMetaData lists. tests/server/test_flight_jdbc.py compares them with Node.sql.

import java.sql.*;
import java.util.*;

public class FlightJdbcProbe {
    public static void main(String[] args) throws Exception {
        String url = "jdbc:arrow-flight-sql://" + args[0] + ":" + args[1] + "/?useEncryption=false";
        Properties props = new Properties();
        props.setProperty("user", args[2]);
        props.setProperty("password", args[3]);
        try (Connection c = DriverManager.getConnection(url, props);
             Statement s = c.createStatement();
             ResultSet rs = s.executeQuery(args[4])) {
            ResultSetMetaData md = rs.getMetaData();
            List<String> head = new ArrayList<>();
            for (int i = 1; i <= md.getColumnCount(); i++) {
                head.add(quote(md.getColumnLabel(i)));
            }
            System.out.println("[" + String.join(",", head) + "]");
            while (rs.next()) {
                List<String> row = new ArrayList<>();
                for (int i = 1; i <= md.getColumnCount(); i++) {
                    row.add(quote(rs.getString(i)));
                }
                System.out.println("[" + String.join(",", row) + "]");
            }
            List<String> tables = new ArrayList<>();
            try (ResultSet t = c.getMetaData().getTables(null, null, "%", null)) {
                while (t.next()) {
                    tables.add(quote(t.getString("TABLE_NAME")));
                }
            }
            System.out.println("[" + String.join(",", tables) + "]");
        }
    }

    static String quote(String s) {
        if (s == null) return "null";
        return "\"" + s.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
    }
}
