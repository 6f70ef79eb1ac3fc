package sqlite_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"testing"
	"time"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/dialect/dialecttest"
	"github.com/txclaim/idempotent/sqlite"
)

// TestSQLiteConforms runs the suite for the SQLite dialect on a file of the
// test's own: the shape of every dialect's conformance test.
func TestSQLiteConforms(t *testing.T) {
	if testing.Short() {
		t.Skip("the conformance suite takes a few seconds")
	}
	path := filepath.Join(t.TempDir(), "suite.db")
	dialecttest.Run(t, dialecttest.Harness{
		Dialect: sqlite.New(),
		Open:    func(testing.TB) (*sql.DB, error) { return sqlite.Open(path) },
		Table: func(testing.TB, *sql.DB) string {
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			return "claims_" + hex.EncodeToString(b)
		},
		SerialWriters: true,
		OpenGuarded: func(testing.TB) (*sql.DB, error) {
			dsn, err := sqlite.DSN(path)
			if err != nil {
				return nil, err
			}
			return idempotent.OpenGuarded(sqlite.DriverName, dsn)
		},
		ProcessedAt: func(t time.Time) string {
			return "'" + t.UTC().Format("2006-01-02 15:04:05.000") + "'"
		},
		Provokers: []dialecttest.Provoker{{
			Name: "busy",
			Want: dialect.KindSerialization,
			Provoke: func(t testing.TB, db *sql.DB, table string) error {
				// Another connection writes, without waiting, while a
				// transaction holds the write lock: SQLITE_BUSY.
				holder, err := db.Begin()
				if err != nil {
					t.Fatal(err)
				}
				defer holder.Rollback()
				other, err := sql.Open(sqlite.DriverName, "file:"+path+"?_pragma=busy_timeout(0)")
				if err != nil {
					t.Fatal(err)
				}
				defer other.Close()
				_, err = other.Exec("CREATE TABLE " + table + " (id INTEGER)")
				return err
			},
		}},
		Skip: map[string]string{"MissingTable": "SQLite reports a missing table only as a generic SQLITE_ERROR"},
	})
}

// ExampleRun shows a dialect's conformance test. A harness names the
// dialect, opens its database, and hands out fresh table names; the
// suite does the rest. See TestSQLiteConforms in this package for one that
// runs.
func ExampleRun() {
	_ = func(t *testing.T, db func(testing.TB) (*sql.DB, error), d dialect.Dialect) {
		dialecttest.Run(t, dialecttest.Harness{
			Dialect: d,
			Open:    db,
			Table:   func(testing.TB, *sql.DB) string { return "claims_for_this_test" },
		})
	}
}
