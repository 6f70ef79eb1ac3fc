package mysql_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/internal/golden"
	"github.com/txclaim/idempotent/internal/testenv"
	"github.com/txclaim/idempotent/mysql"
)

// TestIdentitySQLGolden: the queries Identity sends, with their arguments,
// on MySQL and on MariaDB, for an unqualified and a qualified table.
func TestIdentitySQLGolden(t *testing.T) {
	d := mysql.New()
	var b strings.Builder
	for _, version := range []string{"8.0.36", "10.11.6-MariaDB-0+deb12u1"} {
		for _, tb := range []dialect.Table{{Name: "processed_messages"}, {Schema: "shop", Name: "claims"}} {
			fmt.Fprintf(&b, "-- server %s, table %q.%q\n", version, tb.Schema, tb.Name)
			id, err := d.Identity(context.Background(), tb, func(_ context.Context, q string, args ...any) (string, error) {
				fmt.Fprintf(&b, "%s;\n-- args %q\n", q, args)
				if len(args) == 0 {
					return version, nil
				}
				return "name", nil
			})
			if err != nil || id != "name" {
				t.Fatalf("Identity = %q, %v", id, err)
			}
			b.WriteString("\n")
		}
	}
	golden.Compare(t, filepath.Join("testdata", "identity_sql.golden"), b.String())

	boom := errors.New("boom")
	for name, q := range map[string]dialect.QueryFunc{
		"VERSION() fails": func(context.Context, string, ...any) (string, error) { return "", boom },
		"the name fails": func(_ context.Context, _ string, args ...any) (string, error) {
			if len(args) == 0 {
				return "10.11.6-MariaDB", nil
			}
			return "", boom
		},
	} {
		if _, err := d.Identity(context.Background(), dialect.Table{Name: "t"}, q); !errors.Is(err, boom) {
			t.Errorf("%s: %v, want it wrapped", name, err)
		}
	}
	noRow := func(_ context.Context, _ string, args ...any) (string, error) {
		if len(args) == 0 {
			return "8.0.36", nil
		}
		return "", sql.ErrNoRows
	}
	if _, err := d.Identity(context.Background(), dialect.Table{Name: "t"}, noRow); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Errorf("no row (no table): %v, want an error saying the table does not exist", err)
	}
	null := func(_ context.Context, _ string, args ...any) (string, error) {
		if len(args) == 0 {
			return "8.0.36", nil
		}
		return "", nil
	}
	if _, err := d.Identity(context.Background(), dialect.Table{Name: "t"}, null); err == nil || !strings.Contains(err.Error(), "does not show its start") {
		t.Errorf("NULL (no Uptime): %v, want an error saying the server does not show its start", err)
	}
}

// TestIdentityOnTheServer reads the name on the real server
// (IDEMPOTENT_MYSQL_DSN, or MariaDB at 127.0.0.1:3306): the same from two
// pools and on every read, with the second the server started; different
// for another table, an error for a missing table. (A table re-created has
// another CREATE_TIME only from the next second on, which the test does
// not wait for.)
func TestIdentityOnTheServer(t *testing.T) {
	dsn := testenv.Getenv("IDEMPOTENT_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/test")
	open := func() *sql.DB {
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		db.SetMaxOpenConns(2)
		t.Cleanup(func() { _ = db.Close() })
		return db
	}
	db := open()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := db.PingContext(ctx); err != nil {
		testenv.Unavailable(t, "no MySQL/MariaDB at %s: %v", dsn, err)
	}
	exec := func(q string) {
		t.Helper()
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	table, other := testenv.UniqueName("identity"), testenv.UniqueName("identity")
	exec("CREATE TABLE " + table + " (k INT)")
	exec("CREATE TABLE " + other + " (k INT)")
	t.Cleanup(func() { exec("DROP TABLE IF EXISTS " + table + ", " + other) })
	read := func(db *sql.DB, name string) (string, error) {
		return mysql.New().Identity(context.Background(), dialect.Table{Name: name}, func(ctx context.Context, q string, args ...any) (string, error) {
			var s sql.NullString
			err := db.QueryRowContext(ctx, q, args...).Scan(&s)
			return s.String, err
		})
	}
	name, err := read(db, table)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("identity: %s", name)
	if !strings.HasPrefix(name, "mysql server ") && !strings.HasPrefix(name, "mariadb server ") || strings.Contains(name, "server  ") {
		t.Fatalf("identity %q: want the server's identifier", name)
	}
	if again, err := read(open(), table); err != nil || again != name {
		t.Fatalf("another pool: %q, %v; want %q", again, err, name)
	}

	// The start is the second the server started, the same on every read:
	// read it until the server's clock has passed two second boundaries.
	var first, now int64
	if err := db.QueryRow("SELECT UNIX_TIMESTAMP()").Scan(&first); err != nil {
		t.Fatal(err)
	}
	reads := 0
	for ; now < first+2; reads++ {
		again, err := read(db, table)
		if err != nil || again != name {
			t.Fatalf("read %d: %q, %v; want %q on every read", reads, again, err, name)
		}
		if err := db.QueryRow("SELECT UNIX_TIMESTAMP()").Scan(&now); err != nil {
			t.Fatal(err)
		}
	}
	var uptime int64
	if err := db.QueryRow("SELECT UNIX_TIMESTAMP(), CAST(VARIABLE_VALUE AS SIGNED) FROM "+statusTable(t, db)+" WHERE VARIABLE_NAME = 'Uptime'").Scan(&now, &uptime); err != nil {
		t.Fatal(err)
	}
	start := now - uptime
	if !strings.Contains(name, fmt.Sprintf(" start %d table ", start)) {
		t.Fatalf("identity %q: want the server's start %d", name, start)
	}
	t.Logf("the same name on %d reads over two second boundaries", reads)
	if o, err := read(db, other); err != nil || o == name {
		t.Fatalf("another table: %q, %v; want a name other than %q", o, err, name)
	}
	exec("DROP TABLE " + table)
	if _, err := read(db, table); err == nil || !strings.Contains(err.Error(), "does not exist") {
		t.Fatalf("a missing table: %v, want an error saying it does not exist", err)
	}
}

// statusTable returns the table that shows the server's status variables:
// information_schema.GLOBAL_STATUS on MariaDB, performance_schema's on
// MySQL 8.
func statusTable(t *testing.T, db *sql.DB) string {
	t.Helper()
	var v string
	if err := db.QueryRow("SELECT VERSION()").Scan(&v); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(v, "MariaDB") {
		return "information_schema.GLOBAL_STATUS"
	}
	return "performance_schema.global_status"
}
