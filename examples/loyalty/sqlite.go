package main

import (
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/txclaim/idempotent/dialect"
	"github.com/txclaim/idempotent/sqlite"
)

// sqliteDatabase is -db sqlite:PATH, and the embedded database of a run
// without -db: a file in a temporary directory.
var sqliteDatabase = database{
	parse: func(dsn string) (target, error) {
		if dsn == "" {
			return target{kind: "sqlite"}, nil
		}
		path := strings.TrimPrefix(dsn, "sqlite:")
		if _, err := sqlite.DSN(path); err != nil {
			return target{}, fmt.Errorf("-db %s: %w", shownDSN(dsn), err)
		}
		// SQLite itself says only "unable to open database file".
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			return target{}, fmt.Errorf("-db %s: a directory, want a database file (it is created if missing)", shownDSN(dsn))
		}
		if st, err := os.Stat(filepath.Dir(path)); err != nil || !st.IsDir() {
			return target{}, fmt.Errorf("-db %s: no directory to create the database file in", shownDSN(dsn))
		}
		return target{kind: "sqlite", path: path, desc: "SQLite (" + path + ")"}, nil
	},
	open: func(t target) (*sql.DB, dialect.Dialect, error) {
		db, err := sqlite.Open(t.path)
		return db, sqlite.New(), err
	},
	pingError: func(desc string, err error) error {
		return fmt.Errorf("database %s cannot be opened: %w", desc, err)
	},
	horizon: func(claims string) string { return claims + "_horizon" },
}
