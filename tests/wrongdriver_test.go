package tests

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/txclaim/idempotent"
	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/mysql"
	"github.com/txclaim/idempotent/postgres"
	"github.com/txclaim/idempotent/sqlite"
)

// TestWrongDriver gives each dialect a *sql.DB of each other kind:
// EnsureSchema must fail with dialect.ErrWrongDatabase, naming the dialect
// and what it found, and create nothing.
func TestWrongDriver(t *testing.T) {
	if pgDSN == "" {
		t.Skip(skipReason)
	}
	myDSN := mysqlDSN(t)
	path := filepath.Join(t.TempDir(), "wrong.db")
	open := map[string]func() (*sql.DB, error){
		"postgres": func() (*sql.DB, error) { return sql.Open("postgres", pgDSN) },
		"mysql":    func() (*sql.DB, error) { return sql.Open("mysql", myDSN) },
		"sqlite":   func() (*sql.DB, error) { return sqlite.Open(path) },
		// A guarded database still reports its real driver's server.
		"sqlite-guarded": func() (*sql.DB, error) {
			dsn, err := sqlite.DSN(path)
			if err != nil {
				return nil, err
			}
			return idempotent.OpenGuarded(sqlite.DriverName, dsn)
		},
	}
	dialects := map[string]dialect.Dialect{"postgres": postgres.New(), "mysql": mysql.New(), "sqlite": sqlite.New()}
	for dbKind, openDB := range open {
		for dName, d := range dialects {
			if strings.HasPrefix(dbKind, dName) {
				continue
			}
			t.Run(dName+"_on_"+dbKind, func(t *testing.T) {
				db, err := openDB()
				if err != nil {
					t.Fatal(err)
				}
				db.SetMaxOpenConns(2)
				t.Cleanup(func() { closeChecked(t, db) })
				table := uniqueName("wrong")
				mw, err := idempotent.New(db, d, "c", idempotent.WithTable(table))
				if err != nil {
					t.Fatal(err)
				}
				err = mw.EnsureSchema(context.Background())
				if !errors.Is(err, dialect.ErrWrongDatabase) {
					t.Fatalf("EnsureSchema = %v, want dialect.ErrWrongDatabase", err)
				}
				if !strings.Contains(err.Error(), dName+" dialect") {
					t.Errorf("error %q does not name the %s dialect", err, dName)
				}
				t.Logf("%v", err)
				if _, err := db.Exec("SELECT 1 FROM " + table); err == nil {
					t.Errorf("table %s exists after the refused EnsureSchema", table)
				}
			})
		}
	}
}
