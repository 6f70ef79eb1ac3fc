package sqlite

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txclaim/idempotent/dialect"
)

// openTemp opens a fresh database file with Open, closed in Cleanup after
// checking that no connection leaked.
func openTemp(t *testing.T) (*sql.DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "test.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if n := db.Stats().InUse; n != 0 {
			t.Errorf("connection leak: %d connections in use", n)
		}
		_ = db.Close()
	})
	return db, path
}

func TestDSNRejectsBadPaths(t *testing.T) {
	for _, p := range []string{"", ":memory:", "file::memory:?cache=shared", "file:x.db", "a\x00b"} {
		if dsn, err := DSN(p); err == nil {
			t.Errorf("DSN(%q) = %q, want an error", p, dsn)
		}
		if db, err := Open(p); err == nil {
			_ = db.Close()
			t.Errorf("Open(%q) succeeded, want an error", p)
		}
	}
}

// TestOpenOddPath checks that a path with URI metacharacters opens the file
// of exactly that name.
func TestOpenOddPath(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "we?ird#name%41 x.db")
	db, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	_ = db.Close()
	if _, err := os.Stat(path); err != nil {
		entries, _ := os.ReadDir(dir)
		t.Fatalf("database file not at %q (%v); directory has %v", path, err, entries)
	}
}

// TestOpenSettings checks the settings on several distinct connections.
func TestOpenSettings(t *testing.T) {
	db, _ := openTemp(t)
	ctx := context.Background()
	var conns []*sql.Conn
	for i := 0; i < 3; i++ {
		c, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for i, c := range conns {
		for pragma, want := range map[string]string{
			"journal_mode": "wal",
			"busy_timeout": fmt.Sprint(BusyTimeout.Milliseconds()),
			"synchronous":  "2",
		} {
			var got string
			if err := c.QueryRowContext(ctx, "PRAGMA "+pragma).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got != want {
				t.Errorf("connection %d: PRAGMA %s = %q, want %q", i, pragma, got, want)
			}
		}
		_ = c.Close()
	}
}

// TestImmediateTransactions checks that BeginTx takes the write lock at once:
// a second writer that will not wait fails with a real SQLITE_BUSY, which
// Classify calls retryable.
func TestImmediateTransactions(t *testing.T) {
	db, _ := openTemp(t)
	ctx := context.Background()
	if _, err := db.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
		t.Fatal(err)
	}
	holder, err := db.BeginTx(ctx, nil) // runs no statement: the lock comes from BEGIN IMMEDIATE
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback()

	other, err := db.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	if _, err := other.ExecContext(ctx, "PRAGMA busy_timeout = 0"); err != nil {
		t.Fatal(err)
	}
	_, err = other.ExecContext(ctx, "INSERT INTO t VALUES (1)")
	if err == nil {
		t.Fatal("a second writer inserted while a transaction was open: transactions are not IMMEDIATE")
	}
	c := New().Classify(fmt.Errorf("wrapped: %w", err))
	if c.Kind != dialect.KindSerialization || c.Code != "5" || !c.Retryable() {
		t.Errorf("Classify(%v) = %+v, want retryable serialization with code 5 (SQLITE_BUSY)", err, c)
	}
}

// TestClassifyRealErrors feeds Classify errors produced by SQLite itself.
func TestClassifyRealErrors(t *testing.T) {
	d := New()
	ctx := context.Background()

	t.Run("busy snapshot", func(t *testing.T) {
		// A deferred transaction that read an old snapshot cannot write
		// after another connection committed: SQLITE_BUSY_SNAPSHOT (517),
		// returned at once whatever busy_timeout says.
		path := filepath.Join(t.TempDir(), "deferred.db")
		db, err := sql.Open(DriverName, "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = db.Close() })
		if _, err := db.Exec("CREATE TABLE t (x INTEGER)"); err != nil {
			t.Fatal(err)
		}
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		var n int
		if err := tx.QueryRowContext(ctx, "SELECT count(*) FROM t").Scan(&n); err != nil {
			t.Fatal(err)
		}
		if _, err := db.ExecContext(ctx, "INSERT INTO t VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		_, err = tx.ExecContext(ctx, "INSERT INTO t VALUES (2)")
		if err == nil {
			t.Fatal("stale deferred transaction wrote: want SQLITE_BUSY_SNAPSHOT")
		}
		if c := d.Classify(err); c.Kind != dialect.KindSerialization || c.Code != "517" {
			t.Errorf("Classify(%v) = %+v, want serialization 517", err, c)
		}
	})

	t.Run("locked", func(t *testing.T) {
		// Dropping a table that a statement on the same connection is still
		// reading: SQLITE_LOCKED (6).
		db, _ := openTemp(t)
		if _, err := db.Exec("CREATE TABLE t (x INTEGER); INSERT INTO t VALUES (1), (2)"); err != nil {
			t.Fatal(err)
		}
		conn, err := db.Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		rows, err := conn.QueryContext(ctx, "SELECT x FROM t")
		if err != nil {
			t.Fatal(err)
		}
		if !rows.Next() {
			t.Fatal("no row")
		}
		_, err = conn.ExecContext(ctx, "DROP TABLE t")
		_ = rows.Close()
		if err == nil {
			t.Fatal("DROP TABLE under an open cursor succeeded: want SQLITE_LOCKED")
		}
		if c := d.Classify(err); c.Kind != dialect.KindSerialization || c.Code != "6" {
			t.Errorf("Classify(%v) = %+v, want serialization 6", err, c)
		}
	})

	t.Run("not retryable", func(t *testing.T) {
		db, _ := openTemp(t)
		if _, err := db.Exec("CREATE TABLE t (x INTEGER PRIMARY KEY)"); err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec("INSERT INTO t VALUES (1)"); err != nil {
			t.Fatal(err)
		}
		for name, query := range map[string]string{
			"unique violation": "INSERT INTO t VALUES (1)",
			"no such table":    "INSERT INTO nope VALUES (1)",
			"syntax":           "INSERT INTO",
		} {
			_, err := db.Exec(query)
			if err == nil {
				t.Fatalf("%s: no error", name)
			}
			if c := d.Classify(err); c.Retryable() || c.Code == "" {
				t.Errorf("%s: Classify(%v) = %+v, want not retryable with the result code", name, err, c)
			}
		}
	})

	t.Run("bad connection", func(t *testing.T) {
		if c := d.Classify(fmt.Errorf("x: %w", driver.ErrBadConn)); c.Kind != dialect.KindConnection {
			t.Errorf("ErrBadConn: %+v, want connection", c)
		}
		if c := d.Classify(nil); c != (dialect.Class{}) {
			t.Errorf("nil: %+v", c)
		}
	})
}

func TestCheckServer(t *testing.T) {
	d := New()
	ctx := context.Background()
	answer := func(s string, err error) dialect.QueryFunc {
		return func(context.Context, string, ...any) (string, error) { return s, err }
	}
	if err := d.CheckServer(ctx, dialect.Table{Name: "t"}, answer("3.45.1", nil)); err != nil {
		t.Errorf("3.45.1: %v", err)
	}
	err := d.CheckServer(ctx, dialect.Table{Name: "t"}, answer("3.23.9", nil))
	if err == nil || !strings.Contains(err.Error(), "too old") {
		t.Errorf("3.23.9: %v, want too old", err)
	}
	parseErr := errors.New(`pq: function sqlite_version() does not exist`)
	err = d.CheckServer(ctx, dialect.Table{Name: "t"}, answer("", parseErr))
	if !errors.Is(err, dialect.ErrWrongDatabase) || !errors.Is(err, parseErr) {
		t.Errorf("failed query: %v, want ErrWrongDatabase wrapping the cause", err)
	}
	err = d.CheckServer(ctx, dialect.Table{Name: "t"}, answer("", driver.ErrBadConn))
	if errors.Is(err, dialect.ErrWrongDatabase) || !errors.Is(err, driver.ErrBadConn) {
		t.Errorf("lost connection: %v, want the retryable error itself", err)
	}
	// The real query on a real SQLite.
	db, _ := openTemp(t)
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	q := func(ctx context.Context, query string, args ...any) (string, error) {
		var s string
		err := tx.QueryRowContext(ctx, query, args...).Scan(&s)
		return s, err
	}
	if err := d.CheckServer(ctx, dialect.Table{Name: "t"}, q); err != nil {
		t.Errorf("real SQLite: %v", err)
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"3.24.0", true}, {"3.24", false}, {"3.45.1", true}, {"3.23.1", false},
		{"4.0.0", true}, {"2.99.99", false}, {"x.y", false}, {"", false},
	} {
		if got := versionAtLeast(tc.v, MinVersion); got != tc.want {
			t.Errorf("versionAtLeast(%q) = %v, want %v", tc.v, got, tc.want)
		}
	}
}
