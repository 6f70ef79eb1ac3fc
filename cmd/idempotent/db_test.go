package main

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/idemhttp"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/sqlite"
)

// cliOK runs the command line in process and fails t unless it exits 0
// with nothing on standard error.
func cliOK(t *testing.T, args ...string) string {
	t.Helper()
	code, stdout, stderr := runCLI(t, nil, args...)
	if code != 0 || stderr != "" {
		t.Fatalf("idempotent %q: exit %d\nstdout: %s\nstderr: %s", args, code, stdout, stderr)
	}
	return stdout
}

// seedOld inserts n claims of consumer processed at at; ts formats at as
// the table stores it.
func seedOld(t *testing.T, db *sql.DB, table, consumer string, n int, at string) {
	t.Helper()
	for i := 1; i <= n; i++ {
		if _, err := db.Exec(fmt.Sprintf("INSERT INTO %s (consumer, message_key, processed_at) VALUES ('%s', 'old-%d', '%s')", table, consumer, i, at)); err != nil {
			t.Fatal(err)
		}
	}
}

func countRows(t *testing.T, db *sql.DB, q string) int {
	t.Helper()
	var n int
	if err := db.QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkStatsAndCleanup runs migrate, stats and cleanup on a database with
// 250 old claims of loyalty, 50 of analytics and one fresh claim (which
// the caller inserts with insertFresh after migrate).
func checkStatsAndCleanup(t *testing.T, dsn, table string, db func() *sql.DB, old string) {
	t.Helper()
	out := cliOK(t, "migrate", "-dsn", dsn, "-table", table)
	if out != "claim table "+table+" is ready (plain, with its processed_at index)\n" {
		t.Fatalf("migrate printed %q", out)
	}
	d := db()
	seedOld(t, d, table, "loyalty", 250, old)
	seedOld(t, d, table, "analytics", 50, old)
	if _, err := d.Exec("INSERT INTO " + table + " (consumer, message_key) VALUES ('loyalty', 'fresh')"); err != nil {
		t.Fatal(err)
	}
	out = cliOK(t, "stats", "-dsn", dsn, "-table", table)
	for _, re := range []string{
		`(?m)^table\s+` + regexp.QuoteMeta(table) + ` \(plain\)$`,
		`(?m)^claims\s+301$`,
		`(?m)^analytics\s+50\s+2020-01-01T00:00:00Z\s+2020-01-01T00:00:00Z$`,
		`(?m)^loyalty\s+251\s+2020-01-01T00:00:00Z\s+\S+Z$`,
	} {
		if !regexp.MustCompile(re).MatchString(out) {
			t.Errorf("stats output does not match %s:\n%s", re, out)
		}
	}
	out = cliOK(t, "cleanup", "-dsn", dsn, "-table", table, "-retention", "30d", "-dry-run")
	if !strings.HasSuffix(out, "dry run: 300 claims would be deleted\n") {
		t.Fatalf("dry run printed %q", out)
	}
	out = cliOK(t, "cleanup", "-dsn", dsn, "-table", table, "-retention", "30d", "-consumer", "loyalty", "-batch", "100")
	if !regexp.MustCompile(`(?m)^deleted 250 claims in 4 batches, `).MatchString(out) {
		t.Fatalf("cleanup -consumer loyalty printed %q", out)
	}
	if n := countRows(t, d, "SELECT count(*) FROM "+table+" WHERE consumer = 'analytics'"); n != 50 {
		t.Fatalf("-consumer loyalty deleted analytics claims: %d left", n)
	}
	out = cliOK(t, "cleanup", "-dsn", dsn, "-table", table, "-retention", "30d")
	if !strings.Contains(out, "deleted 50 claims in 2 batches") {
		t.Fatalf("cleanup printed %q", out)
	}
	if n := countRows(t, d, "SELECT count(*) FROM "+table); n != 1 {
		t.Fatalf("%d claims left, want the fresh one", n)
	}
}

func TestCLIOnSQLite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "claims.db")
	var db *sql.DB
	open := func() *sql.DB {
		if db == nil {
			var err error
			if db, err = sqlite.Open(path); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = db.Close() })
		}
		return db
	}
	checkStatsAndCleanup(t, "sqlite:"+path, "processed_messages", open, "2020-01-01 00:00:00.000")
	// A bare path names the same file.
	if out := cliOK(t, "stats", "-dsn", path); !strings.Contains(out, "database  sqlite\n") || !strings.Contains(out, "claims    1\n") {
		t.Fatalf("stats with a bare path:\n%s", out)
	}
	checkHTTPResponses(t, "sqlite:"+path, "processed_messages", sqlite.New(), open())
}

func TestCLIOnMariaDB(t *testing.T) {
	dsn := testenv.Getenv("IDEMPOTENT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, "no MySQL/MariaDB at IDEMPOTENT_MYSQL_DSN (%s): %v", dsn, err)
	}
	table := testenv.UniqueName("cli")
	t.Cleanup(func() {
		for _, s := range []string{table, table + "_horizon", table + "_parted", table + "_parted_horizon"} {
			_, _ = db.Exec("DROP TABLE IF EXISTS " + s)
		}
	})
	checkStatsAndCleanup(t, dsn, table, func() *sql.DB { return db }, "2020-01-01 00:00:00.000000")
	checkHTTPResponses(t, dsn, table, mysql.New(), db)

	// Partitions: created, listed, dropped, reported per day.
	parted := table + "_parted"
	out := cliOK(t, "migrate", "-dsn", dsn, "-table", parted, "-partitioned", "-retention", "3d", "-lead-days", "2")
	if !regexp.MustCompile(`^claim table \S+ is ready \(partitioned by event day\), 6 day partitions from \d{4}-\d\d-\d\d to \d{4}-\d\d-\d\d\n$`).MatchString(out) {
		t.Fatalf("migrate -partitioned printed %q", out)
	}
	today := time.Now().UTC().Format(time.DateOnly)
	if _, err := db.Exec("INSERT INTO "+parted+" (consumer, message_key, event_day) VALUES ('loyalty', 'k1', ?), ('loyalty', 'k2', ?)", today, today); err != nil {
		t.Fatal(err)
	}
	out = cliOK(t, "stats", "-dsn", dsn, "-table", parted)
	if !strings.Contains(out, "(partitioned by event day)") || !regexp.MustCompile(`(?m)^p`+strings.ReplaceAll(today, "-", "")+`\s+`+today+`\s+2\s+\S+ kB$`).MatchString(out) ||
		!strings.HasSuffix(out, "\n6 partitions\n") {
		t.Fatalf("stats of the partitioned table:\n%s", out)
	}
	out = cliOK(t, "partitions", "-dsn", dsn, "-table", parted, "-retention", "1d", "-lead-days", "2")
	if !strings.HasSuffix(out, ": 0 created, 2 dropped\n") {
		t.Fatalf("partitions printed %q", out)
	}
	if out := cliOK(t, "partitions", "-dsn", "mysql://"+strings.Replace(strings.Replace(dsn, "@tcp(", "@", 1), ")/", "/", 1), "-table", parted, "-list"); !strings.HasSuffix(out, "\n4 partitions\n") {
		t.Fatalf("partitions -list through a mysql:// URL printed %q", out)
	}
}

// checkHTTPResponses runs stats and cleanup -http-responses on an idemhttp
// response table beside the claim table table (which migrate made): of
// three responses, only the one stored before the window whose claim is
// gone is deleted; one whose claim is there, and a fresh one, stay.
func checkHTTPResponses(t *testing.T, dsn, table string, d dialect.Dialect, db *sql.DB) {
	t.Helper()
	resp := table + "_http"
	up, _, err := idemhttp.SchemaSQL(d, resp)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = db.Exec("DROP TABLE IF EXISTS " + resp) })
	for _, s := range strings.Split(up, ";") {
		if strings.TrimSpace(strings.TrimLeft(s, "- \n")) == "" || !strings.Contains(s, "CREATE") {
			continue
		}
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("%s: %v", s, err)
		}
	}
	blob := "X'00'"
	if d.Name() == "postgres" {
		blob = `'\x00'::bytea`
	}
	old, fresh := time.Now().Add(-40*24*time.Hour).UnixMicro(), time.Now().UnixMicro()
	for _, r := range []struct {
		key string
		at  int64
	}{{"gone-old", old}, {"kept-claimed", old}, {"gone-fresh", fresh}} {
		if _, err := db.Exec(fmt.Sprintf("INSERT INTO %s (consumer, message_key, fingerprint, status, header, body, created_at) VALUES ('api', '%s', %s, 200, %s, %s, %d)",
			resp, r.key, blob, blob, blob, r.at)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := db.Exec("INSERT INTO " + table + " (consumer, message_key) VALUES ('api', 'kept-claimed')"); err != nil {
		t.Fatal(err)
	}
	out := cliOK(t, "stats", "-dsn", dsn, "-table", table)
	if !regexp.MustCompile(`(?m)^http responses\s+` + regexp.QuoteMeta(resp) + `: 3 stored, oldest \S+Z`).MatchString(out) {
		t.Errorf("stats does not show the response table:\n%s", out)
	}
	out = cliOK(t, "cleanup", "-dsn", dsn, "-table", table, "-retention", "30d", "-http-responses")
	if !strings.HasSuffix(out, "deleted 1 stored HTTP responses whose claims are gone\n") {
		t.Errorf("cleanup -http-responses printed %q", out)
	}
	if n := countRows(t, db, "SELECT count(*) FROM "+resp+" WHERE message_key IN ('kept-claimed', 'gone-fresh')"); n != 2 || countRows(t, db, "SELECT count(*) FROM "+resp) != 2 {
		t.Errorf("after cleanup -http-responses: %d of the two kept responses left, want 2 and nothing else", n)
	}
}
