package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestErrorsNameTheMistake: every mistake is one line that says what is
// wrong, with the same exit status whichever database the string names,
// and never the command's name twice or an option of the library's API.
func TestErrorsNameTheMistake(t *testing.T) {
	dir := t.TempDir()
	sqliteFile := filepath.Join(dir, "claims.db")
	if err := os.WriteFile(sqliteFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		args []string
		code int
		want string
	}{
		// A port that is not a number: a bad connection string, exit 2, on
		// every database and in every form.
		{"Postgres URL, bad port", []string{"stats", "-dsn", "postgres://bob:pw@127.0.0.1:notaport/test"}, 2, "bad connection string: not a valid URL: the port after the host is not a number"},
		{"Postgres URL, port out of range", []string{"stats", "-dsn", "postgres://bob:pw@127.0.0.1:99999/test"}, 2, "bad connection string: the port is not a number from 1 to 65535"},
		{"Postgres key=value, bad port", []string{"stats", "-dsn", "host=127.0.0.1 port=notaport user=bob"}, 2, "bad connection string: the port is not a number from 1 to 65535"},
		{"MySQL URL, bad port", []string{"stats", "-dsn", "mysql://bob:pw@127.0.0.1:notaport/test"}, 2, "bad connection string: not a valid URL: the port after the host is not a number"},
		{"MySQL DSN, bad port", []string{"stats", "-dsn", "bob:pw@tcp(127.0.0.1:notaport)/test"}, 2, "bad connection string: the port is not a number from 1 to 65535"},
		// A URL that does not parse says why.
		{"MySQL URL, space in the password", []string{"stats", "-dsn", "mysql://bob:p w@127.0.0.1/test"}, 2, "not a valid URL: the user or password holds a character a URL does not allow there"},
		{"Postgres URL, bad escape", []string{"stats", "-dsn", "postgres://bob:p%zz@127.0.0.1/test"}, 2, "not a valid URL: a '%' not followed by two hexadecimal digits"},
		// Strings that are no connection string at all.
		{"user:password@host, no scheme", []string{"stats", "-dsn", "bob:pw@127.0.0.1:3306/test"}, 2, "not a connection string: user:password@host… with no scheme"},
		{"scheme without ://", []string{"stats", "-dsn", "postgresql//bob:pw@127.0.0.1/test"}, 2, "it starts with postgresql but not postgresql://"},
		{"a directory", []string{"stats", "-dsn", dir}, 2, "not a connection string but a directory"},
		// SQLite files that are not there, or not files.
		{"SQLite in a missing directory", []string{"migrate", "-dsn", "sqlite:" + filepath.Join(dir, "missing", "x.db")}, 1, "and no directory " + filepath.Join(dir, "missing") + " to create it in"},
		{"SQLite path of a directory", []string{"migrate", "-dsn", "sqlite:" + dir}, 1, "no SQLite database at " + dir + ": it is a directory"},
		{"SQLite file missing", []string{"stats", "-dsn", "sqlite:" + filepath.Join(dir, "none.db")}, 1, "no SQLite database at " + filepath.Join(dir, "none.db")},
		// What a command cannot do on a database, in the command's words.
		{"partitions on SQLite", []string{"partitions", "-retention", "30d", "-dsn", "sqlite:" + sqliteFile}, 2, "the sqlite dialect does not support partitions: day partitions are for Postgres and MySQL/MariaDB"},
		{"partitioned migrate on SQLite", []string{"migrate", "-partitioned", "-dsn", "sqlite:" + sqliteFile}, 2, "-partitioned: the sqlite dialect does not support partitions"},
		{"kafka-offsets on SQLite", []string{"kafka-offsets", "list", "-dsn", "sqlite:" + sqliteFile}, 2, "idempotent kafka-offsets: the kafka consumer's offsets table is Postgres only"},
		{"kafka-offsets on MySQL", []string{"kafka-offsets", "list", "-dsn", "bob:pw@tcp(127.0.0.1:1)/test"}, 2, "idempotent kafka-offsets: the kafka consumer's offsets table is Postgres only"},
	} {
		code, stdout, stderr := runCLI(t, nil, c.args...)
		if code != c.code || !strings.Contains(stderr, c.want) || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want exit %d and one line with %q", c.name, code, stdout, stderr, c.code, c.want)
		}
		for _, bad := range []string{"WithDailyPartitions", "MaintainPartitions", "kafka-offsets: kafka-offsets", "unable to open database file", "in connection info string", ":pw@"} {
			if strings.Contains(stderr, bad) {
				t.Errorf("%s: stderr %q says %q", c.name, stderr, bad)
			}
		}
	}
}
