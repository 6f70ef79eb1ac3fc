package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestParseDays(t *testing.T) {
	for in, want := range map[string]time.Duration{
		"30d":   30 * 24 * time.Hour,
		"1d12h": 36 * time.Hour,
		"36h":   36 * time.Hour,
		"90m":   90 * time.Minute,
		"0d":    0,
	} {
		got, err := parseDays(in)
		if err != nil || got != want {
			t.Errorf("parseDays(%q) = (%v, %v), want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "d", "30x", "x30d", "-1d", "1d-", "3dd"} {
		if got, err := parseDays(in); err == nil && in != "" {
			t.Errorf("parseDays(%q) = %v, want an error", in, got)
		}
	}
	for d, want := range map[time.Duration]string{
		30 * 24 * time.Hour: "30d", 36 * time.Hour: "1d12h", 5 * time.Minute: "5m", 2 * time.Hour: "2h", 90 * time.Second: "1m30s",
	} {
		if got := formatDays(d); got != want {
			t.Errorf("formatDays(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestRedaction(t *testing.T) {
	noEnv := func(string) string { return "" }
	for _, c := range []struct{ dsn, shown, secret string }{
		{"postgres://bob:s3cr%40t@db:5432/app?sslmode=disable", "postgres://bob:xxxxx@db:5432/app?sslmode=disable", "s3cr@t"},
		{"postgres://bob@db/app?password=hunter2&sslmode=require", "postgres://bob@db/app?password=xxxxx&sslmode=require", "hunter2"},
		{"host=db user=bob password=hunter2 dbname=app", "host=db user=bob password=xxxxx dbname=app", "hunter2"},
		{"host=db password='two words' dbname=app", "host=db password=xxxxx dbname=app", "two words"},
		{"postgres://bob@db/app", "postgres://bob@db/app", ""},
		{"postgres://bob:p%zz@db/app", "(a connection string that is not a valid URL)", "p%zz"},
		{"postgres://bob@db/app?sslmode=disable&password=hun%zzter", "postgres://bob@db/app?…", "hun%zzter"},
		{"mysql://bob:s3cr%40t@db:3306/shop", "mysql://bob:xxxxx@db:3306/shop", "s3cr@t"},
		{"mysql://bob:two words@db/shop", "(a connection string that is not a valid URL)", "two words"},
		{"bob:s3:cr@t@tcp(db:3306)/shop?parseTime=true", "bob:xxxxx@tcp(db:3306)/shop?parseTime=true", "s3:cr@t"},
		{"root@tcp(127.0.0.1:3306)/test", "root@tcp(127.0.0.1:3306)/test", ""},
		{"sqlite:/var/lib/app/claims.db", "sqlite:/var/lib/app/claims.db", ""},
	} {
		if got := redactDSN(c.dsn); got != c.shown {
			t.Errorf("redactDSN(%q) = %q, want %q", c.dsn, got, c.shown)
		}
		s := secrets(c.dsn, noEnv)
		if c.secret == "" {
			if len(s) != 0 {
				t.Errorf("secrets(%q) = %q, want none", c.dsn, s)
			}
			continue
		}
		msg := scrub("failed for "+c.secret+" at "+c.dsn+" ("+redactDSN(c.dsn)+")", s)
		if strings.Contains(msg, c.secret) || strings.Contains(msg, "s3cr%40t") {
			t.Errorf("scrub left the password of %q in %q", c.dsn, msg)
		}
	}
	if got := scrub("auth failed: pw-from-env", secrets("host=db", func(k string) string {
		if k == "PGPASSWORD" {
			return "pw-from-env"
		}
		return ""
	})); strings.Contains(got, "pw-from-env") {
		t.Errorf("PGPASSWORD leaked: %q", got)
	}
}

// runCLI runs the command line in process, with no DATABASE_URL.
func runCLI(t *testing.T, env map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(context.Background(), args, envFor(env, &out, &errOut))
	return code, out.String(), errOut.String()
}

func envFor(vars map[string]string, out, errOut *bytes.Buffer) env {
	return env{getenv: func(k string) string { return vars[k] }, stdout: out, stderr: errOut}
}

func TestBadCommandLinesExitTwoWithOneLine(t *testing.T) {
	const dsn = "postgres://bob:pw@127.0.0.1:1/x"
	sqliteFile := filepath.Join(t.TempDir(), "x.db")
	if err := os.WriteFile(sqliteFile, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage: idempotent COMMAND"},
		{[]string{"vacuum"}, `idempotent: unknown command "vacuum"`},
		{[]string{"schema", "-kafka-offsets", "kafka_offsets", "-partitioned"}, "-kafka-offsets and -partitioned: the offsets table is not partitioned"},
		{[]string{"schema", "-kafka-offsets", "a;b"}, "kafka offsets table"},
		{[]string{"schema", "-kafka-offsets", "kafka_offsets", "-format", "xml"}, `-format "xml"`},
		{[]string{"migrate", "-kafka-offsets", "a;b", "-dsn", dsn}, "kafka offsets table"},
		{[]string{"cleanup", "-bogus"}, "idempotent cleanup: flag provided but not defined: -bogus"},
		{[]string{"cleanup", "-dsn", dsn}, "-retention is required"},
		{[]string{"cleanup", "-retention", "0d", "-dsn", dsn}, "-retention is 0s, want a positive duration"},
		{[]string{"cleanup", "-retention", "30x", "-dsn", dsn}, `invalid value "30x" for flag -retention`},
		{[]string{"cleanup", "-retention", "30d", "-batch", "0", "-dsn", dsn}, "-batch is 0, want at least 1"},
		{[]string{"cleanup", "-retention", "30d", "-batch", "10", "-min-batch", "20", "-dsn", dsn}, "-min-batch 20 is larger than -batch 10"},
		{[]string{"cleanup", "-retention", "30d", "-statement-timeout", "0s", "-dsn", dsn}, "-statement-timeout is 0s"},
		{[]string{"cleanup", "-retention", "30d"}, "no database: give -dsn or set DATABASE_URL"},
		{[]string{"cleanup", "-retention", "30d", "-table", "a;b", "-dsn", dsn}, `table name "a;b": invalid identifier`},
		{[]string{"cleanup", "-retention", "30d", "-consumer", "-x", "-dsn", dsn}, `consumer name "-x"`},
		{[]string{"partitions", "-dsn", dsn}, "-retention is required"},
		{[]string{"partitions", "-retention", "30d", "-lead-days", "0", "-dsn", dsn}, "-lead-days is 0, want at least 1"},
		{[]string{"migrate", "-partitioned", "-lead-days", "-1", "-dsn", dsn}, "-lead-days is -1, want at least 1"},
		{[]string{"schema", "-format", "xml"}, `-format "xml": want sql, goose`},
		{[]string{"schema", "extra"}, `unexpected argument "extra"`},
		{[]string{"stats", "-dsn", dsn, "now"}, `unexpected argument "now"`},
		{[]string{"schema", "-dialect", "oracle"}, `-dialect "oracle": want postgres, mysql or sqlite`},
		{[]string{"schema", "-dialect", "mysql", "-format", "goose"}, `-format "goose": the mysql schema is printed as plain SQL only`},
		{[]string{"schema", "-dialect", "sqlite", "-kafka-offsets", "kafka_offsets"}, "-kafka-offsets: the kafka consumer's offsets table is Postgres only"},
		{[]string{"schema", "-dialect", "sqlite", "-partitioned"}, "-partitioned: the sqlite dialect does not support partitions"},
		{[]string{"migrate", "-kafka-offsets", "kafka_offsets", "-dsn", "bob:pw@tcp(127.0.0.1:1)/x"}, "-kafka-offsets: the kafka consumer's offsets table is Postgres only"},
		{[]string{"partitions", "-retention", "30d", "-dsn", "sqlite:" + sqliteFile}, "the sqlite dialect does not support partitions"},
		{[]string{"stats", "-dsn", "oracle://bob:pw@db/x"}, `unknown connection string scheme "oracle"`},
		{[]string{"stats", "-dsn", "mysql://bob:pw@db/x/y"}, "path must be one database name"},
		{[]string{"stats", "-dsn", "mysql:///x"}, "names no host"},
		{[]string{"stats", "-dsn", "sqlite::memory:"}, "in-memory database"},
	} {
		code, stdout, stderr := runCLI(t, nil, c.args...)
		if code != 2 || !strings.Contains(stderr, c.want) || stdout != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 and %q", c.args, code, stdout, stderr, c.want)
		}
		if len(c.args) > 0 && strings.Count(strings.TrimSuffix(stderr, "\n"), "\n") != 0 {
			t.Errorf("%q: stderr is not one line: %q", c.args, stderr)
		}
		if strings.Contains(stderr, ":pw@") {
			t.Errorf("%q: password printed: %q", c.args, stderr)
		}
	}
}

func TestHelpExitsZero(t *testing.T) {
	for _, args := range [][]string{{"-h"}, {"cleanup", "-h"}, {"schema", "-help"}} {
		code, stdout, stderr := runCLI(t, nil, args...)
		if code != 0 || !strings.Contains(stdout, "Usage: idempotent") || stderr != "" {
			t.Errorf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
}

func TestUnreachableDatabaseExitsOneWithoutThePassword(t *testing.T) {
	for _, dsn := range []string{
		"postgres://bob:Pa55w0rdX@127.0.0.1:1/x?sslmode=disable",
		"host=127.0.0.1 port=1 user=bob password=Pa55w0rdX dbname=x sslmode=disable",
		"mysql://bob:Pa55w0rdX@127.0.0.1:1/x",
		"bob:Pa55w0rdX@tcp(127.0.0.1:1)/x",
	} {
		for _, args := range [][]string{
			{"stats", "-dsn", dsn},
			{"cleanup", "-retention", "30d", "-dsn", dsn},
			{"migrate", "-dsn", dsn},
			{"partitions", "-retention", "30d", "-dsn", dsn},
		} {
			code, stdout, stderr := runCLI(t, nil, args...)
			if code != 1 || !strings.Contains(stderr, "cannot reach the database at ") || strings.Count(stderr, "\n") != 1 {
				t.Errorf("%q: exit %d, stderr %q; want exit 1 and one line", args, code, stderr)
			}
			if strings.Contains(stdout+stderr, "Pa55w0rdX") {
				t.Errorf("%q: password printed: %q %q", args, stdout, stderr)
			}
		}
		// The same through DATABASE_URL.
		code, _, stderr := runCLI(t, map[string]string{"DATABASE_URL": dsn}, "stats")
		if code != 1 || strings.Contains(stderr, "Pa55w0rdX") || !strings.Contains(stderr, "xxxxx") {
			t.Errorf("DATABASE_URL: exit %d, stderr %q", code, stderr)
		}
	}
}

func TestClassifyConnectionStrings(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct{ in, kind, dsn string }{
		{"postgres://bob:pw@db:5432/app?sslmode=disable", kindPostgres, "postgres://bob:pw@db:5432/app?sslmode=disable"},
		{"postgresql://db/app", kindPostgres, "postgresql://db/app"},
		{"host=db user=bob password=pw dbname=app", kindPostgres, "host=db user=bob password=pw dbname=app"},
		{"mysql://bob:pw@db:3307/shop?parseTime=true", kindMySQL, "bob:pw@tcp(db:3307)/shop?parseTime=true"},
		{"mysql://bob@db/shop", kindMySQL, "bob@tcp(db:3306)/shop"},
		{"mysql://bob:p%40ss%3Aw%2Frd@[::1]/shop", kindMySQL, "bob:p@ss:w/rd@tcp([::1]:3306)/shop"},
		{"bob:pw@tcp(db:3306)/shop", kindMySQL, "bob:pw@tcp(db:3306)/shop"},
		{"tcp(127.0.0.1:3306)/test", kindMySQL, "tcp(127.0.0.1:3306)/test"},
		{"bob@unix(/run/mysqld/mysqld.sock)/shop", kindMySQL, "bob@unix(/run/mysqld/mysqld.sock)/shop"},
		{"bob@/shop", kindMySQL, "bob@/shop"},
		{"sqlite:" + dir + "/claims.db", kindSQLite, ""},
		{"sqlite://" + dir + "/claims", kindSQLite, ""},
		{dir + "/claims.sqlite3", kindSQLite, ""},
		{"claims.db", kindSQLite, ""},
	} {
		got, err := classify(c.in)
		if err != nil || got.kind != c.kind || (c.dsn != "" && got.dsn != c.dsn) {
			t.Errorf("classify(%q) = %s %q, %v; want %s %q", c.in, got.kind, got.dsn, err, c.kind, c.dsn)
		}
		if got.dialect == nil || got.dialect.Name() != c.kind {
			t.Errorf("classify(%q): dialect %v, want %s", c.in, got.dialect, c.kind)
		}
		if c.kind == kindSQLite && (!strings.HasPrefix(got.dsn, "file:") || got.driver != "sqlite" || !strings.HasSuffix(got.path, strings.TrimPrefix(strings.TrimPrefix(c.in, "sqlite:"), "//"))) {
			t.Errorf("classify(%q) = driver %q, dsn %q, path %q", c.in, got.driver, got.dsn, got.path)
		}
	}
	for _, in := range []string{"oracle://bob:Pa55w0rdX@db/x", "mysql://bob:Pa55w0rdX@/x", "mysql://bob:Pa55 w0rdX@db/x", "sqlite:", "sqlite::memory:"} {
		if got, err := classify(in); err == nil || strings.Contains(err.Error(), "Pa55") {
			t.Errorf("classify(%q) = %+v, %v; want an error without the password", in, got, err)
		}
	}
}

func TestUnparsableAndMissingDatabases(t *testing.T) {
	// A connection string that does not parse: exit 2, and no password.
	for _, dsn := range []string{"mysql://bob:Pa55 w0rdX@127.0.0.1:1/x", "postgres://bob:Pa55w0rdX%zz@127.0.0.1:1/x"} {
		code, stdout, stderr := runCLI(t, map[string]string{"DATABASE_URL": dsn}, "stats")
		if code == 0 || strings.Contains(stdout+stderr, "Pa55") {
			t.Errorf("%q: exit %d, %q %q; want a failure without the password", dsn, code, stdout, stderr)
		}
	}
	// A missing SQLite file is not created by a command that only reads.
	missing := filepath.Join(t.TempDir(), "missing.db")
	code, _, stderr := runCLI(t, nil, "stats", "-dsn", "sqlite:"+missing)
	if code != 1 || !strings.Contains(stderr, "no SQLite database at "+missing) {
		t.Errorf("stats of a missing SQLite file: exit %d, %q", code, stderr)
	}
	if _, err := os.Stat(missing); !os.IsNotExist(err) {
		t.Errorf("stats created %s: %v", missing, err)
	}
}

func TestSchemaForMySQLAndSQLite(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"schema", "-dialect", "mysql", "-table", "shop.claims"}, []string{"CREATE TABLE IF NOT EXISTS `shop`.`claims` (", "ENGINE=InnoDB ROW_FORMAT=DYNAMIC;\n", "CREATE TABLE IF NOT EXISTS `shop`.`claims_horizon` ("}},
		{[]string{"schema", "-dialect", "mysql", "-partitioned"}, []string{"PARTITION BY LIST COLUMNS (event_day)", "CREATE TABLE IF NOT EXISTS `processed_messages_horizon` ("}},
		{[]string{"schema", "-dialect", "sqlite"}, []string{`CREATE TABLE IF NOT EXISTS "processed_messages" (`, `CREATE INDEX IF NOT EXISTS "processed_messages_processed_at"`, `CREATE TABLE IF NOT EXISTS "processed_messages_horizon" (`}},
	} {
		code, stdout, stderr := runCLI(t, nil, c.args...)
		if code != 0 || stderr != "" {
			t.Errorf("%q: exit %d, %q", c.args, code, stderr)
		}
		for _, w := range c.want {
			if !strings.Contains(stdout, w) {
				t.Errorf("%q printed\n%s\nwant it to contain %q", c.args, stdout, w)
			}
		}
	}
}
